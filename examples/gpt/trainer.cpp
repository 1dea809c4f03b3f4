#include "trainer.h"

#include "checkpointing.h"
#include "data.h"
#include "hf_folder.h"
#include "options.h"
#include "pipeline_run.h"
#include "replica_state.h"
#include "step.h"
#include "tensor_parallel_plan.h"

#include <fsdp/memory.h>
#include <fsdp/param_loader.h>
#include <fsdp/state_dict.h>
#include <fsdp/tensor_file.h>
#include <fsdp/trace.h>

#include <algorithm>
#include <c10/core/DeviceGuard.h>
#include <c10/util/accumulate.h>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <csignal>
#include <limits>
#include <optional>
#include <string>
#include <torch/cuda.h>
#include <vector>
#include <thread>

namespace gpt {


namespace {

struct ModelBytes {
  int64_t sharded = 0;  // this rank's shards (the whole model when unsharded)
  int64_t root = 0;     // the root unit's unsharded parameters
  int64_t largest = 0;  // the largest parameter, unsharded, in fp32 (the masters' dtype)
};

ModelBytes model_bytes(fsdp::Unit<GPT>& model) {
  ModelBytes bytes;
  for (const auto& unit : model.units()) {
    bytes.sharded += unit.shard_bytes;
    for (const auto& flat : unit.flats) {
      if (unit.is_root) bytes.root += flat.numel * flat.element_size;
    }
  }
  if (!model.is_sharded()) {
    for (const auto& item : model->named_parameters()) bytes.sharded += item.value().nbytes();
  }
  for (const auto& [name, shape] : fsdp::param_shapes(model)) {
    bytes.largest = std::max<int64_t>(bytes.largest, c10::multiply_integers(shape) * 4);
  }
  return bytes;
}

}  // namespace

SetupMemory::SetupMemory(const c10::Device& device) : device_(device) {
  fsdp::reset_peak_memory(device_);
  before_bytes_ = fsdp::memory_stats(device_).current_bytes;
}

void SetupMemory::end_build() {
  build_peak_bytes_ = fsdp::memory_stats(device_).peak_bytes - before_bytes_;
  fsdp::reset_peak_memory(device_);
}

nlohmann::json SetupMemory::record(fsdp::Unit<GPT>& model) const {
  const ModelBytes bytes = model_bytes(model);
  const int64_t load_peak = fsdp::memory_stats(device_).peak_bytes - before_bytes_;
  return {{"setup", "init-from-hf"},
          {"build_peak_bytes", build_peak_bytes_},
          {"load_peak_bytes", load_peak},
          {"setup_peak_bytes", std::max(build_peak_bytes_, load_peak)},
          {"sharded_model_bytes", bytes.sharded},
          {"largest_param_bytes", bytes.largest},
          {"root_unit_bytes", bytes.root},
          {"setup_bound_bytes", bytes.sharded + bytes.largest}};
}

EvalBatch EvalBatch::load(const std::string& path, int64_t vocab_size, int64_t seq) {
  const auto tokens = read_token_file(path, "--eval-tokens", vocab_size, std::numeric_limits<int64_t>::max(),
                                      seq + 1).to(torch::kLong);
  const int64_t rows = tokens.numel() / (seq + 1);
  const auto table = tokens.narrow(0, 0, rows * (seq + 1)).view({rows, seq + 1});
  return {table.narrow(1, 0, seq).contiguous(), table.narrow(1, 1, seq).contiguous()};
}

EvalResult evaluate(fsdp::Unit<GPT>& model, const EvalBatch& batch, const c10::Device& device) {
  torch::NoGradGuard no_grad;
  auto logits = model(batch.inputs.to(device));
  EvalResult result;
  result.loss = lm_loss(logits, batch.targets.to(device)).item<double>();
  result.logits = logits.to(torch::kCPU, torch::kFloat);
  return result;
}

void write_eval(const std::string& path, const EvalBatch& batch, const EvalResult& initial,
                const EvalResult& final) {
  std::printf("eval loss: initial %.8f final %.8f\n", initial.loss, final.loss);
  std::fflush(stdout);
  if (path.empty()) return;
  fsdp::save_tensor_dict(path, {{"inputs", batch.inputs},
                                {"targets", batch.targets},
                                {"loss_initial", torch::tensor(initial.loss, torch::kDouble)},
                                {"logits_initial", initial.logits},
                                {"loss_final", torch::tensor(final.loss, torch::kDouble)},
                                {"logits_final", final.logits}});
}

std::string generate(fsdp::Unit<GPT>& model, const c10::Device& device, const std::string& prompt,
                     int64_t n, int64_t max_seq, uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  // Bytes, not chars (a signed char above 127 would be a negative token). An empty prompt starts
  // from a newline, which the sample does not show.
  std::vector<int64_t> tokens;
  for (unsigned char byte : prompt) tokens.push_back(byte);
  const size_t hidden = tokens.empty() ? 1 : 0;
  if (tokens.empty()) tokens.push_back('\n');
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - max_seq);
    auto context = torch::tensor(std::vector<int64_t>(tokens.begin() + start, tokens.end()),
                                 torch::kLong).unsqueeze(0).to(device);
    auto logits = model(context).select(1, -1).squeeze(0) / 0.8;
    tokens.push_back(torch::multinomial(torch::softmax(logits, -1), 1).item<int64_t>());
  }
  return std::string(tokens.begin() + hidden, tokens.end());
}

