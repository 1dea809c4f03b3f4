#include "gpt_plan.h"

#include "data.h"
#include "model_bounds.h"

#include <fsdp/checked_math.h>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <filesystem>
#include <optional>

namespace gpt {

namespace {

// Bytes counted from the GPT's sizes, checked: minGPT's attention scores alone are H·T² per
// sequence, beyond int64 at the largest --heads and --seq.
int64_t must_fit(std::optional<int64_t> bytes) {
  TORCH_CHECK(bytes, "the GPT's sizes (--layers, --dim, --heads, --seq, --vocab) count more bytes "
              "than int64 holds; choose a smaller model");
  return *bytes;
}

int64_t product(std::initializer_list<int64_t> factors) {
  return must_fit(fsdp::checked_product(std::vector<int64_t>(factors)));
}

int64_t sum(std::initializer_list<int64_t> terms) { return must_fit(fsdp::checked_sum(terms)); }

// [Note: GPT activations]
// What autograd keeps per sequence of T tokens (width C, H heads, vocabulary V, e bytes per
// element of the compute dtype; LayerNorm's statistics and attention's log-sum-exp in fp32):
// - a block (gpt.cpp BlockImpl::forward): ln_1's mean and rstd (2T·4) and output (TC·e, saved by
//   c_attn), c_attn's output q,k,v (3TC·e, saved by attention), attention's output (TC·e, saved
//   by c_proj; ATen's CPU flash kernel lays it out [B,T,H,d], so .contiguous() copies nothing) and
//   log-sum-exp (TH·4), the residual sum (TC·e, saved by ln_2), ln_2's statistics and output, c_fc's
//   output (4TC·e, saved by GELU), GELU's output (4TC·e, saved by c_proj) and the block's output
//   (TC·e, the next block's input): 16TC·e + 16T + 4TH. Under activation checkpointing only the
//   output stays.
// - its backward, at its highest (GELU's backward): the incoming gradient (TC·e), GELU's output's
//   gradient and its input's (4TC·e each), less GELU's output, released by c_proj's backward:
//   5TC·e; and a weight gradient of the largest matrix (4C²·e) before it is copied into the
//   unsharded gradient.
// - the root before the blocks: the embeddings' sum (TC·e), while wte's output (TC·e) exists.
// - the head: ln_f's statistics and output (TC·e), log_softmax's output (TV·4, fp32: lm_loss
//   computes the loss in fp32); while it runs, the logits (TV·e) and, below fp32, their fp32 copy
//   (TV·4). Its backward holds the loss's gradient and log_softmax's input gradient (2·TV·4) and
//   wte's gradient from the head (VC·e).
//
// minGPT's block (the paper's model) keeps more: attention's scores after softmax (HT²·e), the
// dropout mask on them (HT², bool) and dropout's output (HT²·e); dropout masks of both residual
// branches (TC each, bool); its GELU, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) in separate
// ops, keeps tanh's output, 0.5·x and 1 + tanh (4TC·e each) besides c_fc's output: 28TC·e + 2TC +
// HT²·(2e + 1) + 16T. While attention runs, the raw and masked scores exist at once (2·HT²·e);
// its backward holds two score-sized gradients (2·HT²·e) besides the 5TC·e above.
fsdp::PlanActivations min_gpt_block_activations(int64_t T, int64_t C, int64_t H, int64_t e) {
  const int64_t scores = product({H, T, T});
  fsdp::PlanActivations a;
  a.saved = sum({product({28, T, C, e}), product({2, T, C}), product({scores, 2 * e + 1}), 16 * T});
  a.checkpointed = product({T, C, e});
  a.forward_transient = product({2, scores, e});
  a.backward_transient = sum({product({2, scores, e}), product({5, T, C, e})});
  return a;
}

fsdp::PlanActivations block_activations(int64_t T, int64_t C, int64_t H, int64_t e) {
  fsdp::PlanActivations a;
  a.saved = sum({product({16, T, C, e}), 16 * T, product({4, T, H})});
  a.checkpointed = product({T, C, e});
  a.forward_transient = product({T, C, e});  // c_proj's output before the residual sum
  a.backward_transient = product({5, T, C, e});
  return a;
}

std::vector<fsdp::PlanParam> linear(const std::string& name, int64_t in, int64_t out) {
  return {{name + ".weight", {out, in}}, {name + ".bias", {out}}};
}

std::vector<fsdp::PlanParam> layer_norm(const std::string& name, int64_t dim) {
  return {{name + ".weight", {dim}}, {name + ".bias", {dim}}};
}

void append(std::vector<fsdp::PlanParam>& to, std::vector<fsdp::PlanParam> more) {
  to.insert(to.end(), more.begin(), more.end());
}

// A block's parameters in registration order (ln_1, attn, ln_2, mlp).
fsdp::PlanUnit block_unit(const GPTConfig& config, int64_t i, int64_t e, GptCode code) {
  const int64_t T = config.max_seq, C = config.dim;
  fsdp::PlanUnit unit;
  unit.name = "h." + std::to_string(i);
  append(unit.params, layer_norm(unit.name + ".ln_1", C));
  append(unit.params, linear(unit.name + ".attn.c_attn", C, 3 * C));
  append(unit.params, linear(unit.name + ".attn.c_proj", C, C));
  append(unit.params, layer_norm(unit.name + ".ln_2", C));
  append(unit.params, linear(unit.name + ".mlp.c_fc", C, 4 * C));
  append(unit.params, linear(unit.name + ".mlp.c_proj", 4 * C, C));
  unit.activations = code == GptCode::MinGpt ? min_gpt_block_activations(T, C, config.heads, e)
                                             : block_activations(T, C, config.heads, e);
  unit.backward_workspace = product({4, C, C, e});
  // Products: 2·T·(3C² + C² + 4C² + 4C²); causal fused attention, half of QKᵀ and of PV: 2·T²·C
  // (minGPT computes all of both: 4·T²·C).
  unit.forward_flops = 24.0 * T * C * C;
  if (code == GptCode::MinGpt) {
    unit.forward_flops += 4.0 * T * T * C;  // scores and their product with V as plain matmuls
  } else {
    unit.forward_attention_flops = 2.0 * T * T * C;
  }
  unit.forward_transcendentals = 4.0 * T * C;  // GELU of the MLP's hidden layer
  // Other ops' traffic: two LayerNorms (2TC each), two residual sums (3TC each), the copy of
  // q, k, v for attention and of its output (4TC).
  unit.forward_memory_bytes = 14.0 * T * C * e;
  unit.forward_ops = 16;
  return unit;
}

fsdp::PlanUnit root_unit(const GPTConfig& config, int64_t e, GptCode code) {
  const int64_t T = config.max_seq, C = config.dim, V = config.vocab_size;
  fsdp::PlanUnit root;
  root.name = "";
  root.params = {{"wte.weight", {V, C}}, {"wpe.weight", {config.context(), C}}};
  root.backward_workspace = product({V, C, e});
  root.forward_flops = 2.0 * T * C * V;
  root.forward_memory_bytes = 5.0 * T * C * e + 3.0 * T * V * 4;
  root.forward_ops = 14;
  append(root.params, layer_norm("ln_f", C));
  if (code == GptCode::MinGpt) {
    // An untied head; the loss of the low-precision logits as they are (no fp32 copy).
    root.params.push_back({"lm_head.weight", {V, C}});
    root.activations.saved = sum({product({T, C, e}), 8 * T, product({T, V, e})});
    root.activations.forward_transient = product({T, V, e});
    root.activations.backward_transient = product({2, T, V, e});
    return root;
  }
  root.activations.saved = sum({product({T, C, e}), 8 * T, product({T, V, 4})});
  root.activations.forward_transient = sum({product({T, V, e}), e < 4 ? product({T, V, 4}) : 0});
  root.activations.backward_transient = product({2, T, V, 4});
  return root;
}

}  // namespace

fsdp::PlanModel describe_gpt(const GPTConfig& config, c10::ScalarType compute_dtype, int64_t resident_bytes,
                             GptCode code) {
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
  const int64_t T = config.max_seq, C = config.dim;
  // One unit per block is built here: a count beyond the flags' bound would take gigabytes first.
  TORCH_CHECK(config.layers >= 1 && config.layers <= kMaxLayers, "the GPT has ", config.layers,
              " blocks; gpt_train builds 1 to ", kMaxLayers, " (--layers' bound)");
  fsdp::PlanModel model;
  model.name = std::string(code == GptCode::MinGpt ? "minGPT " : "GPT ") + std::to_string(config.layers) + "x" + std::to_string(C) + ", " +
               std::to_string(config.heads) + " heads, seq " + std::to_string(T) + ", vocab " +
               std::to_string(config.vocab_size);
  model.root = root_unit(config, e, code);
  model.root_pre.saved = sum({product({T, C, e}), code == GptCode::MinGpt ? product({T, C}) : 0});  // minGPT: a dropout mask
  model.root_pre.forward_transient = product({T, C, e});
  model.root_pre.backward_transient = product({T, C, e});
  for (int64_t i = 0; i < config.layers; ++i) model.units.push_back(block_unit(config, i, e, code));
  model.sequence_tokens = T;
  model.input_bytes_per_sequence = 2 * T * 8;  // inputs and targets, int64
  model.resident_bytes = resident_bytes;
  model.step_all_reduce_bytes = 4;  // the step's loss, summed over the ranks (fp32)
  model.compute_dtype = compute_dtype;
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
  if (o.data_is_tokens) bytes = bytes / 2 * 2;  // uint16 ids, held as they are
  return std::min(bytes, o.max_data_bytes);
}

fsdp::PlanSetup plan_setup(const TrainOptions& o, int world, int ranks_per_host,
                           const fsdp::PlanDevice& device, const fsdp::PlanLinks& links) {
  const c10::ScalarType compute = o.fsdp.mixed_precision().param_dtype().value_or(c10::kFloat);
  fsdp::PlanSetup setup;
  setup.model = describe_gpt(o.model, compute, training_data_bytes(o));
  setup.world = {world, ranks_per_host};
  setup.device = device;
  setup.links = links;
  setup.policy.fsdp = o.fsdp;
  setup.policy.batch = o.batch;
  setup.policy.micro_batches = o.grad_accum;
  setup.policy.no_sync = o.no_sync && o.grad_accum > 1;
  return setup;
}

}  // namespace gpt
