#!/usr/bin/env python3
"""Does tests/bad_input_table.py catch what it claims? Each group of mutations disables checks
(in a separate worktree, never the shared checkout), rebuilds gpt_train and fsdprun there, runs
the table against that build and checks that every case a mutation targets turns red; then
restores the files with git checkout.

    .venv/bin/python tests/bad_input_mutations.py WORKTREE [--table tests/bad_input_table.py]

(an interpreter with torch: the table writes a torch.save file with it).

WORKTREE must be a configured build of this project (WORKTREE/build). Prints, per mutation,
the cases that went red, or "SURVIVED". The mutations of one group touch different checks, and
each names only cases that no other check of the group covers."""
import argparse
import re
import subprocess
import sys
from pathlib import Path

# The programs a mutated build rebuilds (a table of other programs adds its own).
TARGETS = ["gpt_train", "fsdprun"]

# (id, file, exact original text, mutated text, [cases that must turn red])
GROUPS = [
    [
        ("step-in-backward-unchecked", "examples/gpt/command_line.cpp",
         "  if (!o.step_in_backward) return \"\";", "  return \"\";",
         ["--step-in-backward --clip 1", "--step-in-backward fp16",
          "--step-in-backward --optimizer torch", "--step-in-backward --reference"]),
        ("auto-replaced-unnamed", "examples/gpt/command_line.cpp",
         "  if (cl.autoplan) cl.replaced_by_auto = flags_auto_replaces(app, cl);", "",
         ["--auto replaces a given --strategy"]),
    ],
    [  # the run the plan did not count goes over the cap, and the check after it fails the run
        ("micro-batches-unplanned", "src/plan/plan_memory.cpp",
         "  if (n == 1) return {MicroBatch{}};", "  if (true) return {MicroBatch{}};",
         ["--auto, cap just above a plan with accumulation"]),
    ],
    [
        ("integer-flags-unchecked", "examples/gpt/command_line.cpp",
         "if (whole && value >= lo && value <= hi) return \"\";", "return \"\";",
         ["--batch 0", "--batch -5", "--steps -1", "--warmup-steps -3", "--log-every 0",
          "--max-data-mb -1", "--max-data-mb 1e12", "--seed -1", "--layers 0", "--seq 1",
          "--grad-accum 0", "--sample -1", "--max-nonfinite-steps 0",
          "--batch 0 --resume --save-every 2"]),
        ("real-flags-unchecked", "examples/gpt/command_line.cpp",
         "if (number && std::isfinite(value) && accepts(value)) return \"\";",
         "return \"\";",
         ["--lr inf", "--lr nan", "--clip nan", "--weight-decay -1", "--loss-scale inf"]),
        ("flag-combinations-unchecked", "examples/gpt/command_line.cpp",
         "std::string check_flag_combinations(const CLI::App& app, const TrainOptions& o, bool reference) {",
         "std::string check_flag_combinations(const CLI::App& app, const TrainOptions& o, bool reference) {\n  return \"\";",
         ["--world-size without --reference", "--checkpoint-dir alone"]),
        ("resume-config-unchecked", "examples/gpt/checkpointing.cpp",
         "  if (!saved.is_object()) return;", "  return;",
         ["--resume, other --heads", "--resume, --steps below the checkpoint"]),
        ("fresh-run-overwrites", "examples/gpt/checkpointing.cpp",
         "TORCH_CHECK(found.empty(), ", "TORCH_CHECK(true || found.empty(), ",
         ["fresh run into a checkpoint dir"]),
        ("resume-missing-dir-unnamed", "examples/gpt/checkpointing.cpp",
         "      TORCH_CHECK(exists, \"--resume: --checkpoint-dir \", fsdp::printable(dir),",
         "      TORCH_CHECK(true, \"--resume: --checkpoint-dir \", fsdp::printable(dir),",
         ["--resume, missing dir"]),
        ("checkpoint-dir-file-accepted-up-front", "examples/gpt/checkpointing.cpp",
         "TORCH_CHECK(!fs::exists(path, ec) || fs::is_directory(path, ec), flag,",
         "TORCH_CHECK(true, flag,", []),
        ("checkpoint-dir-file-accepted", "examples/gpt/checkpointing.cpp",
         "TORCH_CHECK(!exists || fs::is_directory(dir, ec), ",
         "TORCH_CHECK(true || fs::is_directory(dir, ec), ",
         ["--resume, dir is a file", "--save-every, dir is a file"]),
        ("stale-tmp-kept", "examples/gpt/checkpointing.cpp",
         "bool process_exists(long pid) { return",
         "bool process_exists(long pid) { return true || ",
         ["stale latest.tmp.<dead pid>, --resume"]),
        ("nan-never-stops", "examples/gpt/step.cpp",
         "} else if (++consecutive_ >= o.max_nonfinite_steps) {",
         "} else if (++consecutive_ >= o.max_nonfinite_steps + 1000000) {",
         ["NaN loss (--init-from with NaN)", "NaN, --max-nonfinite-steps 1, --save-full"]),
        ("nan-checkpointed", "examples/gpt/trainer.cpp",
         "if (std::isfinite(loss) && parameters_finite(gpt, ctx.dist)) {", "if (true) {",
         ["... and no checkpoint of the NaN model"]),
        ("empty-prompt-crashes", "examples/gpt/trainer.cpp",
         "  if (tokens.empty()) tokens.push_back('\\n');", "",
         ["--prompt '' --sample 8"]),
        ("prompt-signed-bytes", "examples/gpt/trainer.cpp",
         "for (unsigned char byte : prompt)", "for (char byte : prompt)",
         ["--prompt with bytes >= 128"]),
        ("data-read-whole", "examples/gpt/data.cpp",
         "    std::string content = read_file(file, static_cast<size_t>(max_bytes) - text.size(), path);",
         "    std::string content = read_file(file, SIZE_MAX, path);\n"
         "    content.resize(std::min(content.size(), static_cast<size_t>(max_bytes) - text.size()));",
         ["48 MiB file, --max-data-mb 1"]),
        ("data-devices-accepted-main", "examples/gpt/checkpointing.cpp",
         "TORCH_CHECK(fs::is_regular_file(status) || (fs::is_directory(status) && !o.data_is_tokens),",
         "TORCH_CHECK(true,", []),
        ("data-devices-accepted", "examples/gpt/data.cpp",
         "TORCH_CHECK(fs::is_regular_file(status) || fs::is_directory(status), ",
         "TORCH_CHECK(true, ", ["--data /dev/zero", "--data /dev/urandom", "--data FIFO"]),
        ("grace-unchecked-cli", "tools/fsdprun/main.cpp",
         "if (number && std::isfinite(value) && value >= 0 && value <= kMaxGraceSeconds) return \"\";",
         "return \"\";", []),
        ("grace-unchecked", "tools/fsdprun/launcher.cpp",
         "if (!(config.grace_seconds >= 0 && config.grace_seconds <= 86400)) {",
         "if (false) {", ["fsdprun --grace-seconds nan", "fsdprun --grace-seconds 1e7"]),
    ],
    [
        ("zip-crc-unchecked", "src/io/tensor_file.cpp",
         "  check_zip_crcs(bytes, path);\n", "", ["--init-from, one tensor corrupted"]),
        ("timeout-loose", "src/launch/environment_settings.cpp",
         "TORCH_CHECK(end == value.c_str() + value.size() && std::isfinite(seconds) && seconds >= 0.001 &&\n"
         "                  seconds <= kMaxTimeoutSeconds,",
         "TORCH_CHECK(seconds > 0 || seconds != seconds,", ["FSDP_TIMEOUT_SECONDS=1e10"]),
        ("duplicate-rank-unnamed", "src/launch/distributed.cpp",
         "  check_ranks_joined(*store, env, timeout, left_until(deadline));\n", "", ["RANK=1 twice at W=3"]),
        ("peer-rank-unnamed", "src/launch/distributed.cpp",
         "  std::string out;\n  bool unknown = false;",
         "  return message;\n  std::string out;\n  bool unknown = false;",
         ["peer killed mid-training, ring (survivor)"]),
        ("omp-threads-unchecked", "src/launch/environment_settings.cpp",
         "  check_omp_num_threads(threads);\n", "", ["OMP_NUM_THREADS=abc"]),
    ],
    [
        ("outputs-onto-inputs-unchecked", "examples/gpt/checkpointing.cpp",
         "  check_no_overlap(path_uses(o, rank));\n", "",
         ["--metrics onto --data", "--save-full onto --data", "--trace onto --data",
          "--metrics onto a symlink of --data", "--save-full onto a hard link of --data",
          "--dump-batches onto --data-tokens", "--eval-out onto --eval-tokens",
          "--metrics inside the --data folder", "--checkpoint-dir inside the --data folder",
          "--metrics and --trace one file"]),
        ("rank-template-unchecked", "examples/gpt/checkpointing.cpp",
         "TORCH_CHECK(path.find(\"{rank}\") != std::string::npos || world_size == 1,",
         "TORCH_CHECK(true,", ["--metrics without {rank} at W=2", "--trace without {rank} at W=2"]),
        ("export-hf-checked-late", "examples/gpt/checkpointing.cpp",
         "  if (!o.export_hf.empty()) check_output_folder(\"--export-hf\", o.export_hf);\n", "",
         ["--export-hf below a file (checked before training)"]),
        ("data-unreadable-skipped", "examples/gpt/data.cpp",
         "  TORCH_CHECK(in, \"--data \", data, \": cannot read \",",
         "  if (!in) return content;\n  TORCH_CHECK(true, \"--data \", data, \": cannot read \",",
         ["--data folder with an unreadable file"]),
        ("wpe-uncounted", "examples/gpt/command_line.cpp",
         "(static_cast<double>(o.model.vocab_size) + o.model.context()) * d;",
         "(static_cast<double>(o.model.vocab_size) + seq) * d;", ["HF n_positions 4294967328"]),
        ("eval-tokens-named-data-tokens", "examples/gpt/trainer.cpp",
         "read_token_file(path, \"--eval-tokens\",", "read_token_file(path, \"--data-tokens\",",
         ["--eval-tokens, odd size"]),
        ("data-named-data-tokens", "examples/gpt/trainer.cpp",
         "Corpus::load_tokens(o.data, o.data_flag,", "Corpus::load_tokens(o.data, \"--data-tokens\",",
         ["--data FILE.bin, odd size"]),
        ("no-run-lock", "examples/gpt/checkpointing.cpp",
         "  if (dir.empty() || rank != 0) return nullptr;",
         "  if (true) return nullptr;", ["second run into a held --checkpoint-dir"]),
        ("dead-holder-counted-alive", "src/util/run_lock.cpp",
         "    if (j.at(\"host\").get<std::string>() != host_name()) return false;",
         "    return true;",
         ["lock of a killed run"]),
        ("lone-rank-waits-in-tcpstore", "src/launch/distributed.cpp",
         "    if (!options.isServer) wait_for_listener(env.master_addr, env.master_port, deadline);\n",
         "", ["RANK=1 of 2 alone, FSDP_TIMEOUT_SECONDS=5"]),
        ("running-job-port-unnamed", "src/launch/distributed.cpp",
         "  TORCH_CHECK(count == 1 || !store.check(keys),", "  TORCH_CHECK(true,",
         ["second job on a running job's MASTER_PORT (rank 1)"]),
    ],
    [
        ("unlisted-folder-named-when-listed", "examples/gpt/data.cpp",
         "  if (ec) out.push_back(folder);",
         "  TORCH_CHECK(!ec, \"--data: cannot list \", folder.string());",
         ["... the same folder past --max-data-mb"]),
    ],
    [
        ("links-unresolved", "examples/gpt/checkpointing.cpp",
         "  return resolved(a.path) == resolved(b.path) || fs::equivalent(a.path, b.path, ec);  // hard links",
         "  return fs::absolute(a.path) == fs::absolute(b.path);",
         ["--metrics onto a symlink of --data", "--save-full onto a hard link of --data"]),
        ("unlisted-folder-skipped", "examples/gpt/data.cpp",
         "      if (fs::is_directory(file, ec)) {  // only folders that could not be listed are entries",
         "      if (false && fs::is_directory(file, ec)) {  // only folders that could not be listed are entries",
         ["--data folder with a folder that cannot be listed"]),
        ("unreachable-named-missing", "examples/gpt/checkpointing.cpp",
         "  if (!ec || ec == std::errc::no_such_file_or_directory) return std::string(\"no such \") + what;",
         "  return std::string(\"no such \") + what;",
         ["--data below a folder closed to the user"]),
        ("hf-sizes-blamed-on-flags", "examples/gpt/command_line.cpp",
         "  if (o.init_from_hf.empty()) return \"--layers/--dim/--seq/--batch ask\";",
         "  if (true) return \"--layers/--dim/--seq/--batch ask\";",
         ["... and no --layers/--dim blamed"]),
    ],
    [  # the run lock and the pruning touch only their own files (lock_and_pruning)
        ("lock-file-not-aliased", "examples/gpt/checkpointing.cpp",
         "    use(\"--checkpoint-dir\", fsdp::RunLock::path_in(o.checkpoint_dir), false, true);\n", "",
         ["ck/run.lock a hard link of --data"]),
        ("lock-hard-link-written-through", "src/util/run_lock.cpp",
         "  if (info.st_nlink <= 1) return;", "  return;", ["--checkpoint-dir a cp -al snapshot"]),
        ("nested-in-checkpoint-dir-accepted", "src/io/checkpoint_dir.cpp",
         "  TORCH_CHECK(outer.empty(), printable(dir), \" lies inside \",",
         "  TORCH_CHECK(true, printable(dir), \" lies inside \",",
         ["--checkpoint-dir inside another run's step folder",
          "--checkpoint-dir beside another run's run.lock"]),
        ("holding-checkpoint-dir-accepted", "src/io/checkpoint_dir.cpp",
         "  TORCH_CHECK(inner.empty(), printable(dir), \" holds \",",
         "  TORCH_CHECK(true, printable(dir), \" holds \",",
         ["--checkpoint-dir holding another run's checkpoint folder"]),
        ("prune-removes-foreign-folders", "src/io/checkpoint_dir.cpp",
         "    if (const std::string foreign = foreign_entry(folder); !foreign.empty()) {",
         "    if (const std::string foreign; !foreign.empty()) {",
         ["pruning keeps a step folder holding another run's lock"]),
        ("no-process-counted-alive", "src/util/run_lock.cpp",
         "    return started >= 0 && started == j.at(\"pid_start\").get<long long>();",
         "    return started == j.at(\"pid_start\").get<long long>();",
         ["stale lock, pid -1, pid_start -1", "stale lock, pid 0, pid_start -1",
          "stale lock, pid 2^40, pid_start -1"]),
        ("holder-line-echoed-raw", "src/util/run_lock.cpp",
         "  return printable(described);", "  return described;", ["stale lock line with control bytes"]),
        ("checkpoint-dir-path-echoed-raw", "examples/gpt/checkpointing.cpp",
         "    TORCH_CHECK(found.empty(), \"--checkpoint-dir \", fsdp::printable(dir),",
         "    TORCH_CHECK(found.empty(), \"--checkpoint-dir \", dir,",
         ["--checkpoint-dir with a newline in its name", "... the newline escaped in its one line"]),
        ("missing-dir-locked-before-auto", "examples/gpt/train_main.cpp",
         "gpt::lock_checkpoint_dir(o, rank, /*create=*/false);",
         "gpt::lock_checkpoint_dir(o, rank, /*create=*/true);", ["refused --auto: no folder left behind"]),
    ],
]


