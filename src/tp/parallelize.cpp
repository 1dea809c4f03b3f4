// parallelize_module (parallelize.h): the plan matched against the model's module paths, each
// matched layer's parameters cut to this rank's part, its style registered for its holder, and
// every parameter's placement recorded for clipping and checkpoints.
#include <fsdp/parallelize.h>

#include "tp/parallel_styles.h"
#include "tp/tied_backward_scope.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/embedding.h>

#include <fnmatch.h>

#include <atomic>

#include <map>
#include <mutex>
#include <unordered_map>

namespace fsdp::tp {

namespace {

struct StyleEntry {
  std::weak_ptr<torch::nn::Module> module;  // a freed module's address may be reused
  std::shared_ptr<detail::StyledLayer> style;
};

// A module given to parallelize_module: its parameters that no style splits are replicated over
// `tp`.
struct ScopeEntry {
  std::weak_ptr<torch::nn::Module> module;
  std::shared_ptr<TensorParallel> tp;
};

// Each parallelized layer's style (which holds its own parameters' placements) and each
// parallelized module's group: what a parameter's placement is read from, once, when fully_shard
// records it ([Note: one placement per parameter] in src/core/flat_param.h). No table by tensor.
struct Registry {
  std::mutex mutex;
  std::unordered_map<const torch::nn::Module*, StyleEntry> styles;
  std::unordered_map<const torch::nn::Module*, ScopeEntry> scopes;
  std::unordered_map<const torch::nn::Module*, std::weak_ptr<torch::nn::Module>> held;  // by a Parallel
};

// How many layers were ever parallelized in this process: while none, a holder's call (every
// layer of a model that may be split, such as gpt_train's) skips the registry's lock.
std::atomic<int64_t> styled_layers{0};

Registry& registry() {
  static Registry instance;
  return instance;
}

std::vector<std::string> path_atoms(const std::string& path) {
  std::vector<std::string> atoms;
  size_t start = 0;
  for (size_t dot; (dot = path.find('.', start)) != std::string::npos; start = dot + 1) {
    atoms.push_back(path.substr(start, dot - start));
  }
  atoms.push_back(path.substr(start));
  return atoms;
}

// PyTorch's rule: the pattern and the path have as many components, each matching (fnmatch).
bool matches(const std::string& pattern, const std::string& path) {
  const auto p = path_atoms(pattern), m = path_atoms(path);
  if (p.size() != m.size()) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (fnmatch(p[i].c_str(), m[i].c_str(), 0) != 0) return false;
  }
  return true;
}

const char* style_name(const ParallelStyle& style) {
  switch (style.index()) {
    case 0:
      return "ColwiseParallel";
    case 1:
      return "RowwiseParallel";
    case 2:
      return "SequenceParallel";
    default:
      return "PrepareModuleInput";
  }
}

// A Linear: its own parameters are weight [out, in] and perhaps bias [out], no children. The
// style computes x·weightᵀ + bias itself (parallelize.h says so): torch::nn::Linear's math.
void check_linear(torch::nn::Module& module, const std::string& name, const char* style) {
  const auto params = module.named_parameters(/*recurse=*/false);
  const at::Tensor* weight = params.find("weight");
  const at::Tensor* bias = params.find("bias");
  const bool shaped = weight && weight->dim() == 2 && module.children().empty() &&
                      params.size() == (bias ? 2u : 1u) &&
                      (!bias || (bias->dim() == 1 && bias->size(0) == weight->size(0)));
  TORCH_CHECK(shaped, style, " on '", name, "': it splits a Linear (weight [out, in], bias [out]) "
              "or, row-wise, an Embedding; '", name, "' is a ", module.name(),
              ". Put the style on its Linear layers");
}

// Keeps this rank's part of `param` along `dim` (`chunks` parts side by side, each split).
void keep_part(at::Tensor& param, int64_t dim, int64_t chunks, const TensorParallel& tp, const std::string& name) {
  const int64_t size = param.size(dim);
  TORCH_CHECK(size % (chunks * tp.size()) == 0, "tensor parallelism: '", name, "' has ", size,
              " along dimension ", dim, (chunks > 1 ? " (" + std::to_string(chunks) + " fused parts)" : std::string()),
              ", which does not split over ", tp.size(), " ranks; choose a tensor-parallel size dividing it");
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> parts;
  for (const at::Tensor& chunk : param.chunk(chunks, dim)) parts.push_back(tp.chunk_along(chunk, dim));
  param.set_data(at::cat(parts, dim).contiguous());
}

// The gradient of a replicated parameter used on this rank's part of the sequence is its part
// of the sum: the hook adds the other ranks' before it is accumulated (and reduced by FSDP).
void sum_gradient_over_ranks(at::Tensor& param, std::shared_ptr<TensorParallel> tp) {
  if (!param.requires_grad() || tp->size() == 1) return;
  param.register_hook([tp](const at::Tensor& grad) {
    torch::NoGradGuard no_grad;
    at::Tensor sum = grad.contiguous().clone();
    tp->all_reduce_(sum);
    return sum;
  });
}

// [Note: a layer called around its holder]
// A layer's call that skips its holder skips its communication and gives wrong values silently.
// `layer->forward(x)` goes through the holder ([Note: layer->forward through its holder]); a
// layer of the plan that no fsdp::tp::Parallel holds is refused by parallelize_module (check_held),
// before any forward. What is left (`layer.ptr()->forward(x)`, `*layer`, a Sequential of the
// layers) is caught in backward: a split parameter's gradient arrives, but its holder ran fewer
// forwards under grad mode than the hook has fired (each backward takes one forward: a count per
// hook, not a flag once set, so every backward is checked, and a pipeline's micro-batches may run
// several forwards before their backwards). A second backward of one graph (retain_graph) is
// refused alike.
void check_ran_through_holder(at::Tensor& param, std::shared_ptr<detail::StyledLayer> layer) {
  if (!param.requires_grad()) return;
  auto seen = std::make_shared<int64_t>(0);  // the backwards this hook has seen
  param.register_hook([layer, seen](const at::Tensor&) {
    const int64_t runs = layer->grad_runs();
    if (runs <= *seen && detail::tied_backwards.load() > 0) return at::Tensor();  // a tie's other use
    TORCH_CHECK(runs > *seen, "tensor parallelism: '", layer->name(), "' was called directly, not "
                "through its fsdp::tp::Parallel holder, so its communication did not run: declare it "
                "as fsdp::tp::Parallel<...> in the model and call it as `layer(x)` or `layer->forward(x)`");
    ++*seen;
    return at::Tensor();
  });
}

// A layer of the plan that communicates must be held by an fsdp::tp::Parallel: called through any
// other holder (a plain torch::nn::Linear member) it would skip its communication on every call.
// A SequenceParallel layer runs as it is, so any holder will do.
void check_held(const std::string& path, torch::nn::Module& module, const ParallelStyle& style) {
  if (std::holds_alternative<SequenceParallel>(style)) return;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.held.find(&module);
  const bool held = it != r.held.end() && !it->second.expired();
  TORCH_CHECK(held, "parallelize_module: '", path, "' (", style_name(style), ") is not held by an "
              "fsdp::tp::Parallel holder, so calling it would skip its communication and give wrong "
              "values: declare it in the model as fsdp::tp::Parallel<...> of the holder it was (a ",
              module.name(), "), e.g. `fsdp::tp::Parallel<torch::nn::Linear> ", path.substr(path.rfind('.') + 1),
              "{nullptr};`, and call it as `", path.substr(path.rfind('.') + 1), "(x)` or `->forward(x)`");
}

struct Split {
  std::shared_ptr<detail::StyledLayer> layer;
  std::vector<std::pair<std::string, Placement>> parts;  // the layer's own parameters, split or not
  std::vector<std::string> summed;                         // replicated, gradient summed over ranks
};

// The layer's parameters as `style` splits them ([Note: a style's two readers]): its own in
// `parts`, and those whose gradient is summed over the ranks (a SequenceParallel module's, its
// children's too) in `summed`.
void split_params(Split& split, torch::nn::Module& module, const ParallelStyle& style,
                  const std::shared_ptr<TensorParallel>& tp) {
  const bool embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(&module) != nullptr;
  const bool own_only = !std::holds_alternative<SequenceParallel>(style);
  for (const auto& item : module.named_parameters(/*recurse=*/!own_only)) {
    const ParamSplit how = split_of(style, item.key(), embedding);
    if (own_only) split.parts.push_back({item.key(), {tp, how.dim, how.fused_chunks, item.value().sizes().vec()}});
    if (how.gradient_summed) split.summed.push_back(item.key());
  }
}

Split apply_style(torch::nn::Module& module, const std::string& name, const ParallelStyle& style,
                  const std::shared_ptr<TensorParallel>& tp, bool prepared) {
  Split split;
  if (const auto* col = std::get_if<ColwiseParallel>(&style)) {
    TORCH_CHECK(col->fused_chunks() >= 1, "ColwiseParallel on '", name, "': fused_chunks must be >= 1");
    check_linear(module, name, "ColwiseParallel");
    split.layer = detail::make_colwise(tp, module, name, *col, prepared);
    split_params(split, module, style, tp);
  } else if (const auto* row = std::get_if<RowwiseParallel>(&style)) {
    TORCH_CHECK(row->output_layout() != Layout::ShardLast, "RowwiseParallel on '", name,
                "': its output is whole features (Replicate or ShardSequence), not ShardLast");
    if (auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) {
      const auto& o = embedding->options;
      TORCH_CHECK(!o.padding_idx() && !o.max_norm() && !o.sparse(), "RowwiseParallel on '", name,
                  "': a vocabulary-parallel Embedding takes no padding_idx, max_norm or sparse");
      split.layer = detail::make_vocab_parallel_embedding(tp, module, name, *row, o.num_embeddings());
    } else {
      check_linear(module, name, "RowwiseParallel");
      split.layer = detail::make_rowwise_linear(tp, module, name, *row);
    }
    split_params(split, module, style, tp);
  } else if (std::holds_alternative<SequenceParallel>(style)) {
    split.layer = detail::make_sequence_parallel(tp, module, name);
    split_params(split, module, style, tp);
  } else {
    const auto& prepare = std::get<PrepareModuleInput>(style);
    const bool gathers = prepare.input_layout() == Layout::ShardSequence &&
                         prepare.desired_input_layout() == Layout::Replicate;
    const bool chunks = prepare.input_layout() == Layout::Replicate &&
                        prepare.desired_input_layout() == Layout::ShardSequence;
    TORCH_CHECK(gathers || chunks, "PrepareModuleInput on '", name, "': from ",
                detail::to_string(prepare.input_layout()), " to ",
                detail::to_string(prepare.desired_input_layout()),
                " is not supported; it re-lays ShardSequence to Replicate or back");
    split.layer = detail::make_prepared_input(tp, module, name, prepare);
  }
  return split;
}

}  // namespace

