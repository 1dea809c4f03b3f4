#pragma once
// One unit's parameters flattened into one 1-D buffer, right-padded to a multiple of the world
// size W and cut into W equal shards; this rank keeps shard `rank`. The user's parameters stay
// the same leaf tensors: only their data is pointed into the sharded or the unsharded buffer,
// so the optimizer, which holds those tensors, steps the shards.
//
// [Note: storage reuse]
// Dropping the unsharded buffer after forward would not free it: views that autograd saved for
// backward (a Linear saves weight.t()) keep its storage alive. So the storage is freed *in place*
// (its bytes released, the StorageImpl kept) and refilled by all-gather before backward, which
// makes every saved view valid again. The same holds for the unsharded gradient buffer.
//
// Mixed precision: the shard (and the gradient shard) stay in the parameters' dtype; the
// unsharded buffer and its gradient are in the compute dtype.
//
// CPU offload (paper, section 3.2): the shard and the gradient shard stay in (pinned) host memory
// where the parameters are, and the optimizer steps them there; the unsharded buffer and its
// gradient are on the compute device. A parameter's device then changes with every
// unshard/reshard too. A parameter's dtype then changes
// with every unshard/reshard, and autograd drops a leaf's gradient accumulator when its dtype
// changes: see refresh_grad_accumulators().

#include "core/unit_rules.h"

#include <fsdp/tp_placement.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

/// What autograd hands out for a leaf's gradient accumulator: std::shared_ptr in older LibTorch
/// (the GPU machine's 2.11), c10::intrusive_ptr in newer; the code builds against both.
using GradAccumulatorPtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// [Note: one placement per parameter]
// A FlatEntry is the one record of where a parameter lives, for every parallel dimension: its
// FSDP piece (the flat buffer it belongs to, its offset, this rank's range; the piece sizes of
// every position follow from the buffer's layout) and its tensor-parallel split (the dimension,
// fused parts, whole shape and tp group), taken once when the parameter is sharded. Clipping,
// Muon, state dicts and checkpoints read it through core/sharded_view.h (ShardedParam); a
// pipeline stage, when there is one, belongs here too.

/// One original parameter inside the flat buffer.
struct FlatEntry {
  std::string name;             // path from the root module, e.g. "h.0.attn.c_attn.weight"
  at::Tensor param;             // the user's leaf; data points into the shard or the full buffer
  std::vector<int64_t> shape;   // original shape (under tensor parallelism: this rank's part's)
  int64_t numel = 0;
  int64_t offset = 0;           // start in the unsharded flat buffer
  int64_t shard_begin = 0;      // this rank's piece of the parameter, as [begin, end) offsets
  int64_t shard_end = 0;        //   into the local shard (empty when begin == end)
  std::optional<tp::Placement> tensor_parallel;  // none: the model is not tensor-parallel
  GradAccumulatorPtr grad_accumulator;  // kept alive: hooks live on it

  /// This parameter in `full`, a buffer laid out like the unsharded flat buffer (the parameters,
  /// their gradients, a gathered optimizer state), in its original shape.
  at::Tensor in_full(const at::Tensor& full) const {
    return full.narrow(0, offset, numel).view(shape);
  }
  /// This rank's piece of the parameter in `shard`, a buffer laid out like the shard (1-D,
  /// possibly empty).
  at::Tensor in_shard(const at::Tensor& shard) const {
    return shard.narrow(0, shard_begin, shard_end - shard_begin);
  }
  /// Whether this rank's shard holds none of the parameter.
  bool outside_shard() const { return shard_end == shard_begin; }
};

