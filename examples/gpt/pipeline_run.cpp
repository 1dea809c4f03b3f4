#include "pipeline_run.h"

#include "checkpointing.h"
#include "data.h"
#include "pipeline_export.h"
#include "pipeline_model.h"
#include "run_paths.h"
#include "tensor_parallel_plan.h"
#include "train_optimizers.h"
#include "trainer.h"

#include <fsdp/device_mesh.h>
#include <fsdp/memory.h>
#include <fsdp/pipeline_checkpoint.h>
#include <fsdp/tensor_file.h>
#include <fsdp/trace.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gpt {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kKeepLast = 2;  // step folders kept, as an unpipelined run keeps them

// Whether the run saves or resumes checkpoints: each stage is then sharded, at dp 1 too
// (include/fsdp/pipeline_checkpoint.h).
bool checkpointing(const TrainOptions& o) { return o.save_every > 0 || o.resume; }

// What only a sharded stage runs (Stage::fully_shard, a dp group of one will do): checkpoints,
// mixed precision (the stage's FSDP unit casts) and activation checkpointing (it recomputes the
// stage's parts).
std::string needs_sharded_stage(const TrainOptions& o) {
  if (checkpointing(o)) return "checkpoints";
  const auto& precision = o.fsdp.mixed_precision();
  if (precision.param_dtype() || precision.reduce_dtype()) return "--param-dtype/--reduce-dtype";
  if (o.fsdp.activation_checkpointing()) return "--activation-checkpointing";
  return "";
}

// The mesh pp x dp x tp: pp outermost, tp innermost (torchtitan's order), so a stage's tp ranks
// are neighbours and a pipeline's ranks (one (dp, tp) coordinate) are dp·tp apart.
fsdp::DeviceMesh pipeline_mesh(const TrainOptions& o, fsdp::Distributed& dist) {
  const int world = dist.world_size();
  const std::string asked = "--pp " + std::to_string(o.pp) + (o.tp > 1 ? " x --tp " + std::to_string(o.tp) : "");
  const std::string flags = o.tp > 1 ? "(--pp x --tp)" : "--pp";
  TORCH_CHECK(world % (o.pp * o.tp) == 0, asked, " does not divide the ", world, " ranks; launch a multiple of ",
              flags, " ranks (dp = ranks / ", flags, ")");
  const int dp = world / (o.pp * o.tp);
  // ZBV's V puts the first and the last stage on one rank: a tied head there is one tensor, which
  // two sharded stages cannot both flatten (the library refuses it on that rank alone; named here
  // before any work, so no rank waits on it).
  const std::string needs = needs_sharded_stage(o);
  TORCH_CHECK((dp == 1 && needs.empty()) || o.pp_schedule != "zbv" || !o.model.head_is_wte(), "--pp-schedule zbv "
              "at dp ", dp, " (", world, " ranks", needs.empty() ? "" : ", with " + needs, "): the head is tied to wte (",
              o.model.family == "gpt2" ? "--model gpt2" : "--tie-head", ") and ZBV puts the first and the last stage "
              "on one rank, where FSDP inside the two stages (which ", needs.empty() ? "dp > 1 needs" : needs + " needs",
              ") cannot both shard the one tensor; use gpipe, 1f1b or interleaved-1f1b, or an untied head (--model "
              "llama without --tie-head)", needs.empty() ? ", or dp 1 (--pp equal to the ranks)" : "");
  // Hybrid sharding splits a stage's dp ranks (not the world) into groups of F.
  const int f = o.fsdp.shard_group_size();
  TORCH_CHECK(!fsdp::is_hybrid(o.fsdp.strategy()) || f == 0 || (dp % f == 0 && dp / f >= 2),
              "--strategy hybrid under --pp ", o.pp, ": each stage is sharded over its dp = ", dp, " ranks (",
              world, " ranks / ", asked, "), which hybrid splits into groups of --shard-group-size F (",
              f, "); F must divide ", dp, " and leave at least 2 groups (e.g. --pp ", o.pp,
              " at ", 4 * o.pp * o.tp, " ranks with --shard-group-size 2)");
  // The stages' clip and Muon do not reduce over tp ranks yet.
  TORCH_CHECK(o.tp == 1 || (o.clip <= 0 && !o.muon), "--pp with --tp ", o.tp, " does not run with ",
              o.muon ? "--optimizer muon" : "--clip", " yet (a stage's norm and Muon's matrices are not reduced "
              "over its tp ranks); drop it or --tp");
  return fsdp::DeviceMesh(dist.world, {{"pp", o.pp}, {"dp", dp}, {"tp", o.tp}});
}

