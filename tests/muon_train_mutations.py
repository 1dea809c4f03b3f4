#!/usr/bin/env python3
"""Does tests/muon_train_e2e.py (gpt_train --optimizer muon against torch.optim.Muon +
torch.optim.AdamW) catch what it claims? Each mutation below changes one line of the trainer's
Muon (examples/gpt) or of the test's reference the way a plausible bug would; this script applies
it in WORKTREE, rebuilds gpt_train when the trainer changed, runs the test, which must fail, and
restores the file with git checkout.

    .venv/bin/python tests/muon_train_mutations.py WORKTREE [--only ID,...]

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed.
Prints a Markdown table: mutation -> red (the test's message), or SURVIVED (exit 1)."""
import argparse
import subprocess
import sys
from pathlib import Path

TEST = "tests/muon_train_e2e.py"

# (id, file, exact original text, mutated text)
MUTATIONS = [
    # Muon given the wrong split: the untied head (lm_head) among its matrices.
    ("head-given-to-muon", "examples/gpt/train_optimizers.cpp",
     "fsdp::optim::split_for_muon(*model);", "fsdp::optim::split_for_muon(*model, {\"head\"});"),
    ("muon-never-steps", "examples/gpt/muon_and_adamw.cpp", "  muon_.step();\n", ""),
    ("muon-lr-not-scheduled", "examples/gpt/train_optimizers.cpp",
     "o.muon_lr * schedule_factor(o, step)", "o.muon_lr"),
    ("adjust-lr-flag-ignored", "examples/gpt/train_optimizers.cpp",
     ".adjust_lr_fn(o.muon_adjust_lr)", ".adjust_lr_fn(\"original\")"),
    ("muon-without-weight-decay", "examples/gpt/train_optimizers.cpp",
     ".weight_decay(o.weight_decay)", ".weight_decay(0.0)"),
    # The reference, not gpt_train: torch.optim.Muon with the other adjust_lr_fn at W = 2.
    ("reference-with-the-other-adjust-lr", TEST,
     'MUON_DEFAULTS = (0.02, "original")', 'MUON_DEFAULTS = (0.02, "match_rms_adamw")'),
]


def sh(cmd, cwd, timeout=None):
    return subprocess.run(cmd, cwd=cwd, text=True, capture_output=True, timeout=timeout)


def build(wt):
    return sh(["cmake", "--build", "build", "-j2", "--target", "gpt_train", "fsdprun"], wt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("worktree")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    wt = Path(args.worktree).resolve()
    only = set(filter(None, args.only.split(",")))
    rows, survived = [], 0
    for mid, path, original, mutated in MUTATIONS:
        if only and mid not in only:
            continue
        text = (wt / path).read_text()
        if text.count(original) != 1:
            sys.exit(f"{mid}: the original text occurs {text.count(original)} times in {path}")
        try:
            (wt / path).write_text(text.replace(original, mutated))
            if path.startswith("examples/"):
                built = build(wt)
                if built.returncode != 0:
                    sys.exit(f"{mid}: the mutated build failed:\n{built.stdout[-3000:]}")
            run = sh([sys.executable, TEST, str(wt / "build" / "bin")], wt, timeout=900)
            if run.returncode == 0:
                verdict = "SURVIVED"
                survived += 1
            else:
                lines = [l for l in (run.stdout + run.stderr).splitlines() if "Error" in l or "assert" in l]
                verdict = f"red ({(lines or ['exit ' + str(run.returncode)])[-1][:160]})"
            rows.append(f"| {mid} | `{path}` | {verdict} |")
            print(rows[-1], flush=True)
        finally:
            sh(["git", "checkout", "--", path], wt)
    build(wt)
    print("| mutation | file | result |\n|---|---|---|\n" + "\n".join(rows))
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
