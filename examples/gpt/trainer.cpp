#include "trainer.h"

#include "batch_dump.h"
#include "checkpointing.h"
#include "data.h"
#include "eval_batch.h"
#include "model_setup.h"
#include "output_errors.h"
#include "run_outputs.h"
#include "sample.h"
#include "setup_memory.h"
#include "step_log.h"
#include "step_precision.h"
#include "train_step.h"
#include "training_loop.h"

#include <fsdp/memory.h>

#include <c10/core/DeviceGuard.h>

#include <optional>

namespace gpt {

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
  const int world = dist ? dist->world_size() : o.reference_world_size;
  const int rank = dist ? dist->rank() : 0;
  const c10::Device device = compute_device(o);
  c10::OptionalDeviceGuard gpu_guard(current_gpu(device));
  fsdp::install_memory_counter();
  check_options(o);
  prepare_checkpoint_dir(o, rank);
  const Corpus corpus = load_corpus(o);
  const std::optional<EvalBatch> eval_batch = load_eval_batch(o);

  SetupMemory setup_memory(device);
  fsdp::Unit<GPT> model = build_model(o, dist);
  auto optimizer = make_optimizer(model.module(), o.lr, o.weight_decay, o.fused_optimizer);
  setup_memory.end_build();
  load_initial_weights(o, model);
  const nlohmann::json setup = setup_memory.record(model);
  if (!o.dump_batches.empty() && rank == 0) {
    write_output("--dump-batches", o.dump_batches, [&] { dump_batches(o, corpus, world); });
  }
  StepLog log(o, dist, rank);
  if (!o.init_from_hf.empty()) log.write_setup(setup);
  if (!o.init_from_hf.empty() && rank == 0) print_setup_memory(setup);

  check_step_options(o, dist);
  const int64_t first_step =
      o.resume ? resume_from_checkpoint(model, *optimizer, o.checkpoint_dir, o, rank) : 0;
  StepPrecision precision(o, dist, model.module());
  const StepContext ctx{o, corpus, model, *optimizer, precision, dist, world, rank, device};
  std::optional<EvalResult> eval_initial;
  if (eval_batch) eval_initial = evaluate(model, *eval_batch, device);

  TrainResult result;
  result.steps = run_steps(ctx, first_step, log);
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
