#!/usr/bin/env python3
"""Do the 2-D checkpoint tests catch what they claim? Each mutation below changes how a sharded
checkpoint of an FSDP x TP model is saved, described or loaded the way a plausible bug would;
this script applies it in WORKTREE, rebuilds gpt_train, runs tests/tp_checkpoint_e2e.py (saved at
(dp, tp) = (2, 2), resumed at (2, 2), (1, 2), (3, 1), (1, 1); dcp.load; edited metadata refused),
which must fail, and restores the file with git checkout. The mapping's own unit test
(GlobalBoxes.* in fsdp_unit_tests) is run by hand: docs/mutation-testing.md.

    .venv/bin/python tests/tp_checkpoint_mutations.py WORKTREE [--only ID,...]

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed.
Prints a Markdown table: mutation -> red (the first failure it printed), or SURVIVED (exit 1)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mutation"))
import text_mutations  # noqa: E402

E2E = "tests/tp_checkpoint_e2e.py"

# (id, file, exact original text, mutated text)
MUTATIONS = [
    ("tp-offset-dropped", "src/io/global_boxes.cpp",
     "cut.offsets[d] = c * whole_slice + part.rank * slice + (from - c * slice);",
     "cut.offsets[d] = c * whole_slice + (from - c * slice);"),
    ("fused-slices-ignored", "src/io/global_boxes.cpp",
     "const int64_t slice = part_shape[d] / part.chunks, whole_slice = part.whole_shape[d] / part.chunks;",
     "const int64_t slice = part_shape[d], whole_slice = part.whole_shape[d];"),
    ("replicated-saved-by-every-tp-rank", "src/io/checkpoint_save.cpp",
     "if (part.dim < 0 && groups.tp_rank() != 0) continue;", "if (false) continue;"),
    ("step-saved-by-every-tp-rank", "src/io/checkpoint_save.cpp",
     "if (starts_whole && saved->step) {", "if (box.begin == 0 && saved->step) {"),
    ("load-ignores-tp-part", "src/io/checkpoint_load.cpp",
     "return boxes_in_whole(piece.shape(), piece.begin(), piece.end(), part_in_whole(piece));",
     "return boxes_in_whole(piece.shape(), piece.begin(), piece.end(), PartInWhole{-1, 1, 0, piece.shape()});"),
    ("agreement-over-fsdp-group-only", "src/io/checkpoint_agreement.cpp",
     "if (!groups.tp) return of_world;", "return of_world;"),
    ("metadata-part-shape", "src/io/checkpoint_pieces.cpp",
     "ParamMeta meta{p.name(), part_in_whole(p).whole_shape,", "ParamMeta meta{p.name(), p.shape(),"),
    ("box-overlap-unchecked", "src/io/checkpoint_format.cpp",
     "TORCH_CHECK(!overlap(boxes[i], boxes[j]), source,", "TORCH_CHECK(true || !overlap(boxes[i], boxes[j]), source,"),
    ("extra-tp-unchecked", "examples/gpt/checkpointing.cpp",
     "TORCH_CHECK(ranks % tp == 0 && tp_size == nlohmann::json(tp), metadata,",
     "TORCH_CHECK(true || (ranks % tp == 0 && tp_size == nlohmann::json(tp)), metadata,"),
]

if __name__ == "__main__":
    text_mutations.main([(*m, [E2E]) for m in MUTATIONS], ["gpt_train", "fsdprun"])
