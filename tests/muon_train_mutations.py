#!/usr/bin/env python3
"""Does tests/muon_train_e2e.py (gpt_train --optimizer muon against torch.optim.Muon +
torch.optim.AdamW) catch what it claims? Each mutation below changes one line of the trainer's
Muon (examples/gpt) or of the test's reference the way a plausible bug would; this script applies
it in WORKTREE, rebuilds gpt_train when the trainer changed, runs the test, which must fail, and
restores the file with git checkout.

    .venv/bin/python tests/muon_train_mutations.py WORKTREE [--only ID,...]

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed.
Prints a Markdown table: mutation -> red (the test's message), or SURVIVED (exit 1)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mutation"))
import text_mutations  # noqa: E402

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


if __name__ == "__main__":
    text_mutations.main([(*m, [TEST]) for m in MUTATIONS], ["gpt_train", "fsdprun"],
                        rebuilds=lambda path: path.startswith("examples/"))
