#include "training_loop.h"

#include "checkpointing.h"
#include "learning_rate.h"
#include "nonfinite_guard.h"
#include "output_errors.h"
#include "run_paths.h"

#include <fsdp/trace.h>

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace gpt {

namespace {

using Clock = std::chrono::steady_clock;

fsdp::CommStats minus(const fsdp::CommStats& a, const fsdp::CommStats& b) {
  return {a.all_gather_bytes - b.all_gather_bytes, a.reduce_scatter_bytes - b.reduce_scatter_bytes,
          a.all_reduce_bytes - b.all_reduce_bytes, a.broadcast_bytes - b.broadcast_bytes};
}

// A GPU runs the work queued on it after the host has moved on: wait for it before reading the
// clock, so that a step's time is its compute's, not the time to queue it.
void wait_for(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// The mean over the global batch of the ranks' mean losses (the reference's is that already).
double global_loss(const StepContext& ctx, const torch::Tensor& rank_loss) {
  auto sum = rank_loss.detach().clone();
  if (!ctx.sharded()) return sum.item<double>();
  fsdp::all_reduce_sum(*ctx.dist->world, sum);
  return sum.item<double>() / ctx.world;
}

// Trains step `step` and measures it: the loss over the global batch, the time (and Chrome trace
// when `traced`), throughput, this rank's memory and collective bytes.
StepRecord measured_step(const StepContext& ctx, int64_t step, bool traced) {
  const TrainOptions& o = ctx.options;
  if (traced) fsdp::start_trace();
  fsdp::reset_peak_memory(ctx.device);
  const auto comm_before = fsdp::comm_stats();
  wait_for(ctx.device);  // the previous step's work is not this step's
  const auto start = Clock::now();

  set_learning_rate(ctx.optimizer, learning_rate(o, step));
  const StepResult trained = train_step(ctx, step);
  if (traced) {
    const std::string trace = for_rank(o.trace, ctx.rank);
    write_output("--trace", trace, [&] { fsdp::write_trace(trace, ctx.rank); });
  }

  StepRecord record;
  record.step = step;
  record.loss = global_loss(ctx, trained.loss);
  wait_for(ctx.device);
  record.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  const double global_tokens =
      static_cast<double>(o.grad_accum * ctx.world * o.batch * o.model.max_seq);
  record.tokens_per_s = global_tokens / (record.step_ms / 1000.0);
  record.memory = fsdp::memory_stats(ctx.device);
  record.comm = minus(fsdp::comm_stats(), comm_before);
  record.loss_scale = ctx.precision.loss_scale();
  record.skipped = trained.skipped;
  return record;
}

// A checkpoint is due after `step`: saved only when the loss and the parameters are finite.
void save_checkpoint_if_finite(const StepContext& ctx, int64_t step, double loss) {
  GPT gpt = ctx.model.module();
  if (std::isfinite(loss) && parameters_finite(gpt, ctx.dist)) {
    const TrainOptions& o = ctx.options;
    save_checkpoint_if_due(ctx.model, ctx.optimizer, o.checkpoint_dir, o.save_every, step, o);
  } else if (ctx.rank == 0) {
    std::printf("step %lld: the loss or the parameters are not finite; not saving a checkpoint\n",
                static_cast<long long>(step + 1));
    std::fflush(stdout);
  }
}

}  // namespace

std::vector<StepRecord> run_steps(const StepContext& ctx, int64_t first_step, StepLog& log) {
  const TrainOptions& o = ctx.options;
  std::vector<StepRecord> records;
  NonFiniteGuard nonfinite(o);
  const int64_t traced_step = std::min<int64_t>(first_step + 2, o.steps - 1);  // after warm-up
  for (int64_t step = first_step; step < o.steps; ++step) {
    const StepRecord record = measured_step(ctx, step, !o.trace.empty() && step == traced_step);
    records.push_back(record);
    log.write(record);
    nonfinite.count(record.loss, step);
    if (checkpoint_due(o, step)) save_checkpoint_if_finite(ctx, step, record.loss);
  }
  GPT gpt = ctx.model.module();
  nonfinite.check_finished(gpt, ctx.dist);
  return records;
}

}  // namespace gpt
