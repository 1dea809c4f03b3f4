#pragma once
/// Not for users: the plumbing between a Unit holder (a template in <fsdp/fully_shard.h>, so
/// compiled in the user's program) and the sharded model it belongs to. The engine includes this
/// header, not the public face ([Note: the public face carries no plumbing]).

#include <fsdp/distributed.h>
#include <fsdp/options.h>
#include <fsdp/output_tensors.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace fsdp {

class ParamGroup;
class FsdpState;
struct UnitInfo;

// [Note: the public face carries no plumbing]
// <fsdp/fully_shard.h> is what a user reads: Unit, fully_shard, NoSyncGuard. What its templates
// call into (the unit registry, the forward hooks, deferred sharding) lives here, in namespace
// detail, and the core layer's headers include this file, never the face
// (tools/layers/check_layers.py refuses a src/ header that includes <fsdp/fully_shard.h>).

/// Initialises one parameter (`name` relative to its unit) before it is sharded: see
/// fully_shard_deferred.
using ParamInit = std::function<void(const std::string& name, torch::Tensor& param)>;

namespace detail {

/// Where a Unit holder finds its runtime once fully_shard() has run; empty before.
struct UnitSlot {
  std::shared_ptr<ParamGroup> unit;
  FsdpState* model = nullptr;              // the sharded model the unit belongs to
  std::shared_ptr<FsdpState> owned_model;  // the root's only: the same model, owned (with every unit)
};

/// Registers `module` as a unit and returns its slot (fully_shard finds units through this).
std::shared_ptr<UnitSlot> register_unit(const torch::nn::Module* module);
/// The slot of the unit holding `module`; null if no Unit holds it.
std::shared_ptr<UnitSlot> find_unit(const torch::nn::Module* module);
/// Every sharded model whose root unit is alive.
std::vector<std::shared_ptr<FsdpState>> sharded_models();

// [Note: unit->forward]
// Every public LibTorch program calls a submodule as `sub->forward(x)`. Through a Unit, `->`
// would reach the module itself and skip the unit: the module would compute on its 1-D shard.
// So a Unit's `->` shows the module as UnitMembers, the module's own type with `forward` hidden
// by one that calls the unit; every other member (parameters(), train(), fields) is the
// module's. (UnitMembers adds no data and is never constructed: it only renames `forward`.)
template <class U>
struct UnitMembers : U::Impl {
  template <class... Args>
  auto forward(Args&&... args) {
    return U::holding(this)(std::forward<Args>(args)...);
  }
};

void pre_forward(UnitSlot& unit);
/// `training`: the unit's module is in training mode (module->is_training()).
void post_forward(UnitSlot& unit, const std::vector<at::Tensor>& inputs,
                  const std::vector<at::Tensor>& outputs, bool training);

/// Shards the model; `deferred` holds the units fully_shard_deferred has sharded already.
std::shared_ptr<FsdpState> shard_model(const std::shared_ptr<torch::nn::Module>& root,
                                       UnitSlot& root_slot, ProcessGroup& group,
                                       const FullyShardOptions& options,
                                       std::shared_ptr<FsdpState> deferred = nullptr,
                                       const ParamInit& init = nullptr);

/// While a fully_shard_deferred factory runs on this thread: shards the unit `module` at once.
void shard_if_deferred(UnitSlot& slot, const std::shared_ptr<torch::nn::Module>& module);

struct DeferredSharding;
/// The sharding of one fully_shard_deferred call, active on this thread while the factory runs.
class DeferredScope {
 public:
  DeferredScope(ProcessGroup& group, const FullyShardOptions& options, ParamInit init);
  ~DeferredScope();
  /// The factory has returned: Unit holders built from now on are ordinary.
  void close();
  std::shared_ptr<FsdpState> state() const;
  const ParamInit& init() const;

 private:
  std::unique_ptr<DeferredSharding> sharding_;
};
std::vector<UnitInfo> unit_infos(const FsdpState& state);
void set_no_sync(FsdpState& state, bool no_sync);
/// Called for each unit as its reduced gradient is issued: its trainable parameters, their
/// gradients (views of its gradient shard) and a wait that returns once those hold this
/// backward's gradient in memory the host may read.
using GradientsReducedHook = std::function<void(std::vector<at::Tensor> params, std::vector<at::Tensor> grads,
                                                std::function<void()> wait)>;
void set_gradients_reduced_hook(FsdpState& state, GradientsReducedHook hook);
const std::string& unit_name(const UnitSlot& unit);

/// Mixed precision: the dtype a unit's floating-point inputs are cast to (none: unchanged).
std::optional<c10::ScalarType> input_dtype(const UnitSlot& unit);
inline at::Tensor cast_input(std::optional<c10::ScalarType> dtype, const at::Tensor& t) {
  return dtype && t.defined() && t.is_floating_point() ? t.to(*dtype) : t;
}
template <class T, class = std::enable_if_t<!std::is_convertible_v<T, const at::Tensor&>>>
T&& cast_input(std::optional<c10::ScalarType>, T&& arg) {
  return std::forward<T>(arg);
}

/// Whether the unit's model is inside a SummonFullParams scope: its units are plain calls then.
bool holds_full_params(const UnitSlot& unit);
/// Whether the unit's forward is recomputed in backward (activation checkpointing).
bool checkpoints_activations(const UnitSlot& unit);
/// Runs `forward(inputs)` keeping only `inputs` for backward, which runs it again with gradients
/// (and the same random numbers) and backpropagates through the recomputed graph.
at::Tensor run_checkpointed(std::function<at::Tensor(const std::vector<at::Tensor>&)> forward,
                            std::vector<at::Tensor> inputs);


}  // namespace detail

}  // namespace fsdp
