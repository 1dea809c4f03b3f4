#include "gpt_plan.h"

#include "command_line.h"
#include "data.h"
#include "gpt.h"
#include "model_family.h"
#include "options.h"
#include "plan_counting.h"
#include "pipeline_plan.h"
#include "plan_tp_moves.h"
#include "tensor_parallel_plan.h"
#include "trainer.h"

#include <fsdp/distributed.h>

#include <algorithm>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <unistd.h>

namespace gpt {

namespace {

// A parameter's own name: the last component of its path ("h.0.attn.q_proj.weight" -> "weight").
std::string own_name(const std::string& path) { return path.substr(path.rfind('.') + 1); }

// The last norm of `table` (the final norm, after the blocks), or null.
const Layer* last_norm(const std::vector<Layer>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    if (it->kind == LayerKind::LayerNorm || it->kind == LayerKind::RMSNorm) return &*it;
  }
  return nullptr;
}

// `param` of `layer` as one of tp TP ranks holds it: split as the style the trainer's own plan
// (`plan`, the family's) gives the layer says ([Note: a style's two readers]).
fsdp::PlanParam tp_local(fsdp::PlanParam param, const Layer& layer, const fsdp::tp::ParallelizePlan& plan, int64_t tp) {
  if (tp == 1) return param;
  const fsdp::tp::ParallelStyle* style = fsdp::tp::style_for(plan, layer.name);
  if (!style) return param;  // outside the plan: replicated
  const auto how = fsdp::tp::split_of(*style, own_name(param.name), layer.kind == LayerKind::Embedding);
  if (how.dim >= 0) {
    param.shape.at(how.dim) /= tp;
    param.tp_dim = how.dim;
  }
  return param;
}

std::vector<fsdp::PlanParam> params_of(const std::vector<Layer>& layers, const std::string& prefix,
                                       const fsdp::tp::ParallelizePlan& plan, int64_t tp) {
  std::vector<fsdp::PlanParam> params;
  for (const Layer& layer : layers) {
    for (fsdp::PlanParam& param : layer_params(layer, prefix)) params.push_back(tp_local(std::move(param), layer, plan, tp));
  }
  return params;
}

// Block i: its layers' parameters below "h.i.", and what it computes and keeps (the family's).
fsdp::PlanUnit block_unit(const GPTConfig& config, const GptLayers& layers, int64_t i, int64_t e,
                          GptCode code, int64_t tp) {
  fsdp::PlanUnit unit;
  unit.name = "h." + std::to_string(i);
  unit.params = params_of(layers.block, unit.name + ".", block_parallel_plan(config), tp);
  family_of(config).describe_block(config, e, code, tp, unit);
  // What its styled layers move, as the family's plan styles them ([Note: a style's two readers]).
  unit.tp_collectives = styled_tp_collectives(layers.block, unit.name + ".", block_parallel_plan(config),
                                              config.max_seq, e, tp);
  return unit;
}

// What the final norm keeps for backward, by its kind in the table: LayerNorm's mean and rstd
// (8T) and output; RMSNorm's inverse RMS (4T) and output (below fp32 also its normalised input
// and its input's fp32 copy; [Note: Llama activations] in llama/llama_plan.cpp). With TP its
// output is gathered along the sequence for the head (whole), the rest is the rank's sequence
// shard (Ts tokens).
int64_t final_norm_saved(LayerKind kind, int64_t T, int64_t Ts, int64_t C, int64_t e) {
  if (kind == LayerKind::RMSNorm) {
    return sum({product({T, C, e}), 4 * Ts, e < 4 ? sum({product({Ts, C, e}), product({Ts, C, 4})}) : 0});
  }
  return sum({product({T, C, e}), 8 * Ts});
}

// The root: the layers before and after the blocks (the embeddings, ln_f, minGPT's head).
fsdp::PlanUnit root_unit(const GPTConfig& config, const GptLayers& layers, int64_t e, GptCode code, int64_t tp) {
  const int64_t T = config.max_seq, C = config.dim, V = config.vocab_size;
  const int64_t Ts = T / tp, Vl = V / tp;  // this TP rank's sequence shard and vocabulary rows
  const double share = 1.0 / static_cast<double>(tp);
  fsdp::PlanUnit root;
  root.name = "";
  root.params = params_of(layers.root(), "", root_parallel_plan(config), tp);
  root.backward_workspace = product({Vl, C, e});
  root.forward_flops = 2.0 * T * C * V * share;
  root.forward_memory_bytes = (5.0 * T * C * e + 3.0 * T * V * 4) * share;
  root.forward_ops = 14;
  if (code == GptCode::MinGpt) {
    TORCH_CHECK(tp == 1, "--mingpt with --tp ", tp, ": minGPT is planned without tensor parallelism; drop "
                "--mingpt or use --tp 1");
    // The loss of the low-precision logits as they are (no fp32 copy).
    root.activations.saved = sum({product({T, C, e}), 8 * T, product({T, V, e})});
    root.activations.forward_transient = product({T, V, e});
    root.activations.backward_transient = product({2, T, V, e});
    return root;
  }
  // ln_f's, then log_softmax's output (loss parallel: the rank's vocabulary columns).
  const Layer* final_norm = last_norm(layers.after_blocks);
  TORCH_CHECK(final_norm, "the layer table has no norm after the blocks");
  root.activations.saved = sum({final_norm_saved(final_norm->kind, T, Ts, C, e), product({T, Vl, 4})});
  root.activations.forward_transient = sum({product({T, Vl, e}), e < 4 ? product({T, Vl, 4}) : 0});
  root.activations.backward_transient = product({2, T, Vl, 4});
  root.tp_collectives = root_tp_collectives(config, layers, e, tp);
  return root;
}

}  // namespace

