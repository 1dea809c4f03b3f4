#!/usr/bin/env python3
"""Do Muon's tests catch what they claim? Each mutation below changes fsdp::optim::Muon the way a
plausible bug would; this script applies it in WORKTREE, rebuilds muon_tool, runs
tests/muon_reference_e2e.py (torch.optim.Muon given the same gradients, bitwise, at W = 1, 2, 3,
grad-op, no-shard, hybrid and (dp, tp) = (1, 2), (2, 2)), and for the 2-D ones (tp-*) also
tests/muon_tp_program_e2e.py, which must fail, and restores the file with git checkout.

    .venv/bin/python tests/muon_mutations.py WORKTREE [--only ID,...]

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed.
Prints a Markdown table: mutation -> red (the first failure it printed), or SURVIVED (exit 1)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mutation"))
import text_mutations  # noqa: E402

REFERENCE = "tests/muon_reference_e2e.py"

# (id, file, exact original text, mutated text)
MUTATIONS = [
    # What PyTorch FSDP2 + torch.optim.Muon does: each rank orthogonalizes the piece it holds.
    ("own-piece-orthogonalized", "src/optim/muon.cpp",
     "  const std::vector<at::Tensor> mine =\n"
     "      muon::scatter_from_owners(group, exchanged, results, pieces.front().options());\n",
     "  std::vector<at::Tensor> mine;\n"
     "  for (size_t e = 0; e < exchanged.size(); ++e)\n"
     "    mine.push_back(pieces[e].numel() ? orthogonalize(pieces[e].view({1, -1}), *stepped_now[e]->options)"
     ".reshape(-1) : pieces[e]);\n"),
    ("transpose-skipped", "src/optim/newton_schulz.cpp",
     "const bool tall = update.size(0) > update.size(1);", "const bool tall = false;"),
    ("momentum-not-kept", "src/optim/muon.cpp",
     "buffer.lerp_(s.grad, 1 - momentum);", "buffer = buffer.lerp(s.grad, 1 - momentum);"),
    ("piece-sent-back-from-the-wrong-offset", "src/optim/muon_exchange.cpp",
     "const int64_t start = starts_of(m.piece_numels)[r];",
     "const int64_t start = starts_of(m.piece_numels)[r == 0 ? 0 : r - 1];"),
    # 2-D (--tp 2 layouts): what Muon did on a tensor-parallel model before the second stage.
    ("tp-part-orthogonalized-alone", "src/optim/muon.cpp",
     "    if (which[e]->split()) {", "    if (false) {"),
    ("tp-placement-dropped", "src/core/flat_param.cpp",
     "    entry.tensor_parallel = tp::placement_of(param);", "    entry.tensor_parallel = std::nullopt;"),
    ("tp-parts-assembled-rank-major", "src/tp/parallelize.cpp",
     "for (const at::Tensor& part : parts) pieces.push_back(part.chunk(placement.fused_chunks, placement.dim)[c]);",
     "for (const at::Tensor& part : parts) pieces.push_back(part.chunk(placement.fused_chunks, placement.dim)[c]);\n"
     "    if (placement.fused_chunks > 1) return at::cat(parts, placement.dim);"),
    ("tp-lr-adjusted-by-the-part", "src/optim/muon.cpp",
     "apply_update(*stepped_now[e], mine[e], which[e]->whole_shape());",
     "apply_update(*stepped_now[e], mine[e], which[e]->param.shape());"),
    ("lr-adjusted-by-cols-over-rows", "src/optim/newton_schulz.cpp",
     "return lr * std::sqrt(std::max(1.0, rows / cols));", "return lr * std::sqrt(std::max(1.0, cols / rows));"),
]


# The 2-D mutations also against a program of a user's shape trained beside torch.optim.Muon + AdamW.
PROGRAM = "tests/muon_tp_program_e2e.py"


def tests_of(mutation_id):
    return [REFERENCE, PROGRAM] if mutation_id.startswith("tp-") else [REFERENCE]


if __name__ == "__main__":
    text_mutations.main([(*m, tests_of(m[0])) for m in MUTATIONS], ["muon_tool", "muon_tp_program", "fsdprun"],
                        keywords=("diff", "exit", "off, over"))
