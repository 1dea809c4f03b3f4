#include "trainer.h"

#include "checkpointing.h"
#include "data.h"
#include "eval_batch.h"
#include "hf_gpt2.h"
#include "reference_precision.h"
#include "run_paths.h"

#include <fsdp/clip.h>
#include <fsdp/comm_stats.h>
#include <fsdp/grad_scaler.h>
#include <fsdp/memory.h>
#include <fsdp/state_dict.h>
#include <fsdp/trace.h>

#include <c10/core/DeviceGuard.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>

namespace gpt {

namespace {

using Clock = std::chrono::steady_clock;

struct StepRecord {
  int64_t step = 0;
  double loss = 0, step_ms = 0, tokens_per_s = 0;
  fsdp::MemoryStats memory;
  fsdp::CommStats comm;  // bytes of this step
  double loss_scale = 0;  // fp16: the gradient scaler's scale after the step (0: no scaler)
  bool skipped = false;   // fp16: the step was skipped because some rank's gradients overflowed
};

// What a step needs besides the model: where it computes, the optimizer, and the
// mixed-precision helpers.
struct StepContext {
  c10::Device device;
  torch::optim::Optimizer& optimizer;
  fsdp::ShardedGradScaler* scaler;          // fp16, sharded run
  ReferenceLossScaler* reference_scaler;    // fp16, reference run: its own code, not the library's
  ReferencePrecision* reference_precision;  // the reference run with a mixed-precision policy
};

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
          {"loss_scale", r.loss_scale},
          {"skipped", r.skipped}};
}

fsdp::CommStats minus(const fsdp::CommStats& a, const fsdp::CommStats& b) {
  return {a.all_gather_bytes - b.all_gather_bytes, a.reduce_scatter_bytes - b.reduce_scatter_bytes,
          a.all_reduce_bytes - b.all_reduce_bytes, a.broadcast_bytes - b.broadcast_bytes};
}

c10::Device compute_device(const TrainOptions& o) {
  return o.fsdp.device().value_or(c10::Device(c10::kCPU));
}

// A GPU runs the work queued on it after the host has moved on: wait for it before reading the
// clock, so that a step's time is its compute's, not the time to queue it.
void wait_for(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", bytes / 1048576.0);
  return text;
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

// Greedy-free sampling (temperature 0.8) from a fixed seed: every rank runs the same forwards,
// which the sharded model needs (each forward all-gathers on all ranks).
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

// Linear warm-up to the peak, then cosine decay to a tenth of it; constant without warm-up.
double learning_rate(const TrainOptions& o, int64_t step) {
  if (o.warmup_steps <= 0) return o.lr;
  if (step < o.warmup_steps) return o.lr * (step + 1) / o.warmup_steps;
  const double progress =
      double(step - o.warmup_steps) / double(std::max<int64_t>(1, o.steps - o.warmup_steps));
  return o.lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress))));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

// The global batches of the whole run, for a peer implementation to train on the same data:
// {"inputs": [steps, global_rows, seq], "targets": [steps, global_rows, seq]} as int64, where
// global_rows = grad_accum × world_size × batch (micro-batch m: rows [m·W·B, (m+1)·W·B)).
void dump_batches(const TrainOptions& o, const ByteCorpus& corpus, int world) {
  std::vector<torch::Tensor> inputs, targets;
  for (int64_t step = 0; step < o.steps; ++step) {
    auto [x, y] = corpus.batch(o.seed, step, 0, o.grad_accum * world * o.batch, o.model.max_seq);
    inputs.push_back(x);
    targets.push_back(y);
  }
  auto stacked = [&](const std::vector<torch::Tensor>& rows) {
    return rows.empty() ? torch::empty({0, o.grad_accum * world * o.batch, o.model.max_seq}, torch::kLong)
                        : torch::stack(rows);
  };
  fsdp::save_tensor_dict(o.dump_batches, {{"inputs", stacked(inputs)}, {"targets", stacked(targets)}});
}

