#!/usr/bin/env python3
"""Does tests/tp_parity_e2e.py (gpt_train --tp against the unsharded reference: losses, gradient
norms, TP bytes) catch what it claims? Each mutation changes one line of the tensor parallelism
(src/tp, the clipping, the trainer's model) the way a plausible bug would; this script applies it
in WORKTREE, rebuilds gpt_train, runs the test, which must fail, and restores the file.

    .venv/bin/python tests/tp_mutations.py WORKTREE [--only ID,...]

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed.
Prints a Markdown table: mutation -> red (the test's message), or SURVIVED (exit 1)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mutation"))
import text_mutations  # noqa: E402

TEST = "tests/tp_parity_e2e.py"
STYLES, LOSS = "src/tp/parallel_styles.cpp", "src/tp/loss_parallel.cpp"

# (id, file, exact original text, mutated text)
MUTATIONS = [
    # A row-wise output kept as this rank's partial sum: its chunk of the sequence, not reduced.
    ("rowwise-output-not-reduced", STYLES,
     "    ? tp_->reduce_scatter_sequence(partial)\n                             : tp_->reduce(partial);",
     "    ? tp_->sequence_chunk(partial)\n                             : tp_->reduce(partial);"),
    # A sequence-parallel norm's weight gradient left at this rank's part of the sequence.
    ("sequence-parallel-gradient-not-summed", "src/tp/parallelize.cpp",
     "    at::Tensor sum = grad.contiguous().clone();\n    tp->all_reduce_(sum);",
     "    at::Tensor sum = grad.contiguous().clone();"),
    # Each rank shifts its logits by its own chunk's maximum.
    ("loss-parallel-max-not-reduced", LOSS,
     "tp->all_gather_along(std::get<0>(logits.max(-1)).unsqueeze(0), 0)",
     "(std::get<0>(logits.max(-1)).unsqueeze(0))"),
    # Clipping counts a replicated parameter (a norm's weight) on every tp rank.
    ("clip-counts-replicated-on-every-rank", "src/optim/clip.cpp",
     "if (placement->replicated() && placement->tp->rank() != 0) continue;", ""),
    # The vocabulary-parallel embedding keeps the rows of ids outside its chunk.
    ("embedding-mask-dropped", STYLES,
     "at::embedding(weight, local_ids) * here.unsqueeze(-1).to(weight.scalar_type())", "at::embedding(weight, local_ids)"),
    # The columns of q, k and v inside the prepared attention summed twice in backward.
    ("prepared-input-gradient-summed-twice", STYLES,
     "      return x;  // the gather's backward", "      return tp_->copy_to(x);  // the gather's backward"),
    # The loss's sums kept per rank.
    ("loss-parallel-sums-not-reduced", LOSS, "    tp->all_reduce_(stats);\n", ""),
    # GPT-2's fused c_attn split as one matrix: rank 0 gets all of q and half of k.
    ("fused-qkv-split-as-one", "examples/gpt/gpt2/gpt2_family.cpp",
     'ColwiseParallel().fused_chunks(3)', 'ColwiseParallel()'),
    # The mesh's host check counts every member as on this host: no warning across hosts.
    ("tp-across-hosts-not-warned", "src/tp/device_mesh.cpp",
     "if (!local || *local < 1) return static_cast<int>(members.size());", "return static_cast<int>(members.size());"),
    # GPT-2's positions: every rank adds the first chunk's.
    ("positions-of-the-first-chunk", "examples/gpt/gpt.cpp",
     "tp->chunk_along(positions, 0)", "positions.narrow(0, 0, x.size(1))"),
]

# fsdp::optim::Muon on the split model (--optimizer muon; the Muon layouts only).
MUON_TEST = (TEST, "--only", "gpt2-2x2-muon,llama-1x2-muon")
MUON_MUTATIONS = [
    # What Muon did before it assembled the parts: each tp rank orthogonalizes its part alone.
    ("muon-tp-part-orthogonalized-alone", "src/optim/muon.cpp", "    if (which[e]->split()) {", "    if (false) {"),
    # The model's record without the tensor-parallel split: Muon (and the rest) see parts as wholes.
    ("muon-placement-dropped", "src/core/flat_param.cpp",
     "    entry.tensor_parallel = tp::placement_of(param);", "    entry.tensor_parallel = std::nullopt;"),
]


if __name__ == "__main__":
    text_mutations.main([(*m, [TEST]) for m in MUTATIONS] + [(*m, [MUON_TEST]) for m in MUON_MUTATIONS],
                        ["gpt_train", "fsdprun"])
