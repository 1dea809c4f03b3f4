#pragma once
/// Not for users: the plumbing between a Unit holder (a template in <fsdp/fully_shard.h>, so
/// compiled in the user's program) and the sharded model it belongs to. The engine includes this
/// header, not the public face ([Note: the public face carries no plumbing]).

#include <fsdp/distributed.h>
#include <fsdp/options.h>
#include <fsdp/output_tensors.h>
#include <fsdp/sharded_model.h>

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

// [Note: the public face carries no plumbing]
// <fsdp/fully_shard.h> is what a user reads: Unit, fully_shard, NoSyncGuard. What its templates
// call into (the unit registry, the forward hooks, deferred sharding) lives here, in namespace
// detail, and names no engine type: a Unit holds an opaque UnitSlot (src/core/unit_slot.h) and
// a sharded model is a ShardedModel handle ([Note: one handle behind the face]). The core
// layer's headers include this file, never the face (tools/layers/check_layers.py refuses a
// src/ header that includes <fsdp/fully_shard.h>), and inside core it sits above the model
// (fsdp_state) and its units, which include nothing of the face.

/// Initialises one parameter (`name` relative to its unit) before it is sharded: see
/// fully_shard_deferred.
using ParamInit = std::function<void(const std::string& name, torch::Tensor& param)>;
/// fully_shard_deferred: each unit's module (then the root, `is_root`), initialised, just before
/// it is sharded: e.g. tensor parallelism's parallelize_module, so that a unit is split over the
/// tp ranks before FSDP shards its part.
using UnitPrepare = std::function<void(torch::nn::Module& unit, bool is_root)>;

namespace detail {

/// Where a Unit holder finds its runtime once fully_shard() has run (src/core/unit_slot.h).
struct UnitSlot;

/// Registers `module` as a unit and returns its slot (fully_shard finds units through this).
std::shared_ptr<UnitSlot> register_unit(const torch::nn::Module* module);
/// The slot of the unit holding `module`; null if no Unit holds it.
std::shared_ptr<UnitSlot> find_unit(const torch::nn::Module* module);
/// Whether the slot's unit is sharded (false for null: an empty holder).
bool is_sharded(const UnitSlot* slot);
/// The sharded model whose root unit the slot is; null if none.
ShardedModel* root_of(UnitSlot* slot);
/// The same, or throws: the model is not sharded (call fully_shard first).
ShardedModel& sharded_root_of(UnitSlot* slot);

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

class DeferredScope;
/// Shards the model held by the Unit holder `root`; `deferred`: the fully_shard_deferred call
/// whose factory built it (its units are sharded already).
void shard_model(const std::shared_ptr<torch::nn::Module>& root, ProcessGroup& group,
                 const FullyShardOptions& options, const DeferredScope* deferred = nullptr);

/// While a fully_shard_deferred factory runs on this thread: shards the unit `module` at once.
void shard_if_deferred(UnitSlot& slot, const std::shared_ptr<torch::nn::Module>& module);

struct DeferredSharding;
/// The sharding of one fully_shard_deferred call, active on this thread while the factory runs.
class DeferredScope {
 public:
  DeferredScope(ProcessGroup& group, const FullyShardOptions& options, ParamInit init,
                UnitPrepare prepare = nullptr);
  ~DeferredScope();
  /// The factory has returned: Unit holders built from now on are ordinary.
  void close();
  const DeferredSharding& sharding() const { return *sharding_; }

 private:
  std::unique_ptr<DeferredSharding> sharding_;
};
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