// One optimizer step over o.grad_accum micro-batches; returns this rank's mean loss. Micro-batch m
// covers global rows [m·W·B, (m+1)·W·B): rank r trains on its B of them, the reference on all.
torch::Tensor train_step(const TrainOptions& o, fsdp::Unit<GPT>& model, GPT& gpt, StepContext& ctx,
                         const ByteCorpus& corpus, int64_t step, int world, int rank, bool sharded,
                         bool* skipped) {
  ctx.optimizer.zero_grad();
  auto loss_sum = torch::zeros({}, torch::TensorOptions().device(ctx.device));
  for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
    const int64_t first_row = micro * world * o.batch + (sharded ? rank * o.batch : 0);
    const int64_t rows = sharded ? o.batch : world * o.batch;
    auto [inputs, targets] = corpus.batch(o.seed, step, first_row, rows, o.model.max_seq);
    inputs = inputs.to(ctx.device, /*non_blocking=*/true);
    targets = targets.to(ctx.device, /*non_blocking=*/true);
    if (ctx.reference_precision) ctx.reference_precision->cast_parameters();
    auto loss = lm_loss(model(inputs), targets) / static_cast<double>(o.grad_accum);
    auto scaled = ctx.scaler ? ctx.scaler->scale(loss)
                  : ctx.reference_scaler ? ctx.reference_scaler->scale(loss) : loss;
    const bool last = micro + 1 == o.grad_accum;
    if (sharded && o.no_sync && !last) {
      fsdp::NoSyncGuard no_sync(model);  // keep unsharded gradients; reduce once, at the end
      scaled.backward();
    } else {
      scaled.backward();
    }
    if (ctx.reference_precision) ctx.reference_precision->restore_masters();
    loss_sum += loss.detach();
  }
  // Unscaled before clipping sees the gradients.
  if (ctx.scaler) ctx.scaler->unscale_(ctx.optimizer);
  if (ctx.reference_scaler) ctx.reference_scaler->unscale_(ctx.optimizer);
  if (o.clip > 0) {
    if (sharded) {
      fsdp::clip_grad_norm_(model, o.clip);
    } else {
      torch::nn::utils::clip_grad_norm_(gpt->parameters(), o.clip);
    }
  }
  *skipped = false;
  if (ctx.scaler) {
    *skipped = !ctx.scaler->step(ctx.optimizer);
    ctx.scaler->update();
  } else if (ctx.reference_scaler) {
    *skipped = !ctx.reference_scaler->step_update(ctx.optimizer);
  } else {
    ctx.optimizer.step();
  }
  return loss_sum;
}

// Whether every rank's parameters (its shards) are finite: a checkpoint of a NaN model is never
// written. One all-reduce of a count.
bool parameters_finite(GPT& gpt, fsdp::Distributed* dist) {
  torch::NoGradGuard no_grad;
  auto bad = torch::zeros({1}, torch::kFloat64);
  for (const auto& p : gpt->parameters()) {
    if (p.numel() > 0 && !torch::isfinite(p).all().item<bool>()) bad += 1;
  }
  if (dist) fsdp::all_reduce_sum(*dist->world, bad);
  return bad.item<double>() == 0;
}

bool frozen(const TrainOptions& o, const std::string& name) {
  for (const auto& pattern : o.freeze) {
    if (name.find(pattern) != std::string::npos) return true;
  }
  return false;
}

// Every --freeze pattern must match a parameter name (with --deferred-init, names relative to a
// block): a typo would otherwise train the whole model silently. The names come from the same
// architecture at the smallest width.
void check_freeze_patterns(const TrainOptions& o) {
  if (o.freeze.empty()) return;
  GPTConfig tiny = o.model;
  tiny.dim = tiny.heads;
  tiny.max_seq = 2;
  std::vector<std::string> names;
  for (const auto& item : GPT(tiny)->named_parameters()) {
    std::string name = item.key();
    if (o.deferred_init && name.rfind("h.", 0) == 0) name = name.substr(name.find('.', 2) + 1);
    names.push_back(name);
  }
  for (const auto& pattern : o.freeze) {
    const bool matches = std::any_of(names.begin(), names.end(), [&](const std::string& name) {
      return name.find(pattern) != std::string::npos;
    });
    TORCH_CHECK(matches, "--freeze '", pattern, "' matches no parameter name",
                o.deferred_init ? " (with --deferred-init, names are relative to a block, e.g. "
                                  "'attn.c_attn', or the root's 'wpe')"
                                : " (e.g. 'wpe', 'h.0.attn', 'ln_f')");
  }
}

