#pragma once
// The sharded model as checkpoints, state dicts, clipping and the optimizers see it: this rank's
// pieces of each named parameter, grouped by the flat buffer whose shards a collective gathers
// whole, and the few facts of the model they need. How units, flat parameters and their entries
// hold those pieces stays in sharded_view.cpp: io and optim include no other engine header.

#include <fsdp/options.h>
#include <fsdp/sharded_model.h>
#include <fsdp/tp_placement.h>

#include "core/gradients_reduced_hook.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp {

class FsdpState;
class FlatParam;
struct FlatEntry;
class ParamGroup;
class ProcessGroup;

namespace detail {

/// One named parameter and this rank's piece of it (possibly empty).
class ShardedParam {
 public:
  /// Its path from the root module, e.g. "h.0.attn.c_attn.weight".
  const std::string& name() const;
  /// The user's parameter: between steps its data is its piece of the shard (1-D).
  const at::Tensor& param() const;
  /// Its original shape (under tensor parallelism: this rank's part's).
  const std::vector<int64_t>& shape() const;
  /// How it is split over the tensor-parallel ranks; none when the model is not tensor-parallel
  /// ([Note: one placement per parameter]).
  const std::optional<tp::Placement>& tensor_parallel() const;
  /// This rank's piece as [begin, end) elements of the flattened parameter ({0, 0}: none).
  int64_t begin() const;
  int64_t end() const;
  bool empty() const { return begin() == end(); }
  /// The piece in the shard (1-D [end - begin]): the optimizer's master copy.
  at::Tensor data() const;
  /// The piece in `shard_like`, a buffer laid out like its ShardedBuffer's shard.
  at::Tensor in_shard(const at::Tensor& shard_like) const;
  /// The whole parameter, in its shape, in `gathered` (what ShardedBuffer::gather_whole gives).
  at::Tensor in_whole(const at::Tensor& gathered) const;
  /// This rank's piece of `whole` (the whole parameter in any shape), flattened.
  at::Tensor piece_of(const at::Tensor& whole) const;
  /// The elements of the flattened parameter each position of the shard group holds: the
  /// pieces, in position order, make the whole.
  std::vector<int64_t> piece_numels() const;

 private:
  friend class ShardedBuffer;
  ShardedParam(FlatParam& flat, const FlatEntry& entry) : flat_(&flat), entry_(&entry) {}

  FlatParam* flat_;
  const FlatEntry* entry_;
};

/// One flat buffer: the parameters whose pieces share this rank's shard, and the unit it serves.
class ShardedBuffer {
 public:
  const std::vector<ShardedParam>& params() const { return params_; }
  /// This rank's shard (1-D).
  const at::Tensor& shard() const;
  /// `shard_like` (laid out like shard(), on the collectives' device) and the other ranks' of the
  /// shard group gathered into a new buffer: a collective, on every rank in the same order.
  at::Tensor gather_whole(const at::Tensor& shard_like) const;
  /// The module path of the unit it belongs to ("" for the root).
  const std::string& unit_name() const;
  /// Reshards the unit if a forward left it unsharded ([Note: resharding between steps]); false,
  /// and nothing done, while its backward is under way.
  bool reshard_unless_in_backward() const;
  /// The parameters point at their pieces of the shard (always so for a shard group of one).
  bool holds_shard_only() const;

 private:
  friend class ShardedView;
  ShardedBuffer(FsdpState& state, ParamGroup& unit, FlatParam& flat);

  FsdpState* state_;
  ParamGroup* unit_;  // the unit whose flat parameter it is
  FlatParam* flat_;
  std::vector<ShardedParam> params_;
};

/// The model: its flat buffers, root unit first, and what io and optim need of the model.
class ShardedView {
 public:
  explicit ShardedView(const ShardedModel& model);

  const std::vector<ShardedBuffer>& buffers() const { return buffers_; }
  /// Every parameter, buffer by buffer.
  std::vector<ShardedParam> params() const;

  ProcessGroup& world() const;
  /// The ranks that together hold one copy of the shards (the world unless hybrid or no-shard).
  ProcessGroup& shard_group() const;
  /// This rank's place in its shard group, and the group's size.
  int shard_rank() const;
  int shard_group_size() const;
  /// Whether this rank belongs to the first replica of its shard (the only one when unreplicated).
  bool first_replica() const;
  const FullyShardOptions& options() const;
  /// Where the collectives run (a GPU's, also when the shards are offloaded to the host).
  c10::Device compute_device() const;
  /// t <- the sum of t over the shard group.
  void all_reduce_over_shard_group(const at::Tensor& t) const;
  /// Inside a SummonFullParams scope every parameter is whole and units are plain calls.
  bool full_params_held() const;
  void set_full_params_held(bool held) const;
  /// What the model calls as each unit's reduced gradient is issued; empty: nothing.
  void set_gradients_reduced_hook(GradientsReducedHook hook) const;

 private:
  FsdpState* state_;
  std::vector<ShardedBuffer> buffers_;
};

/// Every sharded model whose root unit is alive (the unit registry: fully_shard.cpp). Core's
/// own: the layers above ask for the models of their parameters (models_holding).
std::vector<ShardedModel> sharded_models();

/// The sharded models that hold any of `params`, each once, in the order of their first parameter.
std::vector<ShardedModel> models_holding(const std::vector<at::Tensor>& params);

}  // namespace detail
}  // namespace fsdp
