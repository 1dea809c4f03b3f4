#!/usr/bin/env python3
"""Mutation testing of the engine: each mutation changes one line of src/ in a separate worktree
(never the shared checkout), rebuilds fsdp_dist_tests and gpt_dist_tests, runs the tests meant to catch it (with a
timeout, stopping at the first that fails) and restores the file with git checkout.

    python3 tests/mutation/run_mutations.py /work/mut [--only ID,...] [--out table.md]

The worktree must be built (build/bin/fsdp_dist_tests, gpt_dist_tests, fsdprun). Prints a Markdown table:
mutation -> the failing test(s), or "survived"."""
import argparse
import os
import re
import subprocess
import sys
import time

BINARIES = ("fsdp_dist_tests", "gpt_dist_tests")  # the library's tests, the GPT's
LOGS = ""  # --logs DIR: each test run's output

# (id, file, exact original line (stripped), mutated line, [(world size, gtest filter), ...])
# A run is red when fsdprun exits non-zero (a failed assertion, a crash, a timeout).
MUTATIONS = [
    ("pre-division-removed", "src/core/unit_comm.cpp",
     "if (plan.pre != 1.0) full_grad.div_(plan.pre);",
     "(void)plan.pre;",
     [(2, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm"),
      (2, "MixedPrecision.*")]),
    ("post-division-removed", "src/core/unit_comm.cpp",
     "if (plan.post != 1.0) reduced.div_(plan.post);",
     "(void)plan.post;",
     [(2, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm")]),
    ("16-bit-factors-swapped", "src/core/unit_comm.cpp",
     "return {static_cast<double>(pre), static_cast<double>(w) / pre};",
     "return {static_cast<double>(w) / pre, static_cast<double>(w) / pre};",
     [(2, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm"),
      (3, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm")]),
    ("fp32-divides-by-w-minus-1", "src/core/unit_comm.cpp",
     "if (c10::elementSize(dtype) >= 4) return {1.0, static_cast<double>(w)};",
     "if (c10::elementSize(dtype) >= 4) return {1.0, static_cast<double>(w > 1 ? w - 1 : 1)};",
     [(3, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm")]),
    ("shard-offset-reversed", "src/core/flat_layout.cpp",
     "const int64_t shard_offset = position * layout.shard_numel;",
     "const int64_t shard_offset = (shard_group_size - 1 - position) * layout.shard_numel;",
     [(2, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm"),
      (2, "Parity.AwkwardModelMatchesReference")]),
    ("no-padding", "src/core/flat_layout.cpp",
     "int64_t shard_numel_of(int64_t numel, int f) { return (numel + f - 1) / f; }",
     "int64_t shard_numel_of(int64_t numel, int f) { return numel / f; }",
     [(3, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm"),
      (3, "Parity.AwkwardModelMatchesReference")]),
    ("backward-prefetch-wrong-unit", "src/core/unit_rules.h",
     "if (it == order.rend() || ++it == order.rend()) return nullptr;",
     "if (it == order.rend() || it == order.rbegin()) return nullptr; --it;",
     [(2, "Accounting.BytesPerStepMatchTheRingFormulas"),
      (2, "Strategy.BytesPerCollectiveMatchTheFormulas"), (2, "Accounting.*"),
      (2, "Prefetch.BackwardPreGathersTheNextUnitAsSoonAsABackwardStarts")]),
    ("root-prefetches-first-unit", "src/core/unit_rules.h",
     "if (is_root) return order.empty() ? nullptr : order.back();",
     "if (is_root) return order.empty() ? nullptr : order.front();",
     [(2, "Prefetch.*"), (2, "Accounting.*"), (2, "Strategy.BytesPerCollectiveMatchTheFormulas"),
      (2, "Parity.PrefetchAndRateLimiterChangeNothingNumerically")]),
    ("backward-pre-prefetch-removed", "src/core/step_conductor.cpp",
     "if (options_.backward_prefetch() == BackwardPrefetch::BackwardPre) prefetch_backward_after(unit);",
     "(void)0;",
     [(2, "Prefetch.BackwardPreGathersTheNextUnitAsSoonAsABackwardStarts")]),
    ("forward-prefetch-ignored", "src/core/step_conductor.cpp",
     "if (!options_.forward_prefetch()) return;",
     "if (true) return;",
     [(2, "Prefetch.ForwardPrefetchGathersTheNextUnitBeforeItsForwardByDefault")]),
    ("no-reshard-after-forward", "src/core/step_conductor.cpp",
     "unit.end_forward(/*reshard=*/!will_backward || !training || !keeps_for_backward);",
     "unit.end_forward(/*reshard=*/!will_backward || !training);",
     [(2, "Accounting.ForwardHoldsNoUnshardedUnitBeyondTheBound"),
      (2, "Strategy.BytesPerCollectiveMatchTheFormulas")]),
    ("no-sync-ignored", "src/core/param_group.cpp",
     "if (no_sync_) {  // keep the unsharded gradient for the next backward",
     "if (false) {  // keep the unsharded gradient for the next backward",
     [(2, "Training.GradientAccumulationWithoutCommunicationEqualsTheLargeBatch")]),
    ("no-sync-sum-dropped", "src/core/param_group.cpp",
     "g.flat.begin_full_grad(/*keep=*/g.full_grad_kept, /*into_shard=*/grads_need_no_reduction(g));",
     "g.flat.begin_full_grad(/*keep=*/false, /*into_shard=*/grads_need_no_reduction(g));",
     [(2, "Training.GradientAccumulationWithoutCommunicationEqualsTheLargeBatch")]),
    ("accumulation-overwrites", "src/core/unit_comm.cpp",
     "grad_shard.add_(reduced.to(grad_shard.device()));",
     "grad_shard.copy_(reduced.to(grad_shard.device()));",
     [(2, "Training.GradientAccumulationWithCommunicationEqualsTheLargeBatch")]),
    ("clip-norm-local-only", "src/optim/clip.cpp",
     "model.all_reduce_over_shard_group(squares);",
     "(void)model;",
     [(2, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm"),
      (2, "Training.GlobalGradientNormEqualsTheUnshardedNormForEveryStrategy")]),
    ("clip-never-scales", "src/optim/clip.cpp",
     "if (scale < 1.0) {",
     "if (scale > 1.0) {",
     [(2, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm"),
      (2, "Training.ClippedTrainingMatchesTheReference")]),
    ("checkpoint-piece-offset", "src/core/flat_param.h",
     "const int64_t begin = rank_ * shard_numel_ + entry.shard_begin - entry.offset;",
     "const int64_t begin = rank_ * shard_numel_ + entry.shard_begin - entry.offset + (rank_ > 0 ? 1 : 0);",
     [(2, "Checkpoint.*"), (3, "Checkpoint.*")]),
    ("hybrid-replica-reduction-removed", "src/core/unit_comm.cpp",
     "if (replicas) replicas->all_reduce_sum(reduced);",
     "(void)replicas;",
     [(2, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm"),
      (4, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm")]),
    ("frozen-grouped-with-trainable", "src/core/unit_rules.h",
     "groups[(kinds[i].trainable ? 0 : 2) + (kinds[i].full_precision ? 1 : 0)].push_back(i);",
     "groups[(kinds[i].full_precision ? 1 : 0)].push_back(i);",
     [(2, "FrozenParams.*")]),
    # The planner's frozen groups ([Note: the planned step]): planned as trained, they reduce.
    ("planned-frozen-as-trainable", "src/plan/plan_layout.cpp",
     "g.trainable = kind.requires_grad;",
     "g.trainable = true;",
     [(2, "Planner.PredictedPeakAndBytesMatchTheRunOnEveryRank")]),
    ("scaler-unscale-skipped", "src/optim/grad_scaler.cpp",
     "at::_amp_foreach_non_finite_check_and_unscale_(same, found_inf, at::full({1}, 1.0 / scale_, options));",
     "at::_amp_foreach_non_finite_check_and_unscale_(same, found_inf, at::full({1}, 1.0, options));",
     [(2, "Strategy.EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm"),
      (2, "MixedPrecision.*:GradScaler.*")]),
    ("scaler-overflow-not-agreed", "src/optim/grad_scaler.cpp",
     "if (group_) all_reduce_sum(*group_, overflowed);",
     "(void)group_;",
     [(2, "GradScaler.*")]),
    # Not engine lines to catch but evidence: the training-level tests alone, under mutations the
    # gradient test catches. AdamW ignores a constant gradient scale, so these are expected to
    # survive; that is why Strategy.EveryStrategyAndReduceDtype... exists.
    ("pre-division-removed/training-tests-only", "src/core/unit_comm.cpp",
     "if (plan.pre != 1.0) full_grad.div_(plan.pre);",
     "(void)plan.pre;",
     [(2, "MixedPrecision.*:Strategy.EveryStrategyInBf16MatchesTheBf16Reference")]),
    ("scaler-unscale-skipped/training-tests-only", "src/optim/grad_scaler.cpp",
     "at::_amp_foreach_non_finite_check_and_unscale_(same, found_inf, at::full({1}, 1.0 / scale_, options));",
     "at::_amp_foreach_non_finite_check_and_unscale_(same, found_inf, at::full({1}, 1.0, options));",
     [(2, "MixedPrecision.*")]),
    # The element bound of the bf16 training tests against a wrong reduction (NO_SHARD at W=2:
    # each rank steps on its own half of the batch).
    ("replica-reduction-removed/bf16-training", "src/core/unit_comm.cpp",
     "if (replicas) replicas->all_reduce_sum(reduced);",
     "(void)replicas;",
     [(2, "Strategy.EveryStrategyInBf16MatchesTheBf16Reference")]),
    ("sync-module-states-broadcast-removed", "src/core/shard_pipeline.cpp",
     "if (options.sync_module_states()) broadcast_from_rank0(tensors_of(plan.params), state.world());",
     "(void)options;",
     [(2, "DeferredInit.*")]),
    # StepInBackward: a unit whose reduction does not report it is stepped by step() instead; the
    # bitwise-equality test cannot see that, the test of when the steps happen can.
    # [Note: gradient shards live as long as the gradients]: never dropped (the memory test), and
    # dropped between no_sync backwards (the sum kept in the shard is lost).
    ("gradient-shards-kept", "src/core/param_group.cpp",
     "release_cleared_gradients();",
     "(void)0;",
     [(2, "Accounting.GradientShardsAreFreedWhenTheOptimizerClearsTheGradients")]),
    ("gradient-shards-dropped-under-no-sync", "src/core/param_group.cpp",
     "if (!g.full_grad_kept) g.flat.release_cleared_grad_shard();  // [Note: gradient shards live as long as the gradients]",
     "g.flat.release_cleared_grad_shard();",
     [(1, "Accounting.GradientsKeptAcrossNoSyncBackwardsAddUp"),
      (2, "Accounting.GradientsKeptAcrossNoSyncBackwardsAddUp")]),
    ("gradients-reduced-not-reported", "src/core/param_group.cpp",
     "events_.gradients_reduced(*this, g.flat, g.reduce_scatter);",
     "(void)g.reduce_scatter;",
     [(2, "StepInBackward.*")]),
    # The fused optimizers' loss scale: the scaler no longer unscales for them, so a kernel that
    # is not handed the scale steps on scaled gradients (AdamW nearly ignores a constant scale;
    # the bitwise comparison with unscaling first does not).
    ("fused-kernel-scale-dropped", "src/optim/adamw_update.cpp",
     "/*maximize=*/false, fused::grad_scale(scale, batch.params.front()));",
     "/*maximize=*/false);",
     [(2, "GradScaler.*")]),
    # The read-only overflow check of the fused path: an inf on one rank's shard not seen.
    ("fused-path-overflow-unseen", "src/optim/grad_scaler.cpp",
     "return at::stack(norms).sum().isfinite().logical_not().to(at::kFloat).reshape({1});",
     "return at::zeros({1}, grads.front().options().dtype(at::kFloat));",
     [(2, "GradScaler.*")]),
    # The planner against real runs: activations counted for one sequence whatever the batch.
    ("plan-activations-not-per-batch", "src/plan/planned_step.cpp",
     "t().now().activations += batch_ * (checkpointing_ ? a.checkpointed : a.saved);",
     "t().now().activations += (checkpointing_ ? a.checkpointed : a.saved);",
     [(2, "Planner.*")]),
    # The planner's promise to --auto (docs/planner.md "Gradient accumulation and --auto's margin").
    ("micro-batches-unplanned", "src/plan/plan_memory.cpp",
     "if (n == 1) return {MicroBatch{}};",
     "if (true) return {MicroBatch{}};",
     [(2, "Planner.PredictedPeakAndBytesMatchTheRunOnEveryRank")]),
    ("auto-margin-ignored", "src/plan/plan_search.cpp",
     "const double accepted_peak = (1 - space.peak_margin) * max_memory_bytes;",
     "const double accepted_peak = max_memory_bytes;",
     [(2, "Planner.AutoTrainsUnderItsCapWhenTheCapIsJustAboveTheChosenPlan")]),
    ("auto-overshoot-unchecked", "examples/gpt/gpt_plan.cpp",
     "TORCH_CHECK(measured_peak <= cap, \"--auto: rank \", peak_rank, \"'s measured peak \", measured_peak / 1048576.0,",
     "TORCH_CHECK(true, \"--auto: rank \", peak_rank, \"'s measured peak \", measured_peak / 1048576.0,",
     [(2, "Planner.AnAutoRunAboveItsCapFailsOnEveryRank")]),
    # Issue 34: the same start on every rank, and `unit->forward(x)` through the unit.
    ("initial-values-check-skipped", "src/core/shard_pipeline.cpp",
     "if (!options.sync_module_states()) check_same_initial_values(state.world(), unsharded_params(plans));",
     "(void)unsharded_params;",
     [(2, "InitialValues.*")]),
    # Issue 49 item 8: the same start compared bitwise (a hash of each parameter's bytes).
    ("initial-values-hash-not-compared", "src/core/model_check.cpp",
     "if (rows[r * n + i] != rows[i]) differing << (differing.tellp() > 0 ? \", \" : \"\") << \"rank \" << r;",
     "if (false) differing << (differing.tellp() > 0 ? \", \" : \"\") << \"rank \" << r;",
     [(2, "InitialValues.*")]),
    ("unit-arrow-skips-the-unit", "include/fsdp/fully_shard.h",
     "return static_cast<detail::UnitMembers<Unit>*>(M::operator->());",
     "return M::operator->();",
     [(2, "UnitForward.*")]),
    ("unit-call-skips-the-unit", "include/fsdp/fully_shard.h",
     "return run(CallMethod<Method>{method}, std::forward<Args>(args)...);",
     "return CallMethod<Method>{method}(*this->ptr(), std::forward<Args>(args)...);",
     [(2, "PortingApi.AnotherMethodRunsThroughItsUnitAndItsGradientIsReduced")]),
    ("second-holder-replaces-the-unit", "src/core/fully_shard.cpp",
     "if (auto it = registry().slots.find(module); it != registry().slots.end()) return it->second.lock();",
     "(void)module;",
     [(2, "PortingApi.TwoHoldersOfOneModuleAreOneUnit")]),
    ("summoned-units-still-collective", "src/core/fully_shard.cpp",
     "bool holds_full_params(const UnitSlot& slot) { return slot.model->full_params_held(); }",
     "bool holds_full_params(const UnitSlot& slot) { return false && slot.model->full_params_held(); }",
     [(2, "PortingApi.SummonFullParamsLetsOneRankEvaluateTheWholeModelAlone")]),
    ("summon-writeback-skipped", "src/io/summon_full_params.cpp",
     "if (writeback) {",
     "if (false) {",
     [(2, "PortingApi.EditsInsideSummonFullParamsAreWrittenBackAndTrainingGoesOn")]),
    ("summon-shards-not-restored", "src/io/summon_full_params.cpp",
     "for (auto& p : held.params) point_at(p.piece.param(), p.before);",
     "(void)point_at;",
     [(2, "PortingApi.SummonFullParamsLetsOneRankEvaluateTheWholeModelAlone"),
      (2, "PortingApi.EditsInsideSummonFullParamsAreWrittenBackAndTrainingGoesOn")]),
    ("evaluation-forward-keeps-units-unsharded", "src/core/step_conductor.cpp",
     "unit.end_forward(/*reshard=*/!will_backward || !training || !keeps_for_backward);",
     "unit.end_forward(/*reshard=*/!will_backward || !keeps_for_backward);",
     [(2, "PortingApi.AStepAfterAnEvaluationForwardUnderGradModeStepsTheShards")]),
    ("summon-without-resharding", "src/io/summon_full_params.cpp",
     "TORCH_CHECK(buffer.reshard_unless_in_backward(), \"SummonFullParams: unit '\",",
     "TORCH_CHECK(true, \"SummonFullParams: unit '\",",
     [(2, "PortingApi.SummonFullParamsAfterAForwardWithoutItsBackwardKeepsEditsAndTheStep")]),
    # Issue 34: public LibTorch programs ported (tests/port_programs_test.cpp).
    ("ports/fp32-divides-by-w-minus-1", "src/core/unit_comm.cpp",
     "if (c10::elementSize(dtype) >= 4) return {1.0, static_cast<double>(w)};",
     "if (c10::elementSize(dtype) >= 4) return {1.0, static_cast<double>(w > 1 ? w - 1 : 1)};",
     [(3, "PortPrograms.*")]),
    ("ports/checkpoint-buffers-left-out", "src/io/checkpoint_save.cpp",
     "meta.buffers = buffers;",
     "(void)buffers;",
     [(2, "PortPrograms.*")]),
    ("ports/second-backward-overwrites-the-gradient", "src/core/param_group.cpp",
     "if (!g.full_grad_kept) g.accumulate_into_shard = g.flat.has_sharded_grads();",
     "if (!g.full_grad_kept) g.accumulate_into_shard = false;",
     [(2, "PortPrograms.Dcgan*")]),
    ("ports/adam-exp-avg-sq-restored-as-zeros", "src/io/optimizer_state.cpp",
     's->exp_avg_sq(kind_or_undefined(saved, "exp_avg_sq"));',
     's->exp_avg_sq(at::zeros_like(kind_or_undefined(saved, "exp_avg_sq")));',
     [(2, "PortPrograms.TwoLayerLstm*")]),
    ("ports/initial-values-check-skipped", "src/core/shard_pipeline.cpp",
     "if (!options.sync_module_states()) check_same_initial_values(state.world(), unsharded_params(plans));",
     "(void)unsharded_params;",
     [(2, "PortPrograms.DistMnist*")]),
    ("ports/full-state-dict-buffers-rank-local", "src/io/state_dict.cpp",
     "broadcast(model.world(), value, /*root=*/0);",
     "(void)0;",
     [(2, "PortPrograms.*")]),
    ("ports/no-reshard-before-a-checkpoint", "src/io/checkpoint_pieces.cpp",
     "buffer.reshard_unless_in_backward();  // [Note: resharding between steps]",
     "(void)buffer;",
     [(2, "PortPrograms.Mnist*"), (2, "PortPrograms.ACheckpoint*")]),
    ("ports/no-reshard-before-load-full-params", "src/io/state_dict.cpp",
     "TORCH_CHECK(buffer.reshard_unless_in_backward(), \"load_full_params: unit '\", buffer.unit_name(),",
     "TORCH_CHECK(true, \"load_full_params: unit '\", buffer.unit_name(),",
     [(2, "PortPrograms.AFull*")]),
    ("ports/sync-module-states-broadcast-removed", "src/core/shard_pipeline.cpp",
     "if (options.sync_module_states()) broadcast_from_rank0(tensors_of(plan.params), state.world());",
     "(void)0;",
     [(2, "PortPrograms.DistMnist*")]),
    # Issue 49: users' programs (tests/users_programs_test.cpp).
    ("rebound-parameters-not-taken-in", "src/core/fsdp_state.cpp",
     "for (auto& each : units_) each->take_in_rebound_params();  // [Note: a parameter rebound from outside]",
     "(void)0;",
     [(2, "UsersPrograms.APpoAgentInASharedPtrTrainsAsItsUnshardedProgramThroughSaveAndLoad"),
      (2, "UsersPrograms.LoadingASavedShardIsRefusedByName")]),
    ("rebound-piece-copied-at-offset-0", "src/core/flat_param.cpp",
     "e.in_shard(shard_).copy_(local_piece(e, value));",
     "e.in_shard(shard_).copy_(value.reshape({-1}).narrow(0, 0, e.shard_end - e.shard_begin));",
     [(2, "UsersPrograms.APpoAgentInASharedPtrTrainsAsItsUnshardedProgramThroughSaveAndLoad")]),
    ("summon-writes-back-the-gathered-value", "src/io/summon_full_params.cpp",
     "for (auto& p : held.params) values.push_back(value_at_exit(p));",
     "for (auto& p : held.params) values.push_back(p.whole);",
     [(2, "UsersPrograms.ParametersReboundInsideSummonFullParamsAreKept")]),
    ("kept-unit-not-parked", "src/core/param_group.cpp",
     "for (FlatGroup& g : flats_) park(g);",
     "(void)0;",
     [(2, "PortPrograms.AStepAfterATrainingForwardWithoutBackwardStepsTheShards")]),
    ("parked-unit-not-regathered", "src/core/param_group.cpp",
     "if (g.params_parked && g.backward_state == BackwardState::Idle) reshard(g);",
     "(void)0;",
     [(2, "UsersPrograms.APpoAgentInASharedPtrTrainsAsItsUnshardedProgramThroughSaveAndLoad")]),
    ("root-skip-not-refused", "src/core/fsdp_state.cpp",
     "if (conductor_.root_forward_running()) return;",
     "return;",
     [(2, "UsersPrograms.AVaeWithStructOutputsAndNoiseInForwardTrainsAsItsUnshardedProgram")]),
    ("struct-output-not-hooked", "include/fsdp/output_tensors.h",
     "visit_members(value, recurse);",
     "(void)value;",
     [(2, "UsersPrograms.AVaeWithStructOutputsAndNoiseInForwardTrainsAsItsUnshardedProgram")]),
    ("clip-list-norm-local-only", "src/optim/clip.cpp",
     "model.all_reduce_over_shard_group(sum);",
     "(void)model;",
     [(2, "UsersPrograms.APpoAgentInASharedPtrTrainsAsItsUnshardedProgramThroughSaveAndLoad")]),
]


def sh(cmd, cwd, timeout):
    start = time.time()
    try:
        p = subprocess.run(cmd, cwd=cwd, shell=True, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, FSDP_TIMEOUT_SECONDS="60", OMP_NUM_THREADS="1",
                                                GTEST_COLOR="no"))  # fsdprun gives ranks a terminal
        return p.returncode, p.stdout + p.stderr, time.time() - start
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out, time.time() - start


def run_one(tree, mid, path, original, mutated, tests, jobs, timeout):
    full = os.path.join(tree, path)
    text = open(full).read()
    lines = text.split("\n")
    hits = [i for i, l in enumerate(lines) if l.strip() == original]
    if len(hits) != 1:
        return f"not applied: the original line occurs {len(hits)} times in {path}"
    i = hits[0]
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    lines[i] = indent + mutated
    open(full, "w").write("\n".join(lines))
    try:
        rc, out, secs = sh(f"cmake --build build -j{jobs} --target {' '.join(BINARIES)}", tree, 1800)
        if rc != 0:
            return "red: does not compile\n" + out[-2000:]
        for (world, filt), binary in ((t, b) for t in tests for b in BINARIES):
            rc, out, secs = sh(f"build/bin/fsdprun --nproc-per-node {world} build/bin/{binary} "
                               f"--gtest_filter='{filt}'", tree, timeout)
            if LOGS:
                with open(os.path.join(LOGS, mid.replace("/", "_") + f"-{binary}-w{world}.log"), "w") as f:
                    f.write(out)
            failed = sorted(set(re.findall(r"\[  FAILED  \] (\w+\.\w+)", out)))
            sys.stderr.write(f"  {mid}: W={world} {filt}: rc {rc} in {secs:.0f}s {failed}\n")
            if rc != 0:
                what = ", ".join(failed) if failed else ("timeout" if rc == 124 else f"crash/exit {rc}")
                return f"red: {what} (W={world})"
        return "survived"
    finally:
        subprocess.run(["git", "checkout", "--", path], cwd=tree, check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--only", default="")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--out", default="")
    ap.add_argument("--logs", default="")
    a = ap.parse_args()
    global LOGS
    LOGS = a.logs
    if LOGS:
        os.makedirs(LOGS, exist_ok=True)
    only = set(filter(None, a.only.split(",")))
    rows = []
    for mid, path, original, mutated, tests in MUTATIONS:
        if only and mid not in only:
            continue
        sys.stderr.write(f"{mid}: {path}: {original}\n")
        result = run_one(a.tree, mid, path, original, mutated, tests, a.jobs, a.timeout)
        rows.append((mid, path, original, result.split("\n")[0]))
        sys.stderr.write(f"  -> {result.splitlines()[0]}\n")
        if a.out:
            write(a.out, rows)
    write(a.out, rows) if a.out else None
    for r in rows:
        print(" | ".join(r))


def write(out, rows):
    with open(out, "w") as f:
        f.write("| mutation | file | original line | result |\n|---|---|---|---|\n")
        for mid, path, original, result in rows:
            f.write(f"| {mid} | {path} | `{original}` | {result} |\n")


if __name__ == "__main__":
    main()
