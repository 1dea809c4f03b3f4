#include "trainer.h"

#include "checkpointing.h"
#include "data.h"
#include "hf_folder.h"
#include "options.h"
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
#include <limits>
#include <optional>
#include <string>
#include <torch/cuda.h>
#include <vector>

namespace gpt {

namespace {

// The names --freeze patterns match, from the same architecture at the smallest width.
std::vector<std::string> freezable_names(const TrainOptions& o) {
  GPTConfig tiny = o.model;
  tiny.dim = 2 * tiny.heads;  // a head of 2 channels: Llama's rotary pairs need an even size
  tiny.head_dim = 0;
  tiny.ffn_dim = 1;
  tiny.vocab_size = 2;
  tiny.max_seq = 2;
  tiny.positions = 0;
  std::vector<std::string> names;
  for (const auto& item : GPT(tiny)->named_parameters()) {
    std::string name = item.key();
    if (o.deferred_init && name.rfind("h.", 0) == 0) name = name.substr(name.find('.', 2) + 1);
    names.push_back(name);
  }
  return names;
}

}  // namespace

bool is_frozen(const TrainOptions& o, const std::string& name) {
  for (const auto& pattern : o.freeze) {
    if (name.find(pattern) != std::string::npos) return true;
  }
  return false;
}

void check_freeze_patterns(const TrainOptions& o) {
  if (o.freeze.empty()) return;
  const std::vector<std::string> names = freezable_names(o);
  for (const auto& pattern : o.freeze) {
    const bool matches = std::any_of(names.begin(), names.end(), [&](const std::string& name) {
      return name.find(pattern) != std::string::npos;
    });
    TORCH_CHECK(matches, "--freeze '", pattern, "' matches no parameter name",
                o.deferred_init ? " (with --deferred-init, names are relative to a block, e.g. "
                                  "'attn.c_attn', or the root's 'wpe')"
                                : " (e.g. 'wpe', 'h.0.attn', 'ln_f')");
  }
  // Else autograd's "element 0 of tensors does not require grad" at the first backward.
  const bool trains = std::any_of(names.begin(), names.end(), [&](const std::string& n) { return !is_frozen(o, n); });
  std::string given;
  for (const auto& pattern : o.freeze) given += " --freeze '" + pattern + "'";
  TORCH_CHECK(trains, given.substr(1), " freezes every parameter of the model: nothing would train; freeze "
              "fewer (e.g. 'h.0.' for one block, 'wte' for the embedding)");
}

namespace {

// Under --tp, hybrid sharding shards over the data-parallel ranks (world / tp), not the world: the
// library's check would name the dp group's size as "the world size".
void check_shard_group_under_tp(const TrainOptions& o, int world) {
  const int f = o.fsdp.shard_group_size(), dp = world / o.tp;
  if (f == 0 || !fsdp::is_hybrid(o.fsdp.strategy())) return;
  const std::string sizes = "the data-parallel size " + std::to_string(dp) + " (" + std::to_string(world) +
                            " ranks / --tp " + std::to_string(o.tp) + ")";
  TORCH_CHECK(dp % f == 0, "--shard-group-size ", f, " does not divide ", sizes, ": under --tp, hybrid "
              "sharding splits the data-parallel ranks into groups of F; pick F among the divisors of ", dp);
  TORCH_CHECK(dp / f >= 2, "--shard-group-size ", f, " with ", sizes, " leaves a single replica group: "
              "hybrid needs at least 2; use --strategy full (or grad_op), a smaller --shard-group-size, "
              "or a smaller --tp");
}

}  // namespace

std::shared_ptr<fsdp::DeviceMesh> make_mesh(const TrainOptions& o, fsdp::Distributed* dist) {
  if (!dist || o.tp == 1) return nullptr;
  TORCH_CHECK(dist->world_size() % o.tp == 0, "--tp ", o.tp, " does not divide the ", dist->world_size(),
              " ranks; launch a multiple of --tp ranks");
  check_shard_group_under_tp(o, dist->world_size());
  return std::make_shared<fsdp::DeviceMesh>(
      dist->world, std::vector<fsdp::MeshDim>{{"dp", dist->world_size() / o.tp}, {"tp", o.tp}});
}

namespace {

// --tp --deferred-init: each block built whole, initialised, split over the tp ranks, and its
// part sharded over dp before the next is built; the root's layers last.
fsdp::Unit<GPT> build_tensor_parallel_deferred(const TrainOptions& o, fsdp::DeviceMesh& mesh) {
  auto tp = std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp"));
  auto model = fsdp::fully_shard_deferred(
      [&] {
        torch::manual_seed(o.seed);
        return GPT(o.model);
      },
      mesh.group("dp"), o.fsdp,
      [&](const std::string& name, torch::Tensor& p) {
        init_parameter(o.model, name, p);
        if (is_frozen(o, name)) p.set_requires_grad(false);
      },
      [&](torch::nn::Module& unit, bool is_root) {
        fsdp::tp::parallelize_module(unit, tp, is_root ? root_parallel_plan(o.model) : block_parallel_plan(o.model));
      });
  model->tp = tp;
  return model;
}

// --tp: every rank builds (and loads) the whole model alike, keeps its tensor-parallel part,
// then FSDP shards that over the data-parallel ranks.
fsdp::Unit<GPT> build_tensor_parallel(const TrainOptions& o, fsdp::DeviceMesh& mesh) {
  if (o.deferred_init) return build_tensor_parallel_deferred(o, mesh);
  check_tensor_parallel(o.model, mesh.size("tp"));
  GPT gpt = make_gpt(o.model, o.seed);
  fsdp::Unit<GPT> whole(gpt);
  load_initial_weights(o, whole);
  for (auto& item : gpt->named_parameters()) {
    if (is_frozen(o, item.key())) item.value().set_requires_grad(false);
  }
  parallelize_gpt(gpt, std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp")));
  return fsdp::fully_shard(gpt, mesh.group("dp"), o.fsdp);
}

}  // namespace

fsdp::Unit<GPT> build_model(const TrainOptions& o, fsdp::Distributed* dist, fsdp::DeviceMesh* mesh) {
  if (dist && mesh) return build_tensor_parallel(o, *mesh);
  if (dist && o.deferred_init) {
    return fsdp::fully_shard_deferred(
        [&] {
          torch::manual_seed(o.seed);
          return GPT(o.model);
        },
        *dist->world, o.fsdp, [&](const std::string& name, torch::Tensor& p) {
          init_parameter(o.model, name, p);
          if (is_frozen(o, name)) p.set_requires_grad(false);
        });
  }
  GPT gpt = make_gpt(o.model, o.seed);
  for (auto& item : gpt->named_parameters()) {
    if (is_frozen(o, item.key())) item.value().set_requires_grad(false);
  }
  if (dist) return fsdp::fully_shard(gpt, *dist->world, o.fsdp);  // moves it to fsdp.device()
  gpt->to(compute_device(o));
  return fsdp::Unit<GPT>(gpt);
}

void load_initial_weights(const TrainOptions& o, fsdp::Unit<GPT>& model) {
  if (!o.init_from.empty()) {
    fsdp::load_full_params(model, fsdp::load_tensor_dict(o.init_from), o.init_from);
  }
  if (!o.init_from_hf.empty()) load_hf(model, o.init_from_hf);
}

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

void print_setup_memory(const nlohmann::json& setup) {
  std::printf("set-up (--init-from-hf): peak %s per rank (build %s, load %s), bound %s (sharded "
              "model %s + largest parameter %s)\n",
              mib(setup["setup_peak_bytes"].get<int64_t>()).c_str(),
              mib(setup["build_peak_bytes"].get<int64_t>()).c_str(),
              mib(setup["load_peak_bytes"].get<int64_t>()).c_str(),
              mib(setup["setup_bound_bytes"].get<int64_t>()).c_str(),
              mib(setup["sharded_model_bytes"].get<int64_t>()).c_str(),
              mib(setup["largest_param_bytes"].get<int64_t>()).c_str());
  std::fflush(stdout);
}

namespace {

nlohmann::json to_json(const StepRecord& r) {
  return {{"step", r.step},
          {"loss", r.loss},
          {"step_ms", r.step_ms},
          {"tokens_per_s", r.tokens_per_s},
          {"mem_current_bytes", r.memory.current_bytes},
          {"mem_peak_bytes", r.memory.peak_bytes},
          {"mem_reserved_bytes", r.memory.reserved_bytes},
          {"bytes_all_gather", r.comm.all_gather_bytes},
          {"bytes_reduce_scatter", r.comm.reduce_scatter_bytes},
          {"bytes_all_reduce", r.comm.all_reduce_bytes},
          {"bytes_all_to_all", r.comm.all_to_all_bytes},  // Muon's exchanges
          {"bytes_tp_all_gather", r.comm.tp_all_gather_bytes},  // tensor parallelism's (--tp)
          {"bytes_tp_reduce_scatter", r.comm.tp_reduce_scatter_bytes},
          {"bytes_tp_all_reduce", r.comm.tp_all_reduce_bytes},
          {"loss_scale", r.loss_scale},
          {"skipped", r.skipped}};
}

// The optimizer's share of the step; with Muon, this rank's Newton-Schulz work (bench/ compares
// the ranks' shares of the orthogonalization).
void add_optimizer_work(nlohmann::json& line, const StepRecord& r) {
  line["optimizer_ms"] = r.optimizer_ms;
  if (r.grad_norm) line["grad_norm"] = *r.grad_norm;
  if (!r.muon) return;
  line["muon_ns_matrices"] = r.muon->matrices;
  line["muon_ns_flops"] = r.muon->flops;
}

// Rank 0 prints one line with every rank's memory (a small all-reduce gathers it).
void print_progress(const StepRecord& r, int64_t steps, fsdp::Distributed* dist) {
  const int world = dist ? dist->world_size() : 1;
  auto memory = torch::zeros({world, 2}, torch::kFloat64);
  memory[dist ? dist->rank() : 0][0] = static_cast<double>(r.memory.current_bytes);
  memory[dist ? dist->rank() : 0][1] = static_cast<double>(r.memory.peak_bytes);
  if (dist) fsdp::all_reduce_sum(*dist->world, memory);
  if (dist && dist->rank() != 0) return;
  std::printf("step %5lld/%lld | loss %.4f | %8.0f tok/s | %6.1f ms/step | mem", (long long)r.step + 1,
              (long long)steps, r.loss, r.tokens_per_s, r.step_ms);
  for (int i = 0; i < world; ++i) {
    std::printf(" r%d %s (peak %s)", i, mib(memory[i][0].item<int64_t>()).c_str(),
                mib(memory[i][1].item<int64_t>()).c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

StepLog::StepLog(const TrainOptions& o, fsdp::Distributed* dist, int rank)
    : options_(o), dist_(dist) {
  if (o.metrics_path.empty()) return;
  metrics_path_ = for_rank(o.metrics_path, rank);
  metrics_.open(metrics_path_);
  TORCH_CHECK(metrics_, "--metrics: cannot write ", metrics_path_);
}

void StepLog::write_setup(const nlohmann::json& setup) { write_line(setup); }

void StepLog::write(const StepRecord& record) {
  nlohmann::json line = to_json(record);
  add_optimizer_work(line, record);
  write_line(line);
  const int64_t done = record.step + 1;
  if (options_.log_every > 0 && (done % options_.log_every == 0 || done == options_.steps)) {
    print_progress(record, options_.steps, dist_);
  }
}

void StepLog::write_line(const nlohmann::json& line) {
  if (!metrics_.is_open()) return;
  errno = 0;
  metrics_ << line.dump() << "\n" << std::flush;
  // A full disk or an I/O error fails the flush: the line (and the run's record) would be lost.
  TORCH_CHECK(metrics_.good(), output_failed("--metrics", metrics_path_,
                                             errno ? std::strerror(errno) : "the write failed"));
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

namespace {

using Clock = std::chrono::steady_clock;

fsdp::CommStats minus(const fsdp::CommStats& a, const fsdp::CommStats& b) {
  return {a.all_gather_bytes - b.all_gather_bytes, a.reduce_scatter_bytes - b.reduce_scatter_bytes,
          a.all_reduce_bytes - b.all_reduce_bytes, a.broadcast_bytes - b.broadcast_bytes,
          a.all_to_all_bytes - b.all_to_all_bytes, a.tp_all_gather_bytes - b.tp_all_gather_bytes,
          a.tp_reduce_scatter_bytes - b.tp_reduce_scatter_bytes,
          a.tp_all_reduce_bytes - b.tp_all_reduce_bytes};
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
  record.comm = minus(fsdp::comm_stats(), comm_before);
  record.loss_scale = ctx.precision.loss_scale();
  record.skipped = trained.skipped;
  record.optimizer_ms = trained.optimizer_ms;
  record.grad_norm = trained.grad_norm;
  if (ctx.optimizers.muon) record.muon = ctx.optimizers.muon->last_step_work();
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

}  // namespace

void run_steps(const StepContext& ctx, int64_t first_step, StepLog& log, StepSummary& summary,
               std::vector<StepRecord>& records) {
  const TrainOptions& o = ctx.options;
  NonFiniteGuard nonfinite(o);
  const int64_t traced_step = std::min<int64_t>(first_step + 2, o.steps - 1);  // after warm-up
  for (int64_t step = first_step; step < o.steps; ++step) {
    const StepRecord record = measured_step(ctx, step, !o.trace.empty() && step == traced_step);
    summary.add(record);
    if (o.keep_step_records) records.push_back(record);
    log.write(record);
    nonfinite.count(record.loss, step);
    if (checkpoint_due(o, step)) save_checkpoint_if_finite(ctx, step, record.loss);
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

}  // namespace

TrainResult train(const TrainOptions& o, fsdp::Distributed* dist) {
  const int world = dist ? dist->world_size() / o.tp : o.reference_world_size;
  const int rank = dist ? dist->rank() : 0;
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
  const int64_t first_step =
      o.resume ? resume_from_checkpoint(model, optimizers, o.checkpoint_dir, o, rank) : 0;
  StepPrecision precision(o, dist, model.module());
  const StepContext ctx{o, corpus, model, optimizers, precision, dist, world, rank, rank / o.tp, device};
  std::optional<EvalResult> eval_initial;
  if (eval_batch) eval_initial = evaluate(model, *eval_batch, device);

  TrainResult result;
  run_steps(ctx, first_step, log, result.summary, result.steps);
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