fsdp::CommStats comm_difference(const fsdp::CommStats& a, const fsdp::CommStats& b) {
  // Field by field: a positional list would put a field's difference into its neighbour's slot
  // (pp_send_bytes went to check_bytes).
  fsdp::CommStats d;
  d.all_gather_bytes = a.all_gather_bytes - b.all_gather_bytes;
  d.reduce_scatter_bytes = a.reduce_scatter_bytes - b.reduce_scatter_bytes;
  d.all_reduce_bytes = a.all_reduce_bytes - b.all_reduce_bytes;
  d.broadcast_bytes = a.broadcast_bytes - b.broadcast_bytes;
  d.all_to_all_bytes = a.all_to_all_bytes - b.all_to_all_bytes;
  d.tp_all_gather_bytes = a.tp_all_gather_bytes - b.tp_all_gather_bytes;
  d.tp_reduce_scatter_bytes = a.tp_reduce_scatter_bytes - b.tp_reduce_scatter_bytes;
  d.tp_all_reduce_bytes = a.tp_all_reduce_bytes - b.tp_all_reduce_bytes;
  d.check_bytes = a.check_bytes - b.check_bytes;
  d.pp_send_bytes = a.pp_send_bytes - b.pp_send_bytes;
  return d;
}

namespace {

using Clock = std::chrono::steady_clock;

// A GPU runs the work queued on it after the host has moved on: wait for it before reading the
// clock, so that a step's time is its compute's, not the time to queue it.
void wait_for(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// The mean over the global batch of the ranks' mean losses (the reference's is that already).
double global_loss(const StepContext& ctx, const torch::Tensor& rank_loss) {
  auto sum = rank_loss.detach().clone();
  if (!ctx.sharded()) return sum.item<double>();
  fsdp::all_reduce_sum(*ctx.dist->world, sum);  // --tp: the tp ranks' losses are one loss, alike
  return sum.item<double>() / ctx.dist->world_size();
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

  ctx.optimizers.set_learning_rates(o, step);
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
  record.comm = comm_difference(fsdp::comm_stats(), comm_before);
  record.loss_scale = ctx.precision.loss_scale();
  record.skipped = trained.skipped;
  record.optimizer_ms = trained.optimizer_ms;
  record.grad_norm = trained.grad_norm;
  if (ctx.optimizers.muon) record.muon = ctx.optimizers.muon->last_step_work();
  record.replicas = trained.replicas;
  return record;
}

// A checkpoint is due after `step`: saved only when the loss and the parameters are finite.
void save_checkpoint_if_finite(const StepContext& ctx, int64_t step, double loss) {
  GPT gpt = ctx.model.module();
  if (std::isfinite(loss) && parameters_finite(gpt, ctx.dist)) {
    const TrainOptions& o = ctx.options;
    save_checkpoint_if_due(ctx.model, ctx.optimizers, o.checkpoint_dir, o.save_every, step, o);
  } else if (ctx.rank == 0) {
    std::printf("step %lld: the loss or the parameters are not finite; not saving a checkpoint\n",
                static_cast<long long>(step + 1));
    std::fflush(stdout);
  }
}

// --test-kill-rank R... --test-kill-step S: the global ranks R die by SIGKILL as step S begins (in
// the job's first start only, so that their replacements, or the restarted job, train on).
void die_if_told(const StepContext& ctx, int64_t step) {
  const TrainOptions& o = ctx.options;
  const auto& ranks = o.test_kill_ranks;
  if (step != o.test_kill_step || std::find(ranks.begin(), ranks.end(), ctx.rank) == ranks.end()) return;
  if (ctx.replicas && ctx.replicas->layout().incarnation == 0 &&
      fsdp::LaunchEnv::from_environment().restart_count == 0) {
    std::raise(SIGKILL);
  }
}

// --fault-tolerant, after a step: replacements the step's quorum admitted receive the state.
void admit_replacements(const StepContext& ctx, int64_t step, StepLog& log) {
  if (!ctx.replicas->admitting()) return;
  const auto start = std::chrono::steady_clock::now();
  const int joined = ctx.replicas->admit_replacements(
      [&] { return replica_state(ctx.model, ctx.optimizers, step + 1); });
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  log.write_extra({{"replicas_joined", joined}, {"after_step", step}, {"transfer_ms", ms}});
}

}  // namespace

void run_steps(const StepContext& ctx, int64_t first_step, StepLog& log, StepSummary& summary,
               std::vector<StepRecord>& records) {
  const TrainOptions& o = ctx.options;
  NonFiniteGuard nonfinite(o);
  const int64_t traced_step = std::min<int64_t>(first_step + 2, o.steps - 1);  // after warm-up
  for (int64_t step = first_step; step < o.steps; ++step) {
    die_if_told(ctx, step);
    const StepRecord record = measured_step(ctx, step, !o.trace.empty() && step == traced_step);
    summary.add(record);
    if (o.keep_step_records) records.push_back(record);
    log.write(record);
    nonfinite.count(record.loss, step);
    // --fault-tolerant: the lowest live replica writes the checkpoints (all hold the same state).
    const bool saves = !ctx.replicas || ctx.replicas->leads();
    if (checkpoint_due(o, step) && saves) save_checkpoint_if_finite(ctx, step, record.loss);
    if (step == first_step && saves) reserve_async_staging(ctx.model, ctx.optimizers, o);
    if (ctx.replicas) admit_replacements(ctx, step, log);
    if (o.test_pause_per_step_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(o.test_pause_per_step_ms));
    }
  }
  GPT gpt = ctx.model.module();
  nonfinite.check_finished(gpt, ctx.dist);
}