// The GPT, sharded unless this is the reference. Deferred: built and sharded block by block,
// each block initialised (and frozen) by its own parameter names just before it is sharded.
fsdp::Unit<GPT> build_model(const TrainOptions& o, fsdp::Distributed* dist) {
  if (dist && o.deferred_init) {
    return fsdp::fully_shard_deferred(
        [&] {
          torch::manual_seed(o.seed);
          return GPT(o.model);
        },
        *dist->world, o.fsdp, [&](const std::string& name, torch::Tensor& p) {
          init_parameter(o.model, name, p);
          if (frozen(o, name)) p.set_requires_grad(false);
        });
  }
  GPT gpt = make_gpt(o.model, o.seed);
  for (auto& item : gpt->named_parameters()) {
    if (frozen(o, item.key())) item.value().set_requires_grad(false);
  }
  if (dist) return fsdp::fully_shard(gpt, *dist->world, o.fsdp);  // moves it to fsdp.device()
  gpt->to(compute_device(o));
  return fsdp::Unit<GPT>(gpt);
}

// Tensor memory of the set-up: building and sharding the model (deferred: block by block, then
// the root unit, whose own parameters exist whole until it is sharded), then loading its shards.
// Loading is bounded by the sharded model plus its largest parameter; building by the sharded
// model plus the root unit's parameters (fsdp::fully_shard_deferred's guarantee).
struct SetupMemory {
  int64_t before_bytes = 0;      // live before the model is built (the corpus, ...)
  int64_t build_peak_bytes = 0;  // above before_bytes
};

SetupMemory start_setup_memory(const c10::Device& device) {
  fsdp::reset_peak_memory(device);
  return {fsdp::memory_stats(device).current_bytes};
}

// After the build: its peak, and a fresh peak for the load.
void end_build_memory(const c10::Device& device, SetupMemory& memory) {
  memory.build_peak_bytes = fsdp::memory_stats(device).peak_bytes - memory.before_bytes;
  fsdp::reset_peak_memory(device);
}