void check_tp_size(const GPTConfig& config, int64_t tp) {
  TORCH_CHECK(tp >= 1 && tp <= (1 << 16), "--tp must be in [1, 65536], got ", tp);
  check_tensor_parallel(config, static_cast<int>(tp));  // the trainer's own refusals
}

std::vector<int> tp_sizes_for(const GPTConfig& config, int world, int ranks_per_host) {
  std::vector<int> out;
  for (int tp = 1; tp <= ranks_per_host; ++tp) {
    if (ranks_per_host % tp != 0 || world % tp != 0) continue;
    try {
      check_tp_size(config, tp);
    } catch (const c10::Error&) {
      continue;
    }
    out.push_back(tp);
  }
  return out;
}

fsdp::PlanModel describe_gpt(const GPTConfig& config, c10::ScalarType compute_dtype, int64_t resident_bytes,
                             GptCode code, int64_t tp) {
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
  const int64_t T = config.max_seq, C = config.dim;
  check_tp_size(config, tp);
  // One unit per block is built here: a count beyond the flags' bound would take gigabytes first.
  TORCH_CHECK(config.layers >= 1 && config.layers <= kMaxLayers, "the GPT has ", config.layers,
              " blocks; gpt_train builds 1 to ", kMaxLayers, " (--layers' bound)");
  fsdp::PlanModel model;
  const std::string kind = code == GptCode::MinGpt ? "minGPT " : family_of(config).plan_kind() + " ";
  const std::string kv_heads = config.key_value_heads() != config.heads
                                   ? " (" + std::to_string(config.key_value_heads()) + " kv)"
                                   : "";
  model.name = kind + std::to_string(config.layers) + "x" + std::to_string(C) + ", " +
               std::to_string(config.heads) + " heads" + kv_heads + ", seq " + std::to_string(T) +
               ", vocab " + std::to_string(config.vocab_size);
  const GptLayers layers = gpt_layers(config, code);
  model.root = root_unit(config, layers, e, code, tp);
  // The first block's input: the embeddings' sum, while wte's output exists beside it (a single
  // embedding, a Llama's wte, is the input itself); minGPT adds a dropout mask.
  // With TP the sum is the rank's sequence shard (wte's output reduce-scattered), and wte's
  // partial output exists whole before its reduce-scatter.
  model.root_pre.saved = sum({product({T / tp, C, e}), code == GptCode::MinGpt ? product({T, C}) : 0});
  model.root_pre.forward_transient = layers.before_blocks.size() > 1 || tp > 1 ? product({T, C, e}) : 0;
  model.root_pre.backward_transient = product({T, C, e});
  for (int64_t i = 0; i < config.layers; ++i) model.units.push_back(block_unit(config, layers, i, e, code, tp));
  model.sequence_tokens = T;
  model.input_bytes_per_sequence = 2 * T * 8;  // inputs and targets, int64
  model.resident_bytes = resident_bytes;
  model.step_all_reduce_bytes = 4;  // the step's loss, summed over the ranks (fp32)
  model.compute_dtype = compute_dtype;
  model.tp_size = static_cast<int>(tp);
  return model;
}