namespace {

// Before any work. The command line checks --max-nonfinite-steps too; a test sets it directly.
void check_options(const TrainOptions& o) {
  TORCH_CHECK(o.max_nonfinite_steps >= 1, "--max-nonfinite-steps must be >= 1, got ",
              o.max_nonfinite_steps);
  check_freeze_patterns(o);
}

// Options the command line checks too, for callers that set them directly.
void check_step_options(const TrainOptions& o, fsdp::Distributed* dist) {
  TORCH_CHECK(o.grad_accum >= 1, "--grad-accum must be >= 1, got ", o.grad_accum);
  TORCH_CHECK(dist || (o.save_every == 0 && !o.resume),
              "checkpoints need the sharded run, not --reference");
}

Corpus load_corpus(const TrainOptions& o) {
  const int64_t min_size = o.model.max_seq + 2;
  return o.data_is_tokens ? Corpus::load_tokens(o.data, o.data_flag, o.model.vocab_size,
                                                o.max_data_bytes, min_size)
                          : Corpus::load(o.data, o.max_data_bytes, min_size);
}

std::optional<EvalBatch> load_eval_batch(const TrainOptions& o) {
  if (o.eval_tokens.empty()) return std::nullopt;
  return EvalBatch::load(o.eval_tokens, o.model.vocab_size, o.model.max_seq);
}

// What names no GPU index (the default CUDA stream and generator) is this rank's GPU's, and no
// rank opens a context on cuda:0 that it does not use.
std::optional<c10::Device> current_gpu(const c10::Device& device) {
  return device.is_cuda() ? std::optional(device) : std::nullopt;
}

// --fault-tolerant, a replacement: the state from a live replica; the step to continue from, or
// nullopt when the run finished before this replica could join.
std::optional<int64_t> join_replicas(fsdp::ReplicaQuorum& replicas, fsdp::Distributed& dist,
                                     fsdp::Unit<GPT>& model,
                                     TrainOptimizers& optimizers, const TrainOptions& o, int rank,
                                     StepLog& log) {
  if (o.test_kill_in_transfer_rank == rank && replicas.layout().incarnation == 1) {
    replicas.on_tensor_received([](size_t index) {
      if (index == 1) std::raise(SIGKILL);
    });
  }
  replicas.set_replica_check([&] {
    auto alive = torch::ones({1});
    fsdp::all_reduce_sum(*dist.world, alive);
  });
  const std::optional<std::string> bytes = replicas.join(replica_tensors(model));
  if (!bytes) return std::nullopt;
  const int64_t next_step = load_replica_bytes(*bytes, optimizers);
  log.write_extra({{"joined_at_step", next_step}, {"incarnation", replicas.layout().incarnation}});
  return next_step;
}

}  // namespace