ParamSplit split_of(const ParallelStyle& style, const std::string& name, bool embedding) {
  if (const auto* col = std::get_if<ColwiseParallel>(&style)) return {0, col->fused_chunks(), false};
  if (const auto* row = std::get_if<RowwiseParallel>(&style)) {
    if (embedding) return {0, 1, false};             // the vocabulary's rows
    if (name == "weight") return {1, 1, false};      // the input features
    return {-1, 1, row->output_layout() == Layout::ShardSequence};  // the bias, added once
  }
  return {-1, 1, std::holds_alternative<SequenceParallel>(style)};
}

const ParallelStyle* style_for(const ParallelizePlan& plan, const std::string& path) {
  for (const auto& [pattern, style] : plan) {
    if (matches(pattern, path)) return &style;
  }
  return nullptr;
}

void parallelize_module(torch::nn::Module& model, std::shared_ptr<TensorParallel> tp,
                        const ParallelizePlan& plan) {
  TORCH_CHECK(tp, "parallelize_module: no TensorParallel group");
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) modules[item.key()] = item.value();
  // Which module each pattern names; a module named twice is refused.
  std::map<std::string, const ParallelStyle*> chosen;
  for (const auto& [pattern, style] : plan) {
    bool any = false;
    for (const auto& [path, module] : modules) {
      if (!matches(pattern, path)) continue;
      any = true;
      TORCH_CHECK(!chosen.count(path), "parallelize_module: '", path, "' is matched by two entries of the plan (",
                  style_name(*chosen[path]), " and ", style_name(style), " by '", pattern, "')");
      chosen[path] = &style;
    }
    TORCH_CHECK(any, "parallelize_module: the plan's '", pattern, "' matches no module of the model "
                "(paths are like '", modules.empty() ? std::string("h.0.attn") : modules.begin()->first, "')");
  }
  // Every parameter replicated over `tp` unless a style splits it.
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    std::weak_ptr<torch::nn::Module> owner = model.weak_from_this();
    TORCH_CHECK(!owner.expired(), "parallelize_module: the model must be held by a shared_ptr (a TORCH_MODULE "
                "holder or std::make_shared), as LibTorch's modules are");
    r.scopes[&model] = {owner, tp};
  }
  for (const auto& [path, style] : chosen) check_held(path, *modules[path], *style);
  for (const auto& [path, style] : chosen) {
    torch::nn::Module& module = *modules[path];
    Split split = apply_style(module, path, *style, tp, input_prepared(plan, path));  // as moves_of reads it
    auto own = module.named_parameters(/*recurse=*/false);
    for (auto& [which, placement] : split.parts) {
      at::Tensor& param = *own.find(which);
      if (!placement.replicated()) {
        keep_part(param, placement.dim, placement.fused_chunks, *tp, path + "." + which);
        check_ran_through_holder(param, split.layer);
      }
    }
    split.layer->set_placements(std::move(split.parts));
    split.layer->keep_shapes();
    auto all = module.named_parameters(/*recurse=*/true);
    for (const auto& which : split.summed) sum_gradient_over_ranks(*all.find(which), tp);
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.styles[&module] = {modules[path], std::move(split.layer)};
    ++styled_layers;
  }
}