namespace {

// The bytes of the regular files below `folder`, counted until `enough` (gpt_train holds no
// more than --max-data-mb) or kMaxDataEntries entries: a folder such as / is never walked whole.
// A folder that cannot be listed is named, as training names it.
int64_t folder_bytes(const std::string& folder, int64_t enough) {
  namespace fs = std::filesystem;
  constexpr int64_t kMaxDataEntries = 1000000;
  std::error_code error;
  fs::recursive_directory_iterator it(folder, error), end;
  int64_t bytes = 0, entries = 0;
  std::string last = folder;  // where a failed step of the walk was (it then ends)
  for (; !error && it != end && bytes < enough; it.increment(error)) {
    last = it->path().string();
    TORCH_CHECK(++entries <= kMaxDataEntries, "--data ", folder, " holds more than ",
                kMaxDataEntries, " files and folders before ", enough, " bytes of text; pass the "
                "folder that holds the training text itself");
    std::error_code type;
    if (it->is_regular_file(type)) bytes += static_cast<int64_t>(it->file_size(type));
  }
  TORCH_CHECK(!error, "--data ", folder, ": cannot list ", last, " (", error.message(),
              "); make it readable, or pass the folder that holds the training text");
  return bytes;
}

}  // namespace

int64_t training_data_bytes(const TrainOptions& o) {
  namespace fs = std::filesystem;
  if (o.data.empty()) return 0;
  std::error_code error;
  int64_t bytes = 0;
  if (fs::is_directory(o.data, error)) {
    bytes = folder_bytes(o.data, o.max_data_bytes);
  } else {
    bytes = static_cast<int64_t>(fs::file_size(o.data, error));
    if (error) bytes = 0;
  }
  if (o.data_is_tokens) bytes = bytes / 2 * 2;  // token ids, held as they are
  return std::min(bytes, o.max_data_bytes);
}

namespace {

// --freeze's parameters are planned frozen: the engine flattens them apart, with no gradient,
// reduction or optimizer state ([Note: a unit's flat parameters]).
void mark_frozen(fsdp::PlanModel& model, const TrainOptions& o) {
  auto mark = [&](fsdp::PlanUnit& unit) {
    for (auto& param : unit.params) param.requires_grad = !is_frozen(o, param.name);
  };
  mark(model.root);
  for (auto& unit : model.units) mark(unit);
}

}  // namespace

fsdp::PlanModel describe_run_model(const TrainOptions& o, int tp) {
  const c10::ScalarType compute = o.fsdp.mixed_precision().param_dtype().value_or(c10::kFloat);
  fsdp::PlanModel model = describe_gpt(o.model, compute, training_data_bytes(o), GptCode::ThisProject, tp);
  mark_frozen(model, o);
  return model;
}

fsdp::PlanSetup plan_setup(const TrainOptions& o, int world, int ranks_per_host,
                           const fsdp::PlanDevice& device, const fsdp::PlanLinks& links) {
  fsdp::PlanSetup setup;
  setup.model = describe_run_model(o, o.tp);
  setup.policy.tp_size = o.tp;
  setup.world = {world, ranks_per_host};
  setup.device = device;
  setup.links = links;
  setup.policy.fsdp = o.fsdp;
  // make_optimizer's AdamW (gpt.h), fused or not: no amsgrad; or --optimizer muon's Muon for the
  // blocks' matrices and AdamW for the rest (the planner splits as split_for_muon does).
  setup.policy.optimizer.name = o.muon ? "Muon" : "AdamW";
  setup.policy.batch = o.batch;
  setup.policy.micro_batches = o.grad_accum;
  setup.policy.no_sync = o.no_sync && o.grad_accum > 1;
  setup.policy.async_save_staging_bytes = o.async_save ? o.staging_budget : -1;  // its arena
  return setup;
}