nlohmann::json setup_memory_record(fsdp::Unit<GPT>& model, const c10::Device& device,
                                   const SetupMemory& memory) {
  int64_t sharded = 0, root = 0, largest = 0;
  for (const auto& unit : model.units()) {
    sharded += unit.shard_numel * unit.element_size;
    if (unit.is_root) root += unit.numel * unit.element_size;
  }
  if (!model.is_sharded()) {
    for (const auto& item : model->named_parameters()) sharded += item.value().nbytes();
  }
  for (const auto& [name, shape] : fsdp::param_shapes(model)) {
    int64_t numel = 1;
    for (int64_t size : shape) numel *= size;
    largest = std::max<int64_t>(largest, numel * 4);  // fp32 masters
  }
  const int64_t load_peak = fsdp::memory_stats(device).peak_bytes - memory.before_bytes;
  return {{"setup", "init-from-hf"},
          {"build_peak_bytes", memory.build_peak_bytes},
          {"load_peak_bytes", load_peak},
          {"setup_peak_bytes", std::max(memory.build_peak_bytes, load_peak)},
          {"sharded_model_bytes", sharded},
          {"largest_param_bytes", largest},
          {"root_unit_bytes", root},
          {"setup_bound_bytes", sharded + largest}};
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

// --export-hf: rank 0 writes the folder; every rank learns whether it could.
void export_hf(const TrainOptions& o, const fsdp::NamedTensors& full_params,
               fsdp::Distributed* dist) {
  std::string error;
  if (!dist || dist->rank() == 0) {
    try {
      const nlohmann::json base = o.init_from_hf.empty()
                                      ? nlohmann::json()
                                      : HfGpt2Config::read(o.init_from_hf).json;
      export_hf_gpt2(full_params, o.model, base, o.export_hf);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  auto failed = torch::full({1}, error.empty() ? 0.0f : 1.0f);
  if (dist) fsdp::all_reduce_sum(*dist->world, failed);
  TORCH_CHECK(failed.item<float>() == 0.0f, "--export-hf: rank 0 could not write ", o.export_hf,
              error.empty() ? "" : ": " + error);
}

}  // namespace

TrainResult train(const TrainOptions& o, fsdp::Distributed* dist) {
  const int world = dist ? dist->world_size() : o.reference_world_size;
  const int rank = dist ? dist->rank() : 0;
  const c10::Device device = compute_device(o);
  // What names no GPU index (the default CUDA stream and generator) is this rank's GPU's, and no
  // rank opens a context on cuda:0 that it does not use.
  c10::OptionalDeviceGuard current_gpu(device.is_cuda() ? std::optional(device) : std::nullopt);
  fsdp::install_memory_counter();
  TORCH_CHECK(o.max_nonfinite_steps >= 1, "--max-nonfinite-steps must be >= 1, got ",
              o.max_nonfinite_steps);
  check_freeze_patterns(o);
  prepare_checkpoint_dir(o, rank);
  const Corpus corpus =
      o.data_is_tokens
          ? Corpus::load_tokens(o.data, o.data_flag, o.model.vocab_size, o.max_data_bytes,
                                o.model.max_seq + 2)
          : Corpus::load(o.data, o.max_data_bytes, o.model.max_seq + 2);
  const std::optional<EvalBatch> eval_batch =
      o.eval_tokens.empty() ? std::nullopt
                            : std::optional(EvalBatch::load(o.eval_tokens, o.model.vocab_size,
                                                            o.model.max_seq));

  SetupMemory setup_memory = start_setup_memory(device);
  fsdp::Unit<GPT> model = build_model(o, dist);
  GPT gpt = model.module();
  auto optimizer = make_optimizer(gpt, o.lr, o.weight_decay, o.fused_optimizer);
  end_build_memory(device, setup_memory);
  if (!o.init_from.empty()) {
    fsdp::load_full_params(model, fsdp::load_tensor_dict(o.init_from), o.init_from);
  }
  if (!o.init_from_hf.empty()) load_hf_gpt2(model, o.init_from_hf);
  const nlohmann::json setup = setup_memory_record(model, device, setup_memory);
  if (!o.dump_batches.empty() && rank == 0) dump_batches(o, corpus, world);

  std::ofstream metrics;
  if (!o.metrics_path.empty()) {
    metrics.open(for_rank(o.metrics_path, rank));
    TORCH_CHECK(metrics, "--metrics: cannot write ", for_rank(o.metrics_path, rank));
    if (!o.init_from_hf.empty()) metrics << setup.dump() << "\n" << std::flush;
  }
  if (!o.init_from_hf.empty() && rank == 0) print_setup_memory(setup);
  TORCH_CHECK(o.grad_accum >= 1, "--grad-accum must be >= 1, got ", o.grad_accum);
  TORCH_CHECK(dist || (o.save_every == 0 && !o.resume),
              "checkpoints need the sharded run, not --reference");
  const int64_t first_step =
      o.resume ? resume_from_checkpoint(model, *optimizer, o.checkpoint_dir, o, rank) : 0;
  const double global_tokens =
      static_cast<double>(o.grad_accum * world * o.batch * o.model.max_seq);

  // fp16 needs loss scaling. The reference scales with its own code (torch.amp's rule written
  // again), so that a bug in the library's scaler cannot show on both sides.
  std::unique_ptr<fsdp::ShardedGradScaler> scaler;
  std::unique_ptr<ReferenceLossScaler> reference_scaler;
  if (o.fsdp.mixed_precision().param_dtype() == torch::kHalf) {
    if (dist) {
      scaler = std::make_unique<fsdp::ShardedGradScaler>(
          *dist->world, fsdp::GradScalerOptions().init_scale(o.loss_scale));
    } else {
      reference_scaler = std::make_unique<ReferenceLossScaler>(o.loss_scale);
    }
  }
  std::unique_ptr<ReferencePrecision> reference_precision;
  const auto& policy = o.fsdp.mixed_precision();
  if (!dist && (policy.param_dtype() || policy.reduce_dtype())) {
    reference_precision = std::make_unique<ReferencePrecision>(*gpt, policy);
  }
  StepContext ctx{device, *optimizer, scaler.get(), reference_scaler.get(), reference_precision.get()};

  std::optional<EvalResult> eval_initial;
  if (eval_batch) eval_initial = evaluate(model, *eval_batch, device);

  TrainResult result;
  int64_t nonfinite_steps = 0;  // consecutive steps whose loss was NaN or inf
  const int64_t traced_step = std::min<int64_t>(first_step + 2, o.steps - 1);  // after warm-up
  for (int64_t step = first_step; step < o.steps; ++step) {
    if (!o.trace.empty() && step == traced_step) fsdp::start_trace();
    fsdp::reset_peak_memory(device);
    const auto comm_before = fsdp::comm_stats();
    wait_for(device);  // the previous step's work is not this step's
    const auto start = Clock::now();

    set_learning_rate(*optimizer, learning_rate(o, step));
    bool skipped = false;
    auto loss = train_step(o, model, gpt, ctx, corpus, step, world, rank, dist != nullptr, &skipped);
    if (!o.trace.empty() && step == traced_step) fsdp::write_trace(for_rank(o.trace, rank), rank);

    auto global_loss = loss.detach().clone();
    if (dist) fsdp::all_reduce_sum(*dist->world, global_loss);
    StepRecord record;
    record.step = step;
    record.loss = global_loss.item<double>() / (dist ? world : 1);
    wait_for(device);
    record.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    record.tokens_per_s = global_tokens / (record.step_ms / 1000.0);
    record.memory = fsdp::memory_stats(device);
    record.comm = minus(fsdp::comm_stats(), comm_before);
    record.loss_scale = scaler             ? scaler->get_scale()
                        : reference_scaler ? reference_scaler->current_scale()
                                           : 0;
    record.skipped = skipped;
    result.losses.push_back(record.loss);
    if (metrics.is_open()) metrics << to_json(record).dump() << "\n" << std::flush;
    if (o.log_every > 0 && ((step + 1) % o.log_every == 0 || step + 1 == o.steps)) {
      print_progress(record, o.steps, dist);
    }
    // A NaN/inf loss: stop after o.max_nonfinite_steps in a row (the ranks agree: the loss is
    // all-reduced), and never checkpoint a model whose parameters are not finite.
    if (std::isfinite(record.loss)) {
      nonfinite_steps = 0;
    } else if (++nonfinite_steps >= o.max_nonfinite_steps) {
      TORCH_CHECK(false, "the loss was ", record.loss, " for ", nonfinite_steps,
                  " consecutive steps (last: step ", step + 1, "); stopping (--max-nonfinite-steps ",
                  o.max_nonfinite_steps, "). Lower --lr, set --clip, or check --init-from; no "
                  "checkpoint of the non-finite model was saved",
                  o.save_every > 0 ? " (the last good one is in --checkpoint-dir)" : "");
    }
    if (checkpoint_due(o, step)) {
      if (std::isfinite(record.loss) && parameters_finite(gpt, dist)) {
        save_checkpoint_if_due(model, *optimizer, o.checkpoint_dir, o.save_every, step, o);
      } else if (rank == 0) {
        std::printf("step %lld: the loss or the parameters are not finite; not saving a checkpoint\n",
                    static_cast<long long>(step + 1));
        std::fflush(stdout);
      }
    }
  }
  TORCH_CHECK(nonfinite_steps == 0 && parameters_finite(gpt, dist),
              "training ended with a non-finite ", nonfinite_steps > 0 ? "loss" : "model",
              " (NaN/inf); not writing ", o.save_full.empty() ? "the model" : o.save_full,
              ". Lower --lr, set --clip, or check --init-from");

  if (!o.save_full.empty()) {
    if (dist) {
      fsdp::save_full_params(model, o.save_full);
    } else {
      fsdp::NamedTensors params;
      for (auto& item : gpt->named_parameters()) params.emplace_back(item.key(), item.value());
      fsdp::save_tensor_dict(o.save_full, params);
    }
  }
  if (dist) {
    result.final_params = fsdp::gather_full_params(model);
  } else {
    for (auto& item : gpt->named_parameters()) {
      result.final_params.emplace_back(item.key(), item.value().detach().clone());
    }
  }
  if (eval_batch) {
    const EvalResult eval_final = evaluate(model, *eval_batch, device);
    if (rank == 0) write_eval(o.eval_out, *eval_batch, *eval_initial, eval_final);
  }
  if (!o.export_hf.empty()) export_hf(o, result.final_params, dist);
  if (o.sample_bytes > 0) {
    result.sample = generate(model, device, o.sample_prompt, o.sample_bytes, o.model.max_seq, o.seed);
  }
  return result;
}

}  // namespace gpt
