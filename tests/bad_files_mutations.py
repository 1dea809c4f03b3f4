#!/usr/bin/env python3
"""Does tests/bad_files_table.py catch what it claims? The checks of files read from folders
(src/util/file_checks.cpp and its callers), each disabled in turn: tests/bad_input_mutations.py's
runner applies each group of FILE_MUTATIONS in a separate worktree, rebuilds gpt_train and
fsdprun there, runs this table against that build, checks that every case a mutation targets
turns red, then restores the files with git checkout.

    .venv/bin/python tests/bad_files_mutations.py WORKTREE

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed.
The mutations of one group touch different checks, and each names only cases that no other check
of the group covers."""
import sys
from pathlib import Path

# (id, file, exact original text, mutated text, [cases that must turn red])
FILE_MUTATIONS = [
    [
        ("fifo-open-blocks", "src/util/file_checks.cpp",
         "::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)",
         "::open(path.c_str(), O_RDONLY | O_CLOEXEC)",
         ["`latest` a FIFO", "metadata.json a FIFO", "a shard file a FIFO",
          "HF config.json a FIFO", "HF index names a shard that is a FIFO"]),
        ("metadata-names-unchecked", "src/io/checkpoint_load.cpp",
         "    for (const auto& file : meta.files) check_name_inside(folder, file.name, metadata);\n",
         "", ["metadata.json names ../../../outside/SHARD"]),
        ("latest-link-followed", "src/io/checkpoint_dir.cpp",
         "TORCH_CHECK(!fs::is_symlink(status), path,", "TORCH_CHECK(true, path,",
         ["`latest` a symlink"]),
        ("step-digits-unbounded", "src/io/checkpoint_dir.cpp",
         "if (digits == 0 || digits > kMaxStepDigits ||", "if (digits == 0 ||",
         ["`latest` with 23 digits"]),
        ("links-out-followed", "src/util/file_checks.cpp",
         "TORCH_CHECK(is_inside(resolved, base), source,", "TORCH_CHECK(true, source,",
         ["step folder a link out of the dir"]),
        ("size-unbounded", "src/util/file_checks.cpp",
         "TORCH_CHECK(size <= max_bytes, path,", "TORCH_CHECK(true, path,",
         ["300 MiB metadata.json"]),
        ("hf-index-names-unchecked", "examples/gpt/hf_folder.cpp",
         "    fsdp::check_relative_name(name, index.string());\n", "",
         ["HF index names ../x.safetensors (it exists)"]),
    ],
    [
        ("fifo-accepted", "src/util/file_checks.cpp",
         "TORCH_CHECK(S_ISREG(info.st_mode), path,", "TORCH_CHECK(true, path,",
         ["`latest` a FIFO", "metadata.json a FIFO", "a shard file a FIFO",
          "HF config.json a FIFO", "HF index names a shard that is a FIFO"]),
        ("latest-ignored-when-malformed", "src/io/checkpoint_dir.cpp",
         "  TORCH_CHECK(step_of(name) >= 0, path,",
         "  if (step_of(name) < 0) return \"\";\n  TORCH_CHECK(true, path,",
         ["`latest` names ../../outside", "`latest` with a trailing space",
          "`latest` with 23 digits"]),
        ("dotdot-allowed", "src/util/file_checks.cpp",
         ": parent ? \"it has a '..' component, which leaves the folder\"",
         ": false ? \"it has a '..' component, which leaves the folder\"",
         ["metadata.json names ../../../outside/SHARD",
          "HF index names ../x.safetensors (it exists)"]),
    ],
]


def main():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bad_input_mutations as runner
    runner.run_for_table(FILE_MUTATIONS, Path(__file__).with_name("bad_files_table.py"))


if __name__ == "__main__":
    main()