namespace {


// The batches per rank that keep the global batch with gradient accumulation: divisors of --batch.
std::vector<int64_t> divisors(int64_t batch) {
  std::vector<int64_t> out;
  for (int64_t b = batch; b >= 1; --b) {
    if (batch % b == 0) out.push_back(b);
  }
  return out;
}


}  // namespace

fsdp::PlanDevice shared_device(fsdp::PlanDevice device, fsdp::Distributed& dist) {
  std::vector<double*> fields = {&device.memory_bytes, &device.op_overhead_s};
  for (fsdp::KernelRates* r : {&device.fp32, &device.low_precision}) {
    for (double* x : {&r->matmul_flops, &r->attention_flops, &r->transcendentals, &r->memory_bandwidth}) {
      fields.push_back(x);
    }
  }
  auto numbers = torch::zeros({static_cast<int64_t>(fields.size())}, torch::kFloat64);
  if (dist.rank() == 0) {
    for (size_t i = 0; i < fields.size(); ++i) numbers[i] = *fields[i];
  }
  fsdp::all_reduce_sum(*dist.world, numbers);
  for (size_t i = 0; i < fields.size(); ++i) *fields[i] = numbers[i].item<double>();
  return device;
}

fsdp::PlanSetup setup_of_flags(const TrainOptions& o, const PlanFlags& flags) {
  const fsdp::PlanWorld world = plan_world(flags);
  const fsdp::PlanDevice device = plan_device(flags, o, world);
  fsdp::PlanSetup setup = plan_setup(o, world.world_size, world.ranks_per_host, device, plan_links(flags, device));
  setup.policy.gradients_kept = flags.zero_grad_in_place;
  // A GPU preset plans a GPU run (offload is one of its options) without --device cuda here.
  if (!flags.gpu.empty() && !setup.policy.fsdp.device()) setup.policy.fsdp.device(c10::Device(c10::kCUDA, 0));
  return setup;
}

void print_plan(const TrainOptions& o, const fsdp::PlanSetup& setup, const PlanFlags& flags) {
  if (o.pp > 0) return print_pipeline_plan(o, setup, flags);
  if (flags.max_memory_gb <= 0) {
    const fsdp::Plan plan = fsdp::plan(setup);
    std::cout << (flags.json ? fsdp::plan_json(plan).dump(2) + "\n" : fsdp::plan_text(plan));
    return;
  }
  fsdp::SearchSpace space;
  space.batches = search_batches(flags, setup.policy.batch);
  space.cpu_offload = {false, true};  // searched where it applies (a GPU, its host's bandwidths)
  search_tp_sizes(flags, o, setup, space);
  const double cap = flags.max_memory_gb * kGiB;
  const fsdp::SearchResult result = fsdp::search_plans(setup, space, cap);
  std::cout << (flags.json ? fsdp::search_json(result, cap).dump(2) + "\n" : fsdp::search_text(result, cap));
}