TrainResult train(const TrainOptions& o, fsdp::Distributed* dist, fsdp::ReplicaQuorum* replicas) {
  if (o.pp > 0 && dist) return train_pipeline(o, *dist);
  // --fault-tolerant: the world is one replica; the batch rows and file names are the job's.
  const int world = replicas ? replicas->layout().replicas * replicas->layout().shard_group_size
                    : dist   ? dist->world_size() / o.tp
                             : o.reference_world_size;
  const int rank = replicas ? replicas->layout().global_rank() : dist ? dist->rank() : 0;
  const std::shared_ptr<fsdp::DeviceMesh> mesh = make_mesh(o, dist);
  const c10::Device device = compute_device(o);
  c10::OptionalDeviceGuard gpu_guard(current_gpu(device));
  fsdp::install_memory_counter();
  check_options(o);
  prepare_checkpoint_dir(o, rank);
  const Corpus corpus = load_corpus(o);
  const std::optional<EvalBatch> eval_batch = load_eval_batch(o);

  SetupMemory setup_memory(device);
  fsdp::Unit<GPT> model = build_model(o, dist, mesh.get());
  TrainOptimizers optimizers = make_train_optimizers(model.module(), o);
  setup_memory.end_build();
  if (!mesh) load_initial_weights(o, model);  // --tp: loaded before the split
  const nlohmann::json setup = setup_memory.record(model);
  if (!o.dump_batches.empty() && rank == 0) {
    write_output("--dump-batches", o.dump_batches, [&] { dump_batches(o, corpus, world); });
  }
  StepLog log(o, dist, rank);
  if (!o.init_from_hf.empty()) log.write_setup(setup);
  if (!o.init_from_hf.empty() && rank == 0) print_setup_memory(setup);

  check_step_options(o, dist);
  int64_t first_step = 0;
  if (replicas && replicas->joining()) {
    const std::optional<int64_t> joined = join_replicas(*replicas, *dist, model, optimizers, o, rank, log);
    if (!joined) return {};  // nothing left to train: the others finished
    first_step = *joined;
  } else if (o.resume) {
    first_step = resume_from_checkpoint(model, optimizers, o.checkpoint_dir, o, dist->rank());
  }
  StepPrecision precision(o, dist, model.module());
  const StepContext ctx{o, corpus, model, optimizers, precision, dist,
                        world, rank, rank / o.tp, device, replicas};
  std::optional<EvalResult> eval_initial;
  if (eval_batch) eval_initial = evaluate(model, *eval_batch, device);

  TrainResult result;
  run_steps(ctx, first_step, log, result.summary, result.steps);
  if (replicas) {
    replicas->finish();
    log.write_extra(state_hashes(model, optimizers));
  }
  for (const StepRecord& step : result.steps) result.losses.push_back(step.loss);
  if (!o.save_full.empty()) write_output("--save-full", o.save_full, [&] { save_full(o, model, dist); });
  if (o.gather_final_params || !o.export_hf.empty()) result.final_params = full_params(model, dist);
  if (eval_batch) {
    const EvalResult eval_final = evaluate(model, *eval_batch, device);
    if (rank == 0) {
      write_output("--eval-out", o.eval_out,
                   [&] { write_eval(o.eval_out, *eval_batch, *eval_initial, eval_final); });
    }
  }
  if (!o.export_hf.empty()) export_hf(o, result.final_params, dist);
  if (o.sample_bytes > 0) {
    result.sample = generate(model, device, o.sample_prompt, o.sample_bytes, o.model.max_seq, o.seed);
  }
  return result;
}

}  // namespace gpt