std::optional<Placement> placement_of(const at::Tensor& param) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& [module, entry] : r.styles) {
    if (entry.module.expired()) continue;
    if (auto placement = entry.style->placement_of(param)) return placement;
  }
  for (const auto& [module, entry] : r.scopes) {
    const auto alive = entry.module.lock();
    if (!alive) continue;
    for (const auto& p : alive->parameters()) {
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return Placement{entry.tp, -1, 1, param.sizes().vec()};
    }
  }
  return std::nullopt;
}

at::Tensor whole_of(const at::Tensor& part, const Placement& placement) {
  if (placement.replicated() || placement.tp->size() == 1) return part;
  const int64_t d = placement.dim, chunks = placement.fused_chunks, ranks = placement.tp->size();
  const at::Tensor gathered = placement.tp->all_gather_along(part, d);
  if (chunks == 1) return gathered;
  // Rank-major [rank][chunk][rows] along d, to the parameter's chunk-major [chunk][rank][rows].
  const int64_t rows = part.size(d) / chunks;
  return gathered.unflatten(d, {ranks, chunks, rows}).transpose(d, d + 1).flatten(d, d + 2).contiguous();
}

at::Tensor whole_from_parts(const std::vector<at::Tensor>& parts, const Placement& placement) {
  TORCH_CHECK(!parts.empty(), "whole_from_parts: no parts");
  if (placement.replicated()) return parts.front();
  // Chunk-major: fused part c of every rank, rank by rank, then the next part.
  std::vector<at::Tensor> pieces;
  for (int64_t c = 0; c < placement.fused_chunks; ++c) {
    for (const at::Tensor& part : parts) pieces.push_back(part.chunk(placement.fused_chunks, placement.dim)[c]);
  }
  return at::cat(pieces, placement.dim);
}

at::Tensor part_of_whole(const at::Tensor& whole, const Placement& placement, int rank) {
  if (placement.replicated()) return whole;
  const int64_t ranks = placement.tp->size();
  std::vector<at::Tensor> parts;
  for (const at::Tensor& chunk : whole.chunk(placement.fused_chunks, placement.dim)) {
    const int64_t rows = chunk.size(placement.dim) / ranks;
    parts.push_back(chunk.narrow(placement.dim, rank * rows, rows));
  }
  return at::cat(parts, placement.dim);
}

namespace detail {

LayerStyle* style_of(const torch::nn::Module* module) {
  if (styled_layers.load(std::memory_order_relaxed) == 0) return nullptr;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.styles.find(module);
  if (it == r.styles.end()) return nullptr;
  if (it->second.module.expired()) {
    r.styles.erase(it);
    return nullptr;
  }
  return it->second.style.get();
}

void mark_held(const std::shared_ptr<torch::nn::Module>& module) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.held[module.get()] = module;
}

}  // namespace detail

}  // namespace fsdp::tp
