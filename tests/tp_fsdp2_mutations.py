#!/usr/bin/env python3
"""Does the comparison with PyTorch's FSDP2 + TP catch what issue 52 says it must? Each mutation
below breaks one line of the tensor-parallel core (src/tp, src/optim/clip.cpp) the way a plausible
bug would; this script applies it in WORKTREE, rebuilds gpt_train, runs tests/tp_fsdp2_e2e.py
(gpt_train --tp 2 at W = 4 against bench/peer_fsdp2.py --tp 2, 10 steps, --clip 1.0), which must
fail, and restores the file with git checkout.

    .venv/bin/python tests/tp_fsdp2_mutations.py WORKTREE [--only ID,...]

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed.
Prints a Markdown table: mutation -> the test red (its message), or SURVIVED (exit 1)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mutation"))
import text_mutations  # noqa: E402

PEER = "tests/tp_fsdp2_e2e.py"

# (id, file, exact original text, mutated text, [tests that must each turn red])
MUTATIONS = [
    # Each rank keeps its own partial sum of o_proj / down_proj for its sequence chunk.
    ("rowwise-output-not-reduced", "src/tp/parallel_styles.cpp",
     "                             ? tp_->reduce_scatter_sequence(partial)",
     "                             ? tp_->sequence_chunk(partial)", [PEER]),
    # A sequence-parallel norm's weight keeps the gradient of this rank's tokens only.
    ("sequence-parallel-norm-gradient-not-summed", "src/tp/parallelize.cpp",
     "    tp->all_reduce_(sum);\n", "", [PEER]),
    # Each rank shifts its vocabulary chunk by its own maximum: the summed exponentials disagree.
    ("loss-parallel-max-not-reduced", "src/tp/loss_parallel.cpp",
     "tp->all_gather_along(std::get<0>(logits.max(-1)).unsqueeze(0), 0)",
     "std::get<0>(logits.max(-1)).unsqueeze(0)", [PEER]),
    # Every tp rank's copy of a replicated norm weight counted in the global norm.
    ("clip-counts-a-replicated-norm-twice", "src/optim/clip.cpp",
     "      if (placement->replicated() && placement->tp->rank() != 0) continue;\n", "", [PEER]),
]


if __name__ == "__main__":
    text_mutations.main(MUTATIONS, ["gpt_train", "fsdprun"])
