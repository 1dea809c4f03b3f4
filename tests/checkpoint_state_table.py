#!/usr/bin/env python3
"""The CheckpointState dist tests (tests/checkpoint_state_test.cpp: BatchNorm's buffers and each
optimizer's state saved at W - 1 ranks, resumed at W) and the CheckpointOptions ones
(tests/checkpoint_options_test.cpp: the param groups' options, the step, tensors outside the
model) and the CheckpointTwoOptimizers ones (tests/checkpoint_two_optimizers_test.cpp: Muon +
AdamW in one checkpoint) at W = 2 and 3, one row per test and world size, as a table that
tests/checkpoint_state_mutations.py reads. ctest runs the same tests in dist_world2 / dist_world3.

    .venv/bin/python tests/checkpoint_state_table.py BUILD/bin OUT.md"""
import os
import re
import subprocess
import sys
from pathlib import Path


def run(bin_dir, world):
    env = dict(os.environ, FSDP_TIMEOUT_SECONDS="60", OMP_NUM_THREADS="1")
    cmd = [str(bin_dir / "fsdprun"), "--nproc-per-node", str(world), str(bin_dir / "fsdp_dist_tests"),
           "--gtest_filter=CheckpointState.*:CheckpointOptions.*:CheckpointTwoOptimizers.*"]
    result = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=600)
    # gtest's colours (fsdprun's ranks may write to a terminal) would hide "[  FAILED  ] Name".
    return result.returncode, re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)


def main():
    bin_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    rows, failures = [], 0
    for world in (2, 3):
        rc, output = run(bin_dir, world)
        passed = set(re.findall(r"\[       OK \] Checkpoint(?:State|Options|TwoOptimizers)\.(\w+)", output))
        failed = set(re.findall(r"\[  FAILED  \] Checkpoint(?:State|Options|TwoOptimizers)\.(\w+)", output))
        names = sorted(passed | failed)
        if not names:
            failures += 1
            rows.append(f"| W={world} (no test ran) | green | rc {rc} | - | {output[-200:]!r} | FAIL |")
        for name in names:
            ok = name in passed and name not in failed
            failures += not ok
            rows.append(f"| W={world} {name} | green | rc {rc} | - | - | {'ok' if ok else 'FAIL'} |")
        if failed:
            sys.stderr.write(output[-4000:])
    text = "| case | expect | result | - | - | verdict |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    out.write_text(text)
    print(text)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
