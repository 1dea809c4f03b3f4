#!/usr/bin/env python3
"""Does tests/checkpoint_state_table.py (the CheckpointState and CheckpointOptions dist tests at W = 2 and 3) catch
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


# Issue 49 item 6: the param groups' options, save_checkpoint's step, tensors outside the model
# (tests/checkpoint_options_test.cpp).
RESUME_OPTIONS = "EveryOptimizerResumesWithItsScheduledOptionsBitwise"
STEP = "SaveCheckpointsStepComesBackAndAnotherStepInExtraIsRefused"
OPTIONS_MUTATIONS = [
    [("param-groups-count-unchecked", "src/io/param_groups.cpp",
      "  TORCH_CHECK(saved.size() == count, source,", "  TORCH_CHECK(true, source,",
      at_both("AnOptimizerWithAnotherNumberOfParamGroupsIsRefusedNamingBoth"))],
    [("param-group-members-unchecked", "src/io/param_groups.cpp",
      "    TORCH_CHECK(only_saved.empty() && only_mine.empty(), source,", "    TORCH_CHECK(true, source,",
      at_both("AGroupHoldingOtherParametersIsRefusedNamingOne"))],
    [("tensor-outside-model-skipped", "src/io/param_groups.cpp",
      "    TORCH_CHECK(it != names.end(), what,",
      "    if (it == names.end()) continue;\n    TORCH_CHECK(true, what,",
      at_both("ATensorOutsideTheModelIsRefusedAtSaveBeforeAnythingIsWritten"))],
    [("options-not-restored", "src/io/param_groups.cpp",
      "  for (size_t g = 0; g < staged.size(); ++g) optimizer.param_groups()[g].set_options(std::move(staged[g]));",
      "  (void)optimizer, (void)staged;", at_both(RESUME_OPTIONS))],
    [("kinds-of-the-programs-options", "src/io/checkpoint_load.cpp",
      "  const auto kinds = optimizer.kinds_needed(piece.param(), options);",
      "  const auto kinds = optimizer.kinds_needed(piece.param());", at_both(RESUME_OPTIONS))],
    [("step-not-recorded", "src/io/checkpoint_dir.cpp", '  out["step"] = step;\n', "",
      at_both(STEP, RESUME_OPTIONS))],
    [("extra-step-conflict-unchecked", "src/io/checkpoint_dir.cpp",
      '    TORCH_CHECK(out["step"] == nlohmann::json(step),', "    TORCH_CHECK(true,", at_both(STEP))],
]


def main():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bad_input_mutations as runner
    runner.run_for_table(STATE_MUTATIONS + OPTIONS_MUTATIONS, Path(__file__).with_name("checkpoint_state_table.py"),
                         targets=("fsdp_dist_tests", "fsdprun"))


if __name__ == "__main__":
    main()