class FlatParam {
 public:
  /// Copies this rank's piece of each of `params` (same dtype and device) into its shard; the parameters'
  /// own storage is released once they point into it. The unsharded buffer is in
  /// `compute_dtype` (the parameters' dtype if unset), the unsharded gradient in `grad_dtype`
  /// (the reductions' dtype; `compute_dtype` if unset): each gradient is cast once, as it is
  /// copied in, and the reduction needs no converted copy of the whole buffer.
  /// With `compute_device` (CPU offload), the unsharded buffers are there, the shards pinned.
  FlatParam(std::vector<std::pair<std::string, at::Tensor>> params, int rank, int world_size,
            std::optional<c10::ScalarType> compute_dtype = std::nullopt,
            std::optional<c10::Device> compute_device = std::nullopt,
            std::optional<c10::ScalarType> grad_dtype = std::nullopt);

  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return shard_numel_ * world_size_; }
  int64_t shard_numel() const { return shard_numel_; }
  /// This rank's piece of `entry` as [begin, end) elements of the flattened parameter ({0, 0}
  /// when it holds none): what checkpoints save and loaders read for this rank.
  std::pair<int64_t, int64_t> local_range(const FlatEntry& entry) const {
    const int64_t length = entry.shard_end - entry.shard_begin;
    if (length == 0) return {0, 0};
    const int64_t begin = rank_ * shard_numel_ + entry.shard_begin - entry.offset;
    return {begin, begin + length};
  }
  /// This rank's piece of `whole` (the whole parameter `entry`, in any shape), flattened: what
  /// goes into entry.in_shard(shard()).
  at::Tensor local_piece(const FlatEntry& entry, const at::Tensor& whole) const {
    const auto [begin, end] = local_range(entry);
    return whole.reshape({-1}).narrow(0, begin, end - begin);
  }
  int64_t element_size() const;          // of the shard
  int64_t compute_element_size() const;  // of the unsharded buffer (what the all-gather moves)
  /// False for a shard group of one rank (NO_SHARD): the shard is the whole flat buffer and the
  /// parameters keep their shapes.
  bool sharded() const { return world_size_ > 1; }
  int shard_group_size() const { return world_size_; }
  /// Where it is kept and computed, replicated `replicas` times: what the rules of a step read
  /// ([Note: one rulebook, two readers]).
  rules::FlatPlacement placement(int replicas) const {
    return {world_size_, replicas, mixed_precision(), offloaded()};
  }
  /// Whether forward needs a separate unsharded buffer (rules::needs_unshard).
  bool needs_unshard() const { return rules::needs_unshard(placement(1)); }
  bool mixed_precision() const { return compute_dtype_ != shard_.scalar_type(); }
  /// The shards live in host memory, the unsharded buffers on the compute device.
  bool offloaded() const { return compute_device_ != shard_.device(); }
  /// Where this rank's shard sits in the unsharded buffer (it goes there before the all-gather).
  at::Tensor shard_in_full() const;
  std::vector<FlatEntry>& entries() { return entries_; }
  const std::vector<FlatEntry>& entries() const { return entries_; }
  bool requires_grad() const { return requires_grad_count_ > 0; }
  int requires_grad_count() const { return requires_grad_count_; }

  at::Tensor& shard() { return shard_; }
  const at::Tensor& shard() const { return shard_; }
  at::Tensor& full() { return full_; }
  at::Tensor& full_grad() { return full_grad_; }
  const at::Tensor& full_grad() const { return full_grad_; }
  /// This rank's gradient shard (the optimizer reads it); allocated uninitialised when a backward
  /// first needs it: every reduction overwrites it whole unless it adds to gradients the optimizer
  /// kept, and then it exists already.
  at::Tensor& grad_shard();
  /// [Note: gradient shards live as long as the gradients] Once the optimizer has cleared every
  /// trainable parameter's gradient (zero_grad, which sets them to none), nothing reads the
  /// gradient shard again: it is dropped, as FSDP2's sharded gradients are, so a step's forward
  /// and the activation peak at the start of backward never hold 4 bytes per parameter of last
  /// step's gradients. Gradients zeroed in place (set_to_none = false), or kept to accumulate,
  /// keep it.
  void release_cleared_grad_shard();
  /// The gradient shard while it holds its bytes (until release_cleared_grad_shard); else undefined.
  at::Tensor held_grad_shard() const { return grad_shard_released_ ? at::Tensor() : grad_shard_; }

  // Storage of the unsharded buffers, freed and refilled in place: see [Note: storage reuse].
  void allocate_full();
  /// Instead of allocate_full and an all-gather: the unsharded buffer's bytes are `bytes` (not
  /// ours: DeviceRuntime::lent_bytes), every rank's shard side by side already, which their
  /// owner keeps valid and unwritten until free_full. Nothing is allocated or copied.
  void use_lent_full(c10::DataPtr bytes);
  /// Whether the unsharded buffer's bytes are lent (use_lent_full, until free_full).
  bool full_lent() const { return full_lent_; }
  void free_full();
  /// Like free_full_grad, but hands the bytes to the caller (who frees them when a collective
  /// that may still read them has completed).
  c10::DataPtr take_full_grad_bytes();

  /// Parameters become views of the unsharded buffer, in their original shapes.
  void use_full_params();
  /// Parameters become 1-D views of their piece of this rank's shard (possibly empty).
  void use_sharded_params();
  /// [Note: a parameter rebound from outside] Takes in every parameter that no longer points
  /// into this flat parameter's buffers (torch::load, set_data or `.data =` gave it storage of its
  /// own): copies this rank's piece of its value into the shard and points it back at the shard.
  /// Throws, naming the parameter and the fix, when its value is not the whole parameter.
  /// Returns the indices of the entries taken in whose gradient accumulator is new (to be hooked),
  /// and how many were taken in.
  std::pair<std::vector<size_t>, int> take_in_rebound();
  /// Starts a backward's unsharded gradient: allocates it, unless `keep` (no_sync: keep adding to
  /// the sum of the previous backwards), and clears the trainable parameters' gradients.
  /// [Note: gradients into the flat buffer] A parameter without a gradient lets autograd keep
  /// the tensor the last op produced (no copy); take_grad then copies it into the flat buffer
  /// once. Pointing .grad at the flat buffer instead would cost a zero-fill of the whole buffer
  /// and an in-place add per gradient (FSDP2 copies once too, in foreach_reduce).
  ///
  /// With `into_shard` the gradients go straight into the gradient shard instead (cast to its
  /// dtype): for a shard group of one rank without replicas, whose shard is the whole unsharded
  /// gradient and whose "reduction" would be a copy. No unsharded gradient is allocated then.
  void begin_full_grad(bool keep, bool into_shard = false);
  /// Whether this backward's gradients were written straight into the gradient shard.
  bool grads_in_shard() const { return grads_in_shard_; }
  /// Entry i's gradient has just been accumulated by autograd: moves it into the unsharded
  /// gradient (copied the first time in this sum, added after) and clears it.
  void take_grad(size_t i);
  /// Zero-fills the entries of the unsharded gradient no gradient reached (parameters unused in
  /// this backward): the buffer then holds the whole sum.
  void complete_full_grad();
  /// [Note: a kept gradient summed wide] A no_sync backward has ended: its low-precision
  /// unsharded gradient is added into the kept sum in the shard's dtype, and its buffer's bytes
  /// freed (the next backward writes a fresh one). Nothing to do, returning false, when the
  /// unsharded gradient is as wide as the shard: it is kept and added to as it is.
  bool keep_full_grad_wide();
  /// Whether earlier no_sync backwards left a kept sum in the shard's dtype.
  bool has_wide_kept_sum() const { return wide_kept_sum_.defined(); }
  /// Before the kept sum's reduction: the sum (with this backward's gradient, if one was written
  /// since) rounded once into the unsharded gradient, which the reduction reads.
  void fold_wide_kept_sum();
  /// For a shard group of one rank without replicas (nothing to communicate): the kept sum (with
  /// this backward's gradient, if any) goes into the gradient shard in its own dtype, unrounded,
  /// added to it when `accumulate`.
  void move_wide_kept_sum_into_shard(bool accumulate);
  /// Gradients become views of this rank's gradient shard.
  void use_sharded_grads();
  /// The trainable parameters and the views of the gradient shard use_sharded_grads() gives them.
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> sharded_grads();
  /// True when every trainable parameter still has a gradient (the optimizer did not clear it).
  bool has_sharded_grads() const;
  /// Records each trainable parameter's current gradient accumulator (autograd makes a new one
  /// after a dtype change) and returns the indices of the entries whose accumulator is new, to be
  /// hooked.
  std::vector<size_t> refresh_grad_accumulators();

 private:
  /// Each entry's view of `buffer`: its piece of a shard-like buffer (`in_shard`), else its
  /// whole shape in a buffer laid out like the unsharded one.
  std::vector<at::Tensor> param_views(const at::Tensor& buffer, bool in_shard) const;
  /// Whether grad_shard_, its storage and grad_views_ are referenced from nowhere else.
  bool grad_views_only_ours() const;

  std::vector<FlatEntry> entries_;
  int rank_;
  int world_size_;
  int64_t numel_ = 0;
  int64_t shard_numel_ = 0;
  int requires_grad_count_ = 0;
  c10::ScalarType compute_dtype_;
  c10::Device compute_device_{c10::kCPU};
  at::Tensor shard_;       // 1-D [S], this rank's shard: the master copy the optimizer updates
  at::Tensor full_;        // 1-D [W·S], unsharded; storage freed while sharded
  at::Tensor full_grad_;   // 1-D [W·S], unsharded gradient; storage only during backward
  at::Tensor grad_shard_;  // 1-D [S], reduced gradient of this rank's shard
  at::Tensor wide_kept_sum_;  // 1-D [W·S] in the shard's dtype: no_sync backwards' sum ([Note: a kept gradient summed wide])
  bool grad_shard_released_ = false;   // its bytes released in place (grad_shard() refills them)
  std::vector<at::Tensor> grad_views_;  // per entry, its gradient in grad_shard_: [Note: gradient views made once]
  // Per entry, what the parameter points at unsharded (in full_) and sharded (in shard_), made
  // once: the buffers keep their storage objects (refill_storage swaps only the bytes), so the
  // views stay valid, and resharding costs no narrow and view per parameter (with many small
  // units those were ~13% of a step's instructions on the compute thread).
  std::vector<at::Tensor> full_views_;
  std::vector<at::Tensor> shard_views_;
  std::vector<at::Tensor> full_grad_views_;  // likewise each entry's piece of full_grad_
  std::vector<bool> grad_written_;  // per entry: its piece of full_grad_ holds a gradient
  bool grads_in_shard_ = false;     // this backward writes grad_shard_, not full_grad_
  bool full_lent_ = false;          // full_'s bytes are use_lent_full's, not allocated
  /// Where entry i's gradient goes in this backward: its piece of full_grad_ (a view made once),
  /// or of grad_shard_ (grads_in_shard_; that buffer is released between steps, so made anew).
  at::Tensor grad_slot(size_t i);
};

}  // namespace fsdp
