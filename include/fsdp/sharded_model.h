#pragma once
/// fsdp::ShardedModel: the handle of one sharded model, as fully_shard built it (its module, its
/// units and their shards, and what runs them). The root unit gives it (`root.sharded_model()`);
/// checkpoints, state dicts, clipping, NoSyncGuard and StepInBackward take it. Copies are handles
/// of the same model, and keep it alive.

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

template <class M>
class Unit;

/// One flat parameter of a unit: its parameters of one kind. A unit has one per kind it holds:
/// trainable ones first, then frozen (requires_grad false), each split into param_dtype and full
/// precision (BatchNorm under mixed precision) where it has both.
struct FlatInfo {
  int64_t num_params = 0;    ///< original parameters in it
  int64_t numel = 0;         ///< elements of those parameters
  int64_t padded_numel = 0;  ///< numel rounded up to a multiple of the shard group size
  int64_t shard_numel = 0;   ///< elements this rank keeps
  int64_t element_size = 0;  ///< bytes per element of the shard (the parameters' dtype)
  int64_t compute_element_size = 0;  ///< bytes per element unsharded (mixed precision's param_dtype)
  bool trainable = true;     ///< false for frozen parameters
};

/// What one unit holds, for tests, benchmarks and logs: the sums over its flat parameters, and
/// each of them.
struct UnitInfo {
  std::string name;          ///< module path from the root ("" for the root unit)
  bool is_root = false;
  int64_t num_params = 0;    ///< original parameters in the unit
  int64_t numel = 0;         ///< elements of those parameters
  int64_t padded_numel = 0;  ///< the flat parameters' elements, padded
  int64_t shard_numel = 0;   ///< elements this rank keeps
  int64_t shard_bytes = 0;   ///< bytes this rank keeps
  int64_t unsharded_bytes = 0;  ///< bytes of the unit's parameters gathered (padded, compute dtypes)
  std::vector<FlatInfo> flats;
};

// [Note: one handle behind the face]
// The public face reaches the engine through this one class, never through the engine's own
// types: what it holds (Impl) is defined in src/core/sharded_model.h, so a program compiles no
// engine header, and every entry point that needs a sharded model (io, optim, NoSyncGuard) is a
// plain function of the library taking it. The root unit hands it out, and is the one place
// that refuses a model fully_shard has not sharded; an entry point given a root unit takes the
// unit's handle (the implicit conversion below), so one non-template function serves both.
class ShardedModel {
 public:
  struct Impl;
  /// Built by fully_shard.
  explicit ShardedModel(std::shared_ptr<Impl> impl);
  /// The handle of the model sharded through `root` (root.sharded_model()): throws unless `root`
  /// is what fully_shard returned. Defined in <fsdp/fully_shard.h>.
  template <class M>
  /* implicit */ ShardedModel(const Unit<M>& root);

  /// The units, root first.
  std::vector<UnitInfo> units() const;
  /// The root module (its buffers are the model's buffers).
  torch::nn::Module& module() const;

  /// The engine's side of the handle (the library's own code).
  Impl& impl() const { return *impl_; }
  bool operator==(const ShardedModel& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace fsdp