# What each group rebuilds; a table that runs other binaries adds them (bad_checkpoint_mutations.py).
TARGETS = ["gpt_train", "fsdprun"]


def sh(cmd, cwd, **kw):
    return subprocess.run(cmd, cwd=cwd, shell=isinstance(cmd, str), text=True,
                          capture_output=True, **kw)


def red_cases(table_output):
    """Names of the rows marked FAIL in the table's markdown."""
    red = set()
    for line in table_output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) >= 6 and cells[-1] == "FAIL":
            red.add(cells[0].replace("\\|", "|"))
    return red


def run_for_table(groups, table, targets=("gpt_train", "fsdprun")):
    """main() with `groups` in place of GROUPS, against the table script `table` (unless --table
    is given), rebuilding `targets`: what the other tables' *_mutations.py run."""
    global GROUPS, TARGETS
    GROUPS, TARGETS = groups, list(targets)
    if "--table" not in sys.argv:
        sys.argv += ["--table", str(table)]
    main()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("worktree")
    ap.add_argument("--table", default=str(Path(__file__).with_name("bad_input_table.py")))
    args = ap.parse_args()
    wt = Path(args.worktree)
    rows, survived = [], 0
    for group in GROUPS:
        files = sorted({m[1] for m in group})
        try:
            for mid, path, original, mutated, _ in group:
                text = (wt / path).read_text()
                if text.count(original) != 1:
                    sys.exit(f"{mid}: the original text occurs {text.count(original)} times in {path}")
                (wt / path).write_text(text.replace(original, mutated))
            build = sh(["cmake", "--build", "build", "-j2", "--target", *TARGETS], wt)
            if build.returncode != 0:
                sys.exit(f"the mutated build failed:\n{build.stdout[-3000:]}")
            table = sh([sys.executable, args.table, str(wt / "build" / "bin"),
                        str(wt / "build" / "mutant_table.md")], wt, timeout=900)
            red = red_cases(table.stdout)
            for mid, _, _, _, cases in group:
                missing = [c for c in cases if c not in red]
                survived += bool(missing)
                verdict = "SURVIVED: " + ", ".join(missing) if missing else \
                    ("red: " + ", ".join(cases) if cases else "(paired with the next)")
                rows.append(f"| {mid} | {verdict} |")
        finally:
            sh(["git", "checkout", "--", *files], wt)
    print("| mutation | table |\n|---|---|\n" + "\n".join(rows))
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
