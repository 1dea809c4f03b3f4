#pragma once
/// Tensor parallelism for LibTorch modules, in the spirit of PyTorch's parallelize_module: a plan
/// names the model's layers (by path, '*' matching one component) and how each is split over the
/// ranks of a tensor-parallel group; parallelize_module() keeps each rank's part of their
/// parameters and makes the layers communicate. fully_shard() then shards what each rank keeps
/// over the data-parallel ranks (2-D parallelism; docs/tensor-parallel.md).
///
/// C++ cannot patch a forward, so a layer that communicates is called through its holder: a
/// model declares it as `fsdp::tp::Parallel<torch::nn::Linear>` (as a unit is declared
/// `fsdp::Unit<Block>`), a plain pass-through until the model is parallelized; `layer(x)` and
/// `layer->forward(x)` both go through it. A layer of the plan that no Parallel holder holds is
/// refused by parallelize_module, naming it; one called around its holder otherwise
/// (`layer.ptr()->forward(x)`) fails in the backward of that forward.
///
/// Example (Megatron's MLP: column-wise, then row-wise; one all-reduce each way):
///   struct MlpImpl : torch::nn::Module {
///     MlpImpl() : up(register_module("up", torch::nn::Linear(64, 256))),
///                 down(register_module("down", torch::nn::Linear(256, 64))) {}
///     torch::Tensor forward(torch::Tensor x) { return down(torch::relu(up(x))); }
///     fsdp::tp::Parallel<torch::nn::Linear> up, down;
///   };
///   TORCH_MODULE(Mlp);
///
///   fsdp::DeviceMesh mesh(dist->world, {{"dp", 2}, {"tp", 2}});
///   auto tp = std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp"));
///   Mlp mlp;
///   fsdp::tp::parallelize_module(*mlp, tp, {{"up", fsdp::tp::ColwiseParallel()},
///                                           {"down", fsdp::tp::RowwiseParallel()}});
///   auto model = fsdp::fully_shard(mlp, mesh.group("dp"));

#include <fsdp/device_mesh.h>
#include <fsdp/tensor_parallel.h>
#include <fsdp/tp_placement.h>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace fsdp::tp {

/// How a tensor lies over the tensor-parallel ranks (DTensor's placements, for the activations
/// of a transformer: [batch, sequence, features]).
enum class Layout {
  Replicate,      ///< every rank holds all of it
  ShardSequence,  ///< split along dimension 1, the sequence (sequence parallelism)
  ShardLast,      ///< split along the last dimension, the features (a column-wise output)
};

/// Output features split (a Linear's weight rows, its bias). Its input arrives Replicate (its
/// gradient summed over the ranks in backward) or ShardSequence (all-gathered, the gradient
/// reduce-scattered); inside a module whose input PrepareModuleInput made whole, it takes that
/// input as it is. Its output stays ShardLast (the next layer row-wise, or the loss) or is
/// all-gathered (Replicate).
struct ColwiseParallel {
  TORCH_ARG(Layout, input_layout) = Layout::Replicate;
  TORCH_ARG(Layout, output_layout) = Layout::ShardLast;
  /// A fused layer whose output features are `fused_chunks` parts side by side (GPT-2's c_attn:
  /// q, k and v): each part is split, so that every rank keeps its heads of each.
  TORCH_ARG(int64_t, fused_chunks) = 1;
};

/// Input features split (a Linear's weight columns; its bias replicated, added once, after the
/// reduction), or an Embedding's rows (vocabulary parallelism: each rank looks up its ids, the
/// others' rows are zeros, and the sum crosses the group). The output is all-reduced
/// (Replicate) or reduce-scattered along the sequence (ShardSequence).
struct RowwiseParallel {
  TORCH_ARG(Layout, output_layout) = Layout::Replicate;
};

/// A layer that runs on the sequence shard as it is (norms, dropout): its parameters stay whole
/// on every rank and their gradients, each rank's from its part of the sequence, are summed
/// over the group in backward.
struct SequenceParallel {};

/// Re-lays a module's (first) input before its forward: ShardSequence -> Replicate all-gathers
/// it along the sequence (backward reduce-scatters); Replicate -> ShardSequence keeps this
/// rank's chunk (backward all-gathers). An attention block or an MLP, whose column-wise layers
/// then share the one gathered input.
struct PrepareModuleInput {
  TORCH_ARG(Layout, input_layout) = Layout::ShardSequence;
  TORCH_ARG(Layout, desired_input_layout) = Layout::Replicate;
};

using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput>;
/// Module paths ('*' matches one component: "h.*.attn.q_proj") and their styles.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

// [Note: a style's two readers]
// What a style does is said once, without tensors: what it splits (split_of) and what it moves
// (moves_of). parallelize_module cuts the parameters by split_of and its layers issue the
// collectives moves_of lists (src/tp/parallel_styles.cpp; tests/tp_moves_test.cpp checks the two
// agree byte for byte through comm_stats); the planner (fsdp_plan) sizes each rank's parameters
// by split_of and counts TP's bytes by moves_of, applying a model's own plan to its layer table
// (style_for, input_prepared), so that a model family's plan is all the planner needs to know of it.