fsdp::Plan choose_configuration(TrainOptions& o, const PlanFlags& flags, fsdp::Distributed& dist,
                                const std::vector<std::string>& replaced_flags) {
  TORCH_CHECK(flags.max_memory_gb > 0, "--auto needs --max-memory-gb X: the memory each rank may use");
  TORCH_CHECK(flags.ranks == 0 || flags.ranks == dist.world_size(), "--ranks ", flags.ranks,
              " differs from the world size ", dist.world_size(), " this run was launched with: "
              "--auto plans the run it is in; omit --ranks (or launch ", flags.ranks, " ranks)");
  fsdp::PlanWorld world = plan_world(flags);
  world.world_size = dist.world_size();
  const fsdp::PlanDevice device = shared_device(plan_device(flags, o, world), dist);
  const fsdp::PlanSetup setup = plan_setup(o, world.world_size, world.ranks_per_host, device, plan_links(flags, device));
  fsdp::SearchSpace space;
  space.batches = divisors(o.batch);
  space.keep_global_batch = true;
  space.peak_margin = fsdp::kPlanPeakMargin;
  space.cpu_offload = {false, true};  // searched where it applies (a GPU, its host's bandwidths)
  if (!flags.tp_sizes.empty()) {
    // What gpt_train --tp does not run yet (command_line.cpp's check_tensor_parallel_flags):
    // checkpoints and Muon do run, and are planned.
    const std::vector<std::pair<bool, const char*>> not_with_tp = {
        {!o.eval_tokens.empty(), "--eval-tokens"}, {o.sample_bytes > 0, "--sample"}};
    for (const auto& [given, flag] : not_with_tp) {
      TORCH_CHECK(!given, "--auto --tp-sizes: gpt_train --tp does not run with ", flag,
                  " yet; drop one of them");
    }
    search_tp_sizes(flags, o, setup, space);
  }
  const double cap = flags.max_memory_gb * kGiB;
  const fsdp::SearchResult result = fsdp::search_plans(setup, space, cap);
  if (dist.rank() == 0) std::cout << fsdp::search_text(result, cap) << std::flush;
  if (!result.best()) {
    int64_t smallest = -1;
    for (const auto& [p, why] : result.rejected) {
      if (smallest < 0 || p.peak_bytes < smallest) smallest = p.peak_bytes;
    }
    TORCH_CHECK(false, "--auto: no configuration fits --max-memory-gb ", flags.max_memory_gb,
                " per rank with the planner's ", 100 * fsdp::kPlanPeakMargin, "% margin (the smallest "
                "planned peak is ", smallest / kGiB, " GiB); raise the cap, use more ranks, or a smaller "
                "model or --seq");
  }
  const fsdp::Plan& best = *result.best();
  o.grad_accum = best.setup.policy.micro_batches;
  o.batch = best.setup.policy.batch;
  o.fsdp = best.setup.policy.fsdp;
  o.tp = best.setup.policy.tp_size;
  if (dist.rank() == 0) {
    std::string replaced;
    for (const std::string& flag : replaced_flags) replaced += (replaced.empty() ? "" : ", ") + flag;
    std::cout << "--auto: training with " << best.label()
              << (replaced.empty() ? "" : " instead of the given " + replaced) << "\n" << std::flush;
  }
  return best;
}

void check_plan_against_run(const fsdp::Plan& plan, const TrainOptions& o, const TrainResult& result,
                            const PlanFlags& flags, fsdp::Distributed& dist) {
  const int64_t peak = result.summary.peak_bytes();
  auto peaks = torch::zeros({dist.world_size()}, torch::kFloat64);
  peaks[dist.rank()] = static_cast<double>(peak);
  fsdp::all_reduce_sum(*dist.world, peaks);
  const double measured_peak = peaks.max().item<double>();
  const int64_t peak_rank = peaks.argmax().item<int64_t>();
  if (dist.rank() == 0) {
    const double measured_ms = result.summary.median_step_ms();
    const double predicted_ms = plan.time.step * 1000 * o.grad_accum;  // the plan is a micro-batch's
    std::printf("plan vs run: peak per rank predicted %.2f MiB, measured %.2f MiB (max over ranks, "
                "%.3fx); step (%lld micro-batch%s) predicted %.1f ms, measured %.1f ms (median of rank "
                "0, %.3fx)\n",
                plan.peak_bytes / 1048576.0, measured_peak / 1048576.0, measured_peak / plan.peak_bytes,
                static_cast<long long>(o.grad_accum), o.grad_accum == 1 ? "" : "es", predicted_ms,
                measured_ms, measured_ms / predicted_ms);
    std::fflush(stdout);
  }
  // The promise --auto made: every rank under the cap (the same verdict on every rank).
  const double cap = flags.max_memory_gb * kGiB;
  TORCH_CHECK(measured_peak <= cap, "--auto: rank ", peak_rank, "'s measured peak ", measured_peak / 1048576.0,
              " MiB exceeded --max-memory-gb ", flags.max_memory_gb, " (", cap / 1048576.0, " MiB; planned ",
              plan.peak_bytes / 1048576.0, " MiB for ", plan.label(), "): the planner was wrong for this run; "
              "lower --max-memory-gb or choose the configuration by hand, and report the plan");
}

}  // namespace gpt
