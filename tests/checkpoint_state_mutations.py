#!/usr/bin/env python3
"""Does tests/checkpoint_state_table.py (the CheckpointState, CheckpointOptions and
CheckpointTwoOptimizers dist tests at W = 2 and 3) catch
what it claims? tests/bad_input_mutations.py's runner applies each group of STATE_MUTATIONS in
WORKTREE, rebuilds fsdp_dist_tests and fsdprun there, runs the table, checks that every case a
mutation targets turns red, then restores the files with git checkout.

    .venv/bin/python tests/checkpoint_state_mutations.py WORKTREE [MUTATION_ID...]"""
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
      'o::SGDParamState>();\n         s->momentum_buffer(kind_or_undefined(saved, "momentum_buffer"));',
      'o::SGDParamState>();\n         s->momentum_buffer(at::zeros_like(kind_or_undefined(saved, "momentum_buffer")));',
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
      "    for (size_t g = 0; g < staged[k].size(); ++g) groups[g].set_options(std::move(staged[k][g]));",
      "    (void)groups;", at_both(RESUME_OPTIONS))],
    [("kinds-of-the-programs-options", "src/io/checkpoint_load.cpp",
      "  const auto kinds = optimizers.kinds_needed(piece.param(), options);",
      "  const auto kinds = optimizers.kinds_needed(piece.param());", at_both(RESUME_OPTIONS))],
    [("step-not-recorded", "src/io/checkpoint_dir.cpp", '  out["step"] = step;\n', "",
      at_both(STEP, RESUME_OPTIONS))],
    [("extra-step-conflict-unchecked", "src/io/checkpoint_dir.cpp",
      '    TORCH_CHECK(out["step"] == nlohmann::json(step),', "    TORCH_CHECK(true,", at_both(STEP))],
]


# Issue 51 item 4: Muon + AdamW in one checkpoint (tests/checkpoint_two_optimizers_test.cpp).
TWO_RESUME = "MuonAndAdamWSavedAtOneWorldSizeResumeAtAnotherAsIfUninterrupted"
TWO_KINDS = "EachParameterRecordsItsOptimizerAndExactlyItsState"
CROSS_LOADS = ["MuonStateLoadedIntoAnAdamWIsRefusedByName", "AdamWStateLoadedIntoMuonIsRefusedByName"]
# Each group's mutations target disjoint tests, so that one build shows each of them red (a
# mutation that lets a refused load go on is followed by groups of their own: what it loads may
# end the binary before later tests report, which the table would read as SURVIVED).
TWO_OPTIMIZERS_MUTATIONS = [
    [("second-optimizers-options-not-restored", "src/io/param_groups.cpp",
      "  for (size_t k = 0; k < staged.size(); ++k) {\n    auto& groups",
      "  for (size_t k = 0; k < 1; ++k) {\n    auto& groups", at_both(TWO_RESUME)),
     ("muon-ns-steps-not-saved", "src/io/optimizer_options.cpp",
      'visit("ns_steps", x.ns_steps()), ', "", at_both(TWO_KINDS)),
     ("saved-class-of-a-parameter-unchecked", "src/io/checkpoint_load.cpp",
      "    TORCH_CHECK(s.optimizer == mine, folder,", "    TORCH_CHECK(true, folder,",
      at_both(*CROSS_LOADS))],
    # Alone: with a cross load accepted, the binary may stop before the tests after it report.
    [("optimizers-order-unchecked", "src/io/checkpoint_load.cpp",
      "  TORCH_CHECK(!any_state || !meta.param_groups || meta.optimizers == optimizers.names(),",
      "  TORCH_CHECK(true,", at_both("OptimizersPassedInAnotherOrderAreRefused"))],
    [("parameter-in-two-optimizers-accepted", "src/io/optimizer_set.cpp",
      "        TORCH_CHECK(first || it->second == k, what,", "        TORCH_CHECK(true, what,",
      at_both("AParameterInBothOptimizersIsRefusedByName"))],
    [("muon-momentum-restored-as-zeros", "src/io/optimizer_state.cpp",
      's->momentum_buffer(kind_or_undefined(saved, "momentum_buffer"));\n         return s;\n       }},\n  };',
      's->momentum_buffer(at::zeros_like(kind_or_undefined(saved, "momentum_buffer")));\n'
      '         return s;\n       }},\n  };',
      at_both(TWO_RESUME)),
     ("parameters-optimizer-not-written", "src/io/checkpoint_format.cpp",
      '  if (several) j["optimizer"] = p.optimizer.empty()', '  if (false) j["optimizer"] = p.optimizer.empty()',
      at_both(TWO_KINDS, CROSS_LOADS[0]))],
    [("state-kinds-of-the-first-optimizer-only", "src/io/optimizer_set.cpp",
      "  for (const auto& s : states_) {\n    for (const auto& kind : s.kinds_in_use()) {",
      "  for (const auto& s : {states_.front()}) {\n    for (const auto& kind : s.kinds_in_use()) {",
      at_both(TWO_RESUME))],
]


def main():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bad_input_mutations as runner
    groups = STATE_MUTATIONS + OPTIONS_MUTATIONS + TWO_OPTIMIZERS_MUTATIONS
    ids = [a for a in sys.argv[2:] if not a.startswith("--")]  # some rows only, by id
    if ids:
        sys.argv = [a for a in sys.argv if a not in ids]
        groups = [g for g in groups if any(m[0] in ids for m in g)]
    runner.run_for_table(groups, Path(__file__).with_name("checkpoint_state_table.py"),
                         targets=("fsdp_dist_tests", "fsdprun"))


if __name__ == "__main__":
    main()