/// What a style does to one of a layer's own parameters.
struct ParamSplit {
  int64_t dim = -1;              ///< the dimension split over the ranks; -1: replicated
  int64_t fused_chunks = 1;      ///< parts side by side along `dim`, each split
  bool gradient_summed = false;  ///< replicated, used on this rank's part of the sequence: its
                                 ///< gradient summed over the ranks in backward
};
/// How `style` splits parameter `name` ("weight", "bias"; any of a SequenceParallel module's) of
/// a layer, an Embedding when `embedding`.
ParamSplit split_of(const ParallelStyle& style, const std::string& name, bool embedding);
/// The style `plan` gives the module at `path` (PyTorch's matching: as many components, each
/// matching, '*' any one), or null.
const ParallelStyle* style_for(const ParallelizePlan& plan, const std::string& path);
/// Whether the module at `path` runs inside a module that `plan` gives a PrepareModuleInput
/// gathering its input (ShardSequence -> Replicate): a column-wise layer there takes that input
/// as it is and moves nothing of its own (q, k and v share the attention's one gather).
bool input_prepared(const ParallelizePlan& plan, const std::string& path);

/// One collective a style issues, without tensors.
struct Move {
  enum Kind { AllGather, ReduceScatter, AllReduce } kind = AllGather;
  bool backward = false;       ///< issued by backward (else by forward)
  std::string what;            ///< "input", "output", "input's gradient", "bias's gradient"
  int64_t elements = 0;        ///< the whole tensor's: gathered, or before its scatter
  bool per_sequence = true;    ///< an activation's, per sequence; else a parameter's gradient,
                               ///< once per backward
  std::string parameter;       ///< the parameter whose gradient it sums (as `params` names it)
};

/// A styled layer's (or module's) sizes, whole, as moves_of reads them.
struct StyledShape {
  int64_t sequence = 0;      ///< tokens of one whole sequence
  int64_t in_features = 0;   ///< its input's width (a module's: its first layer's input)
  int64_t out_features = 0;  ///< its output's width (an Embedding's: its rows' width)
  bool embedding = false;
  bool input_prepared = false;  ///< inside a gathering PrepareModuleInput (input_prepared)
  /// Its parameters, by name as split_of takes them ("weight"; a SequenceParallel module's its
  /// children's too: "ln_q.weight"), with their whole element counts.
  std::vector<std::pair<std::string, int64_t>> params;
};

/// What `style` moves for one layer of `shape`, in issue order: forward's re-layouts of its input
/// and output (ColwiseParallel with a ShardSequence input: its input all-gathered along the
/// sequence, the input's gradient reduce-scattered; a Replicate input: the gradient all-reduced;
/// a Replicate output: all-gathered along the features. RowwiseParallel: its output
/// reduce-scattered (ShardSequence; backward all-gathers the gradient) or all-reduced. A
/// PrepareModuleInput: its input gathered, the gradient reduce-scattered; or chunked, the gradient
/// all-gathered), then the all-reduces of the gradients split_of says are summed.
std::vector<Move> moves_of(const ParallelStyle& style, const StyledShape& shape);
/// What one of `tp_size` ranks sends for `move` of `element_bytes` elements (the ring's, as
/// comm_stats counts them): (T-1)/T·n·e to all-gather or reduce-scatter n elements,
/// 2(T-1)/T·n·e to all-reduce them; nullopt beyond int64.
std::optional<int64_t> sent_bytes(const Move& move, int64_t tp_size, int64_t element_bytes);

/// Splits the parameters of the plan's layers over `tp`'s ranks (each keeps its part, from the
/// model's current values: build every rank's model alike, e.g. from one seed), and makes them
/// communicate when called through their fsdp::tp::Parallel holder. Every pattern must match a
/// module, every module at most one pattern; a size that does not split over the ranks is refused
/// naming the layer. Call it before fully_shard and before making the optimizer.
void parallelize_module(torch::nn::Module& model, std::shared_ptr<TensorParallel> tp,
                        const ParallelizePlan& plan);

/// The placement of a parameter of a parallelized model (every parameter of the module given to
/// parallelize_module has one), or nullopt.
std::optional<Placement> placement_of(const at::Tensor& param);
/// The whole parameter from this rank's `part` of it (in the parameter's shape: a full state
/// dict's tensor), all-gathered over the placement's ranks; a replicated one as it is. A
/// collective: every rank of the group calls it, in the same order.
at::Tensor whole_of(const at::Tensor& part, const Placement& placement);
/// The whole parameter from every rank's part (`parts[r]`: tp rank r's, in the part's shape);
/// no communication. A replicated one: parts[0].
at::Tensor whole_from_parts(const std::vector<at::Tensor>& parts, const Placement& placement);
/// Tensor-parallel rank `rank`'s part of `whole` (the whole parameter's shape), as
/// parallelize_module cuts it; no communication. A replicated one: `whole`.
at::Tensor part_of_whole(const at::Tensor& whole, const Placement& placement, int rank);