// Rank 0's line of the split: "pipeline: 2 stages (1f1b, 4 micro-batches) over pp 2 x dp 1:
// stage 0 [wte wpe h.0 h.1] stage 1 [h.2 ln_f head]".
void print_split(const TrainOptions& o, const fsdp::DeviceMesh& mesh,
                 const std::vector<std::vector<std::string>>& modules) {
  std::string line = "pipeline: " + std::to_string(modules.size()) + " stages (" + o.pp_schedule + ", " +
                     std::to_string(o.microbatches) + " micro-batches) over pp " + std::to_string(o.pp) +
                     " x dp " + std::to_string(mesh.size("dp")) +
                     (o.tp > 1 ? " x tp " + std::to_string(o.tp) : std::string()) + ":";
  for (size_t s = 0; s < modules.size(); ++s) {
    line += " stage " + std::to_string(s) + " [";
    for (size_t i = 0; i < modules[s].size(); ++i) line += (i ? " " : "") + modules[s][i];
    line += "]";
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// This rank's stages of the GPT (`modules`: each stage's), each sharded over dp when dp > 1.
std::vector<fsdp::pp::Stage> build_stages(const TrainOptions& o, fsdp::DeviceMesh& mesh,
                                          const PipelineChain& chain, fsdp::pp::Schedule schedule,
                                          const std::vector<std::vector<std::string>>& modules) {
  const int num_stages = static_cast<int>(modules.size());
  std::vector<fsdp::pp::Stage> stages;
  for (int s : fsdp::pp::stages_of_rank(mesh.coordinate("pp"), o.pp, num_stages,
                                        fsdp::pp::placement_of(schedule))) {
    stages.emplace_back(*chain.view, chain.parts, modules, s);
    if (mesh.size("dp") > 1 || !needs_sharded_stage(o).empty()) stages.back().fully_shard(mesh.group("dp"), o.fsdp);
  }
  return stages;
}

// The parameters of `split` (a split_for_muon of the whole model) that this rank's stages hold.
fsdp::optim::MuonSplit held_part(const fsdp::optim::MuonSplit& split, const std::set<const c10::TensorImpl*>& held) {
  fsdp::optim::MuonSplit part;
  for (size_t i = 0; i < split.matrices.size(); ++i) {
    if (!held.count(split.matrices[i].unsafeGetTensorImpl())) continue;
    part.matrices.push_back(split.matrices[i]);
    part.matrix_names.push_back(split.matrix_names[i]);
  }
  for (size_t i = 0; i < split.others.size(); ++i) {
    if (!held.count(split.others[i].unsafeGetTensorImpl())) continue;
    part.others.push_back(split.others[i]);
    part.other_names.push_back(split.other_names[i]);
  }
  return part;
}

// AdamW over this rank's stages' parameters, each tensor once, named as the GPT names them; with
// --optimizer muon, Muon on the stages' part of the whole model's split (each matrix whole at one
// owner among the stage's dp ranks, or here when the stage is not sharded) and AdamW on the rest.
TrainOptimizers pipeline_optimizers(const TrainOptions& o, GPT& gpt, fsdp::pp::Pipeline& pipe) {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::set<const c10::TensorImpl*> seen;
  for (const fsdp::pp::Stage& stage : pipe.stages()) {
    for (const auto& item : stage.named_parameters()) {
      if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
      names.push_back(item.key());
      params.push_back(item.value());
    }
  }
  if (o.muon) return make_muon_optimizers(held_part(fsdp::optim::split_for_muon(*gpt), seen), o);
  TrainOptimizers optimizers;
  optimizers.adamw = make_optimizer(names, params, o.lr, o.weight_decay, o.fused_optimizer);
  return optimizers;
}

// dp rank `dp_rank`'s rows of schedule `schedule` (of --grad-accum's) of step `step`: its
// micro-batch m is the step's micro-batch k = schedule·M + m, rows [k·dp·B + dp_rank·B, +B) of
// the global batch, as the reference's --grad-accum micro-batch k (step.cpp).
std::pair<torch::Tensor, torch::Tensor> rank_rows(const TrainOptions& o, const Corpus& corpus, int64_t step,
                                                  int64_t schedule, int dp, int dp_rank) {
  std::vector<torch::Tensor> inputs, targets;
  for (int64_t m = schedule * o.microbatches; m < (schedule + 1) * o.microbatches; ++m) {
    auto [x, y] = corpus.batch(o.seed, step, (m * dp + dp_rank) * o.batch, o.batch, o.model.max_seq);
    inputs.push_back(x);
    targets.push_back(y);
  }
  const c10::Device device = compute_device(o);
  return {torch::cat(inputs).to(device), torch::cat(targets).to(device)};
}

struct PipelineRun {
  const TrainOptions& o;
  fsdp::Distributed& dist;
  const Corpus& corpus;
  fsdp::pp::Pipeline& pipe;
  TrainOptimizers& optimizers;
  int dp, dp_rank;
};

// One step: --grad-accum A schedules of the pipeline's forward and backward over this rank's
// rows, their gradients added, the loss normalized once by all A·M micro-batches' tokens
// (Pipeline::step's loss_tokens), then AdamW; the loss is the global batch's (each dp rank's
// share's mean, averaged over the world: alike along pp).
StepRecord pipeline_step(const PipelineRun& run, int64_t step, bool traced) {
  const TrainOptions& o = run.o;
  if (traced) fsdp::start_trace();
  fsdp::reset_peak_memory(compute_device(o));
  const fsdp::CommStats comm_before = fsdp::comm_stats();
  const auto start = Clock::now();
  run.optimizers.set_learning_rates(o, step);
  torch::optim::Optimizer& optimizer = run.optimizers.stepped();
  optimizer.zero_grad();
  double rank_loss = 0;
  for (int64_t schedule = 0; schedule < o.grad_accum; ++schedule) {
    const auto [inputs, targets] = rank_rows(o, run.corpus, step, schedule, run.dp, run.dp_rank);
    rank_loss += run.pipe.step(inputs, targets, o.grad_accum * targets.numel());
  }
  auto loss = torch::tensor(rank_loss, torch::kDouble);
  StepRecord record;
  if (o.clip > 0) record.grad_norm = fsdp::pp::clip_grad_norm_(run.pipe, o.clip);  // over every stage
  const auto optimizer_start = Clock::now();
  optimizer.step();
  record.optimizer_ms = std::chrono::duration<double, std::milli>(Clock::now() - optimizer_start).count();
  if (traced) {
    const std::string trace = for_rank(o.trace, run.dist.rank());
    write_output("--trace", trace, [&] { fsdp::write_trace(trace, run.dist.rank()); });
  }
  fsdp::all_reduce_sum(*run.dist.world, loss);
  record.step = step;
  record.loss = loss.item<double>() / run.dist.world_size();
  record.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  const double tokens = static_cast<double>(o.grad_accum * o.microbatches * run.dp * o.batch * o.model.max_seq);
  record.tokens_per_s = tokens / (record.step_ms / 1000.0);
  record.memory = fsdp::memory_stats(compute_device(o));
  record.comm = comm_difference(fsdp::comm_stats(), comm_before);
  return record;
}

Corpus pipeline_corpus(const TrainOptions& o) {
  const int64_t min_size = o.model.max_seq + 2;
  return o.data_is_tokens ? Corpus::load_tokens(o.data, o.data_flag, o.model.vocab_size,
                                                o.max_data_bytes, min_size)
                          : Corpus::load(o.data, o.max_data_bytes, min_size);
}

// Every stage's full parameters when the run writes them (--save-full, --export-hf) or samples
// from them (--sample): a collective.
fsdp::NamedTensors pipeline_full_params_if_used(const TrainOptions& o, GPT& gpt, fsdp::pp::Pipeline& pipe,
                                                fsdp::DeviceMesh& mesh,
                                                const std::vector<std::vector<std::string>>& modules,
                                                fsdp::pp::Schedule schedule) {
  if (o.save_full.empty() && o.export_hf.empty() && o.sample_bytes == 0) return {};
  return pipeline_full_params(gpt, pipe, mesh, modules, fsdp::pp::placement_of(schedule));
}

// --save-full (rank 0's dict) and --export-hf (rank 0's folder), as an unpipelined run writes them.
void write_full_params(const TrainOptions& o, fsdp::Distributed& dist, const fsdp::NamedTensors& params) {
  if (!o.save_full.empty() && dist.rank() == 0) {
    write_output("--save-full", o.save_full, [&] { fsdp::save_tensor_dict(o.save_full, params); });
  }
  if (!o.export_hf.empty()) export_hf(o, params, &dist);
}

// --sample: the whole trained model, its parameters gathered from every stage (`params`), built on
// every rank and sampled as the unpipelined trainer samples (the same seed, the same forwards).
std::string sample_whole_model(const TrainOptions& o, const fsdp::NamedTensors& params) {
  GPT whole = make_gpt(o.model, o.seed);
  fsdp::Unit<GPT> model(whole);
  fsdp::load_full_params(model, params, "--sample's gathered stages");
  whole->to(compute_device(o));
  return generate(model, compute_device(o), o.sample_prompt, o.sample_bytes, o.model.max_seq, o.seed);
}

// --eval-tokens: the loss of the fixed batch through the stages (Pipeline::evaluate: forward only),
// every dp rank on the whole batch as one micro-batch, as the unpipelined run's one forward.
EvalResult pipeline_eval(fsdp::pp::Pipeline& pipe, const EvalBatch& batch, const c10::Device& device) {
  EvalResult result;
  result.loss = pipe.evaluate(batch.inputs.to(device), batch.targets.to(device), /*microbatches=*/1);
  return result;
}

// --dump-batches: the global batches of the reference a pipelined run equals (--world-size dp
// --grad-accum A·M): a step's micro-batch k of dp rank d is its rows [k·dp·B + d·B, +B).
void dump_pipeline_batches(const TrainOptions& o, const Corpus& corpus, int dp) {
  TrainOptions reference = o;
  reference.grad_accum = o.grad_accum * o.microbatches;
  write_output("--dump-batches", o.dump_batches, [&] { dump_batches(reference, corpus, dp); });
}

}  // namespace

TrainResult train_pipeline(const TrainOptions& o, fsdp::Distributed& dist) {
  fsdp::DeviceMesh mesh = pipeline_mesh(o, dist);
  fsdp::install_memory_counter();
  const Corpus corpus = pipeline_corpus(o);
  GPT gpt = make_gpt(o.model, o.seed);  // every rank alike: the reference's initial values
  {
    fsdp::Unit<GPT> whole(gpt);  // --init-from(-hf): every rank loads the whole model, then keeps its stages
    load_initial_weights(o, whole);
  }
  freeze_parameters(o, *gpt);
  gpt->to(compute_device(o));
  if (o.tp > 1) parallelize_gpt(gpt, std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp")));
  const PipelineChain chain = pipeline_chain(gpt);
  const fsdp::pp::Schedule schedule = pipeline_schedule(o.pp_schedule);
  const auto modules = stage_modules(chain, o.model.layers, o.pp * o.stages_per_rank);
  if (dist.rank() == 0) print_split(o, mesh, modules);
  fsdp::pp::Pipeline pipe(build_stages(o, mesh, chain, schedule, modules), mesh.group_ptr("pp"), summed_lm_loss(gpt->tp),
                          fsdp::pp::PipelineOptions().schedule(schedule).microbatches(o.microbatches));
  TrainOptimizers optimizers = pipeline_optimizers(o, gpt, pipe);
  const PipelineRun run{o, dist, corpus, pipe, optimizers, mesh.size("dp"), mesh.coordinate("dp")};

  if (!o.dump_batches.empty() && dist.rank() == 0) dump_pipeline_batches(o, corpus, mesh.size("dp"));
  StepLog log(o, &dist, dist.rank());
  NonFiniteGuard nonfinite(o);
  prepare_checkpoint_dir(o, dist.rank());
  const int64_t first_step = o.resume ? resume_with(
                                            [&](const std::string& path) {
                                              return fsdp::pp::load_sharded(pipe, *dist.world, optimizers.saved(), path);
                                            },
                                            optimizers, o.checkpoint_dir, o, dist.rank())
                                      : 0;
  const auto async_options = fsdp::AsyncSaveOptions().staging_budget_bytes(o.staging_budget);
  // --async-save: completed by the next save, the run's last one at once (as save_checkpoint's).
  const auto save = [&](int64_t next_step, const nlohmann::json& extra, const fsdp::SaveHooks&) {
    if (!o.async_save) {
      fsdp::pp::save_checkpoint(pipe, *dist.world, optimizers.saved(), o.checkpoint_dir, next_step, extra, kKeepLast);
      return;
    }
    auto saving = fsdp::pp::save_checkpoint_async(pipe, *dist.world, optimizers.saved(), o.checkpoint_dir, next_step,
                                                  extra, kKeepLast, async_options);
    if (next_step == o.steps) saving.wait();
  };
  const std::optional<EvalBatch> eval_batch =
      o.eval_tokens.empty() ? std::nullopt
                            : std::optional(EvalBatch::load(o.eval_tokens, o.model.vocab_size, o.model.max_seq));
  std::optional<EvalResult> eval_initial;
  if (eval_batch) eval_initial = pipeline_eval(pipe, *eval_batch, compute_device(o));
  TrainResult result;
  const int64_t traced_step = std::min<int64_t>(2, o.steps - 1);
  for (int64_t step = first_step; step < o.steps; ++step) {
    const StepRecord record = pipeline_step(run, step, !o.trace.empty() && step == traced_step);
    result.summary.add(record);
    if (o.keep_step_records) result.steps.push_back(record);
    result.losses.push_back(record.loss);
    log.write(record);
    nonfinite.count(record.loss, step);
    save_if_due_with(save, optimizers, o.checkpoint_dir, o.save_every, step, o);
    if (o.async_save && step == first_step) {  // the stages are sharded: the run checkpoints
      fsdp::pp::reserve_staging_arena(pipe, optimizers.saved(), async_options);
    }
  }
  const fsdp::NamedTensors params = pipeline_full_params_if_used(o, gpt, pipe, mesh, modules, schedule);
  write_full_params(o, dist, params);
  if (eval_batch) {
    const EvalResult eval_final = pipeline_eval(pipe, *eval_batch, compute_device(o));
    if (dist.rank() == 0) write_eval("", *eval_batch, *eval_initial, eval_final);  // --eval-out is refused
  }
  if (o.sample_bytes > 0) result.sample = sample_whole_model(o, params);
  nonfinite.check_finished(gpt, &dist);
  return result;
}

}  // namespace gpt
