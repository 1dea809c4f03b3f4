#!/usr/bin/env python3
"""Does tests/checkpoint_state_table.py (the CheckpointState dist tests at W = 2 and 3) catch
what it claims? tests/bad_input_mutations.py's runner applies each group of STATE_MUTATIONS in
WORKTREE, rebuilds fsdp_dist_tests and fsdprun there, runs the table, checks that every case a
mutation targets turns red, then restores the files with git checkout.

    .venv/bin/python tests/checkpoint_state_mutations.py WORKTREE"""
import sys
from pathlib import Path

RESUMES = ["SgdWithMomentumResumesAtAnotherWorldSize", "AdamResumesAtAnotherWorldSize",
           "AdamWWithAmsgradResumesAtAnotherWorldSize",
           "CenteredRmspropWithMomentumResumesAtAnotherWorldSize", "AdagradResumesAtAnotherWorldSize"]


def at_both(*names):
    return [f"W={w} {n}" for w in (2, 3) for n in names]


# (id, file, exact original text, mutated text, [cases that must turn red])
STATE_MUTATIONS = [
    [("buffers-left-out", "src/io/checkpoint_save.cpp", "  meta.buffers = buffers;\n", "",
      at_both(*RESUMES))],
    [("momentum-restored-as-zeros", "src/io/optimizer_state.cpp",
      's->momentum_buffer(kind_or_undefined(saved, "momentum_buffer"));\n         return s;',
      's->momentum_buffer(at::zeros_like(kind_or_undefined(saved, "momentum_buffer")));\n         return s;',
      at_both("SgdWithMomentumResumesAtAnotherWorldSize"))],
    [("full-state-dict-without-buffers", "src/io/state_dict.cpp",
      "    params.emplace_back(name, value.to(buffer.device()));\n", "",
      at_both(*RESUMES))],
]


def main():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bad_input_mutations as runner
    runner.run_for_table(STATE_MUTATIONS, Path(__file__).with_name("checkpoint_state_table.py"),
                         targets=("fsdp_dist_tests", "fsdprun"))


if __name__ == "__main__":
    main()