/// The attention heads each tensor-parallel rank runs: `heads` / tp size (a column-wise q, k or v
/// keeps its ranks' heads, so a model's attention views its activations by this count). Refuses
/// a tp size that does not divide `heads`, naming both; `what` names them ("key/value heads").
int64_t local_heads(int64_t heads, int tp_size, const std::string& what = "attention heads");
int64_t local_heads(int64_t heads, const TensorParallel& tp, const std::string& what = "attention heads");

/// Seeds this process's default generators (CPU, and every CUDA device's: torch::manual_seed)
/// for dropout under tensor parallelism: `seed` + the index of this rank's tp group, so every rank
/// of a tp group draws the same masks (a replicated region's activations stay equal, and with them
/// the replicated parameters: norms, positions) and each group (each data-parallel position) its
/// own. Megatron's default generator; `tp_dim` names the mesh's tensor-parallel dimension. Call it
/// after fully_shard, where a 1-D program reseeds with `seed + rank` (docs/porting.md).
void manual_seed(const DeviceMesh& mesh, uint64_t seed, const std::string& tp_dim = "tp");
/// The index of this rank's tp group: its coordinates along every dimension but `tp_dim`,
/// row-major.
int64_t tp_group_index(const DeviceMesh& mesh, const std::string& tp_dim = "tp");

namespace detail {
/// What a parallelized layer runs around (or instead of) its own forward.
class LayerStyle {
 public:
  virtual ~LayerStyle() = default;
  virtual at::Tensor run(const at::Tensor& input, const std::function<at::Tensor(const at::Tensor&)>& forward) = 0;
};
/// The style of `module`, or null when it is not a parallelized layer.
LayerStyle* style_of(const torch::nn::Module* module);
/// Records that a Parallel holder holds `module` (parallelize_module refuses a layer no holder
/// holds: its every call would skip the communication).
void mark_held(const std::shared_ptr<torch::nn::Module>& module);

/// Marks its Parallel's module as held, whichever constructor built the holder (inherited ones too).
struct HolderMark {
  template <class Holder>
  explicit HolderMark(const Holder& holder) {
    if (!holder.is_empty()) mark_held(holder.ptr());
  }
};

// [Note: layer->forward through its holder]
// A LibTorch program calls a layer as `layer->forward(x)`: through a holder's `->` that reaches
// the module itself and would skip the style. So Parallel's `->` shows the module as
// ParallelMembers, its own type with a one-tensor `forward` hidden by one that runs the style
// (as fsdp::Unit's [Note: unit->forward]); it adds no data and is never constructed.
template <class Impl>
struct ParallelMembers : Impl {
  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    if constexpr (sizeof...(Args) == 1 && (std::is_convertible_v<Args, const at::Tensor&> && ...)) {
      Impl& self = *this;
      LayerStyle* style = style_of(&self);
      if (!style) return at::Tensor(self.forward(std::forward<Args>(args)...));
      return style->run(std::forward<Args>(args)..., [&self](const at::Tensor& y) { return at::Tensor(self.forward(y)); });
    } else {
      return Impl::forward(std::forward<Args>(args)...);
    }
  }
};
}  // namespace detail

/// Holds a layer that tensor parallelism may split: declared, built and registered as the holder
/// it replaces (`fsdp::tp::Parallel<torch::nn::Linear> q{nullptr};`), called as it (`q(x)`).
/// Until parallelize_module names it, a plain call.
template <class M>
class Parallel : public M {
 public:
  using M::M;
  Parallel() : M(nullptr) {}
  /* implicit */ Parallel(std::nullptr_t) : M(nullptr) {}
  /* implicit */ Parallel(M module) : M(std::move(module)) {}

  at::Tensor operator()(const at::Tensor& x) {
    detail::LayerStyle* style = detail::style_of(this->ptr().get());
    if (!style) return M::operator()(x);
    return style->run(x, [this](const at::Tensor& y) { return M::operator()(y); });
  }
  at::Tensor forward(const at::Tensor& x) { return (*this)(x); }
  /// The module's members, `forward` going through the holder ([Note: layer->forward through
  /// its holder]).
  auto operator->() {
    using Impl = typename M::ContainedType;
    if constexpr (std::is_final_v<Impl>) {
      return M::operator->();
    } else {
      return static_cast<detail::ParallelMembers<Impl>*>(M::operator->());
    }
  }
  auto operator->() const { return M::operator->(); }

 private:
  detail::HolderMark mark_{*this};
};

/// A layer held as a torch::nn::AnyModule (a model's choice of norm or attention).
template <>
class Parallel<torch::nn::AnyModule> : public torch::nn::AnyModule {
 public:
  Parallel() = default;
  /* implicit */ Parallel(torch::nn::AnyModule module) : torch::nn::AnyModule(std::move(module)) {}

  at::Tensor forward(const at::Tensor& x) {
    detail::LayerStyle* style = is_empty() ? nullptr : detail::style_of(ptr().get());
    if (!style) return torch::nn::AnyModule::forward(x);
    return style->run(x, [this](const at::Tensor& y) { return torch::nn::AnyModule::forward(y); });
  }

 private:
  detail::HolderMark mark_{*this};
};

}  // namespace fsdp::tp
