#include "core/flat_param.h"

#include "core/buffer_storage.h"
#include "core/flat_layout.h"
#include "util/copy_bytes.h"

#include <fsdp/parallelize.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/utils.h>  // torch::NoGradGuard

#include <algorithm>
#include <cstdint>


namespace fsdp {

namespace {

// A tensor sharing `base`'s storage at [offset, offset + numel) with `shape`, that autograd does
// not consider a view: optimizers call detach_() on gradients, which views refuse. Built as
// at::empty builds a tensor, without dispatching an operator: made for every parameter's gradient
// at every step, two dispatched ops (empty, set_) cost more than the rest of the unit's step in
// small units.
at::Tensor alias(const at::Tensor& base, int64_t offset, at::IntArrayRef shape) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(base.storage()), base.key_set(), base.dtype());
  impl->set_storage_offset(base.storage_offset() + offset);
  impl->set_sizes_contiguous(shape);
  return at::Tensor(std::move(impl));
}

// [Note: re-pointing a parameter]
// `param.set_data(data)` checks through a dispatched operator that the two tensors' types allow a
// shallow copy, and whether autograd must drop the parameter's gradient accumulator (a new dtype
// or device), then copies `data`'s metadata into the parameter (shallow_copy_from; the parameter
// keeps its own version counter and autograd metadata). Between the shard and the unsharded
// buffer of one dtype and device neither check can fail, so only the copy runs: a unit re-points
// each parameter twice in forward and twice in backward. Mixed precision and offload, which
// change the dtype or device, go through set_data.
void point_data(at::Tensor& param, const at::Tensor& data) {
  if (param.dtype() == data.dtype() && param.device() == data.device() &&
      param.key_set() == data.key_set()) {
    param.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
    return;
  }
  torch::NoGradGuard no_grad;
  param.set_data(data);
}

// to <- from, for tensors of equal numel. A dense host copy of one dtype is a memcpy (what ATen's
// copy_ does too, after dispatching and building an iterator: per gradient, in small units, more
// work than the bytes).
void copy_into(at::Tensor& to, const at::Tensor& from) {
  if (to.is_cpu() && from.is_cpu() && to.dtype() == from.dtype() && to.is_contiguous() &&
      from.is_contiguous()) {
    copy_bytes(to.data_ptr(), from.const_data_ptr(), to.nbytes());
    return;
  }
  torch::NoGradGuard no_grad;  // a gradient of create_graph's backward requires grad
  to.copy_(from);
}

}  // namespace

FlatParam::FlatParam(std::vector<std::pair<std::string, at::Tensor>> params, int rank,
                     int world_size, std::optional<c10::ScalarType> compute_dtype,
                     std::optional<c10::Device> compute_device,
                     std::optional<c10::ScalarType> grad_dtype)
    : rank_(rank), world_size_(world_size) {
  TORCH_INTERNAL_ASSERT(world_size >= 1 && rank >= 0 && rank < world_size);
  for (auto& [name, param] : params) {
    TORCH_CHECK(param.scalar_type() == params.front().second.scalar_type() &&
                    param.device() == params.front().second.device(),
                "fully_shard: parameters of one unit must share dtype and device, but '", name,
                "' is ", param.dtype(), " on ", param.device(), " and '", params.front().first,
                "' is ", params.front().second.dtype(), " on ", params.front().second.device(),
                ". Cast the module (module->to(dtype)) before sharding.");
    FlatEntry entry;
    entry.name = name;
    entry.param = param;
    entry.shape = param.sizes().vec();
    entry.tensor_parallel = tp::placement_of(param);
    if (param.requires_grad()) ++requires_grad_count_;
    entries_.push_back(std::move(entry));
  }
  std::vector<int64_t> numels;
  for (const auto& [name, param] : params) numels.push_back(param.numel());
  const FlatLayout layout = lay_out_flat(numels, rank, world_size);
  numel_ = layout.numel;
  shard_numel_ = layout.shard_numel;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const EntryLayout& cut = layout.entries[i];
    entries_[i].numel = cut.numel;
    entries_[i].offset = cut.offset;
    entries_[i].shard_begin = cut.shard_begin;
    entries_[i].shard_end = cut.shard_end;
  }
  // Created now, while the parameters have their full shapes: autograd checks incoming
  // gradients against the shape an accumulator was made with.
  refresh_grad_accumulators();

  auto options = params.empty() ? at::TensorOptions(at::kFloat)
                                 : params.front().second.options().requires_grad(false);
  compute_dtype_ = compute_dtype.value_or(c10::typeMetaToScalarType(options.dtype()));
  compute_device_ = compute_device.value_or(options.device());
  // Host memory copied to a GPU is pinned: the copy then needs no bounce buffer.
  if (compute_device_ != options.device()) options = options.pinned_memory(compute_device_.is_cuda());
  // Only this rank's pieces are copied: building a unit never holds more than its parameters plus
  // one shard (deferred initialisation relies on it).
  shard_ = at::zeros({shard_numel_}, options);
  {
    torch::NoGradGuard no_grad;
    for (auto& e : entries_) {
      if (!e.outside_shard()) e.in_shard(shard_).copy_(local_piece(e, e.param));
    }
  }
  const auto full_options = options.dtype(compute_dtype_).device(compute_device_).pinned_memory(false);
  full_ = needs_unshard() ? unallocated(padded_numel(), full_options) : shard_;
  // A shard group of one keeps the shapes (the shard is the whole unit).
  shard_views_ = param_views(shard_, /*in_shard=*/sharded());
  use_sharded_params();  // releases the parameters' original storage
  full_grad_ = unallocated(padded_numel(), full_options.dtype(grad_dtype.value_or(compute_dtype_)));
}

int64_t FlatParam::element_size() const { return static_cast<int64_t>(shard_.element_size()); }
int64_t FlatParam::compute_element_size() const {
  return static_cast<int64_t>(full_.element_size());
}

at::Tensor FlatParam::shard_in_full() const { return full_.narrow(0, rank_ * shard_numel_, shard_numel_); }

at::Tensor& FlatParam::grad_shard() {
  if (!grad_shard_.defined()) {
    // Offloaded, pinned as the shard is: the reduced gradient's copy into it is then asynchronous.
    grad_shard_ = at::empty({shard_numel_}, shard_.options().pinned_memory(offloaded() && compute_device_.is_cuda()));
    grad_views_.clear();
  } else if (grad_shard_released_) {
    refill_storage(grad_shard_);
  }
  grad_shard_released_ = false;
  return grad_shard_;
}

void FlatParam::release_cleared_grad_shard() {
  if (!grad_shard_.defined() || grad_shard_released_) return;
  const bool any_grad = std::any_of(entries_.begin(), entries_.end(), [](const FlatEntry& e) {
    return e.param.requires_grad() && e.param.grad().defined();
  });
  if (any_grad) return;
  if (grad_views_only_ours()) {  // [Note: gradient views made once]
    release_storage(grad_shard_);
    grad_shard_released_ = true;
  } else {
    grad_shard_.reset();
    grad_views_.clear();
  }
}

// [Note: gradient views made once]
// The gradients the optimizer reads are views of the gradient shard, one per parameter. They are
// made once and handed out again at every step, like the parameters' views ([Note: storage
// reuse]): between steps the shard's bytes are released in place and its storage object kept.
// That is only safe while nobody but this FlatParam holds the views or the storage: a program
// that kept last step's gradient (or a view of it) must keep its values, so then the shard and
// its views are dropped and made anew, as before. Making a view per parameter and step (a
// TensorImpl allocated, the old one freed at zero_grad) was a fifth of finish_backward's work
// in units of 12 small parameters.
bool FlatParam::grad_views_only_ours() const {
  if (grad_shard_.use_count() != 1) return false;
  for (const at::Tensor& view : grad_views_) {
    if (view.use_count() != 1) return false;
  }
  return grad_shard_.storage().use_count() == 1 + grad_views_.size();
}

void FlatParam::allocate_full() {
  TORCH_INTERNAL_ASSERT(!full_lent_, "allocate_full: the unsharded buffer's bytes are lent");
  if (needs_unshard()) refill_storage(full_);
}

void FlatParam::use_lent_full(c10::DataPtr bytes) {
  c10::StorageImpl* storage = full_.storage().unsafeGetStorageImpl();
  TORCH_INTERNAL_ASSERT(needs_unshard() && storage->nbytes() == 0, "use_lent_full: the unsharded buffer holds bytes");
  storage->set_data_ptr_noswap(std::move(bytes));
  storage->set_nbytes(static_cast<size_t>(full_.numel()) * full_.element_size());
  full_lent_ = true;
}

void FlatParam::free_full() {
  if (needs_unshard()) release_storage(full_);
  full_lent_ = false;
}

void FlatParam::begin_full_grad(bool keep, bool into_shard) {
  TORCH_INTERNAL_ASSERT(!into_shard || (!keep && world_size_ == 1 && !offloaded()));
  if (wide_kept_sum_.defined()) keep = false;  // the sum so far is kept wide: this backward's starts afresh
  grads_in_shard_ = into_shard;
  if (into_shard) {
    grad_written_.assign(entries_.size(), false);
  } else if (!keep) {
    refill_storage(full_grad_);
    grad_written_.assign(entries_.size(), false);
    const int64_t padding = padded_numel() - numel_;
    if (padding > 0) full_grad_.narrow(0, numel_, padding).zero_();
  }
  for (auto& e : entries_) {
    if (e.param.requires_grad()) e.param.mutable_grad().reset();
  }
}

void FlatParam::take_grad(size_t i) {
  FlatEntry& e = entries_[i];
  const at::Tensor grad = e.param.grad();
  if (!grad.defined()) return;
  at::Tensor slot = grad_slot(i);
  if (grad_written_[i]) {
    torch::NoGradGuard no_grad;
    slot.add_(grad);
  } else {
    copy_into(slot, grad);
  }
  grad_written_[i] = true;
  e.param.mutable_grad().reset();
}

void FlatParam::complete_full_grad() {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (grad_written_[i]) continue;
    grad_slot(i).zero_();
    grad_written_[i] = true;
  }
}

// [Note: a kept gradient summed wide]
// Under mixed precision the unsharded gradient is in the reduce dtype (else the compute dtype):
// bf16 when the policy reduces in bf16. A backward under no_sync (gradient accumulation without
// a reduction per micro-batch; a pipeline stage held across its micro-batches) keeps it for the
// next backward to add to. Adding M micro-batches' gradients in bf16 rounds every partial sum to
// 8 bits, where accumulation with a reduction per micro-batch (and gpt_train's unsharded
// reference) rounds each micro-batch's gradient once and adds in fp32. So a kept low-precision
// gradient is added into a sum in the shard's dtype (fp32) and its own buffer freed; the
// reduction rounds that sum once to the reduce dtype (what goes over the wire is unchanged), or,
// for a shard group of one rank without replicas (nothing to communicate), moves it into the
// gradient shard unrounded. The memory: the sum in fp32 while kept, in place of the bf16 buffer.
bool FlatParam::keep_full_grad_wide() {
  const c10::ScalarType wide = shard_.scalar_type();
  if (c10::elementSize(full_grad_.scalar_type()) >= c10::elementSize(wide)) return false;
  torch::NoGradGuard no_grad;
  if (wide_kept_sum_.defined()) {
    wide_kept_sum_.add_(full_grad_);
  } else {
    wide_kept_sum_ = full_grad_.to(full_grad_.options().dtype(wide));
  }
  release_storage(full_grad_);
  return true;
}

namespace {

// Whether `t`'s storage holds bytes (a buffer of this backward's gradient) or was released.
bool holds_bytes(const at::Tensor& t) { return t.defined() && t.storage().nbytes() > 0; }

}  // namespace

void FlatParam::fold_wide_kept_sum() {
  torch::NoGradGuard no_grad;
  if (holds_bytes(full_grad_)) {
    wide_kept_sum_.add_(full_grad_);
  } else {
    refill_storage(full_grad_);
  }
  full_grad_.copy_(wide_kept_sum_);
  wide_kept_sum_ = at::Tensor();
}

void FlatParam::move_wide_kept_sum_into_shard(bool accumulate) {
  torch::NoGradGuard no_grad;
  if (holds_bytes(full_grad_)) {
    wide_kept_sum_.add_(full_grad_);
    release_storage(full_grad_);
  }
  at::Tensor& shard = grad_shard();
  const at::Tensor mine = wide_kept_sum_.narrow(0, rank_ * shard_numel_, shard_numel_);
  if (accumulate) {
    shard.add_(mine);
  } else {
    shard.copy_(mine);
  }
  wide_kept_sum_ = at::Tensor();
}

c10::DataPtr FlatParam::take_full_grad_bytes() {
  c10::StorageImpl* storage = full_grad_.storage().unsafeGetStorageImpl();
  c10::DataPtr bytes = storage->set_data_ptr(c10::DataPtr(nullptr, full_grad_.device()));
  storage->set_nbytes(0);
  return bytes;
}

at::Tensor FlatParam::grad_slot(size_t i) {
  if (grads_in_shard_) return entries_[i].in_full(grad_shard());
  // Made at the first gradient, when full_grad_ has its bytes (begin_full_grad refilled them).
  if (full_grad_views_.empty()) full_grad_views_ = param_views(full_grad_, /*in_shard=*/false);
  return full_grad_views_[i];
}

std::vector<at::Tensor> FlatParam::param_views(const at::Tensor& buffer, bool in_shard) const {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> views;
  for (const auto& e : entries_) views.push_back(in_shard ? e.in_shard(buffer) : e.in_full(buffer));
  return views;
}

void FlatParam::use_full_params() {
  // Made at the first unshard: a view of full_ needs its bytes to be there when it is made.
  if (full_views_.empty()) full_views_ = param_views(full_, /*in_shard=*/false);
  for (size_t i = 0; i < entries_.size(); ++i) point_data(entries_[i].param, full_views_[i]);
}

void FlatParam::use_sharded_params() {
  for (size_t i = 0; i < entries_.size(); ++i) point_data(entries_[i].param, shard_views_[i]);
}

// [Note: a parameter rebound from outside]
// The user's parameters are the engine's leaves, pointed at the shard or the unsharded buffer; a
// LibTorch program may point one elsewhere: torch::load(model, file) calls set_ on every
// parameter, and `p.set_data(t)` or `p.data() = t` do the same. The optimizer still holds the
// same tensor, so nothing fails: forward keeps computing on the flat buffer and the optimizer
// steps storage nobody reads. So every root forward and every between-steps entry point (state
// dicts, checkpoints, SummonFullParams) looks for parameters whose storage is neither buffer's
// (two pointer compares each) and takes their values in: a whole parameter's piece is copied
// into the shard, as load_full_params would, and the parameter points back at it. Anything else
// (a 1-D piece from a torch::save of a sharded model, another shape) is refused by name: whose
// piece it is cannot be known.
namespace {

bool points_into(const at::Tensor& param, const at::Tensor& buffer) {
  return buffer.defined() && param.storage().unsafeGetStorageImpl() == buffer.storage().unsafeGetStorageImpl();
}

std::string shape_text(at::IntArrayRef shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace

std::pair<std::vector<size_t>, int> FlatParam::take_in_rebound() {
  std::vector<size_t> fresh;
  int taken = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    FlatEntry& e = entries_[i];
    if (points_into(e.param, shard_) || points_into(e.param, full_)) continue;
    const at::Tensor value = e.param.detach();  // keeps the rebound storage alive
    TORCH_CHECK(value.sizes().vec() == e.shape, "fsdp: parameter '", e.name, "' was rebound to a "
                "tensor of shape ", shape_text(value.sizes()), " (torch::load, set_data or `.data =` "
                "on a sharded model), but it is ", shape_text(e.shape), " in the model",
                value.dim() == 1 && sharded() ? " (a torch::save of a sharded model holds each rank's "
                "1-D pieces, which cannot be told apart)" : "",
                ". Load a file of the whole model: write it with torch::save inside "
                "fsdp::SummonFullParams or with fsdp::save_full_params, or save and load "
                "fsdp::save_checkpoint / fsdp::load_sharded");
    // set_ leaves the parameter a new gradient accumulator; made now, while the parameter has
    // its whole shape, which autograd checks gradients against.
    if (e.param.requires_grad()) {
      auto accumulator = torch::autograd::impl::grad_accumulator(e.param);
      if (accumulator != e.grad_accumulator) {
        e.grad_accumulator = std::move(accumulator);
        fresh.push_back(i);
      }
    }
    point_data(e.param, shard_views_[i]);
    if (!e.outside_shard()) {
      torch::NoGradGuard no_grad;
      e.in_shard(shard_).copy_(local_piece(e, value));
    }
    ++taken;
  }
  return {fresh, taken};
}

void FlatParam::use_sharded_grads() {
  auto [params, grads] = sharded_grads();
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i];
}

std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> FlatParam::sharded_grads() {
  at::Tensor& shard = grad_shard();
  if (grad_views_.empty()) {
    for (const auto& e : entries_) {
      grad_views_.push_back(sharded() ? alias(shard, e.shard_begin, {e.shard_end - e.shard_begin})
                                      : alias(shard, e.offset, e.shape));
    }
  }
  std::vector<at::Tensor> params, grads;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!entries_[i].param.requires_grad()) continue;
    params.push_back(entries_[i].param);
    grads.push_back(grad_views_[i]);
  }
  return {params, grads};
}

bool FlatParam::has_sharded_grads() const {
  if (!grad_shard_.defined() || grad_shard_released_) return false;
  for (const auto& e : entries_) {
    if (e.param.requires_grad() && !e.param.grad().defined()) return false;
  }
  return true;
}

std::vector<size_t> FlatParam::refresh_grad_accumulators() {
  std::vector<size_t> fresh;
  for (size_t i = 0; i < entries_.size(); ++i) {
    FlatEntry& e = entries_[i];
    if (!e.param.requires_grad()) continue;
    // Autograd drops a leaf's accumulator only when set_data changes its dtype or device: with
    // neither mixed precision nor offload, re-pointing keeps both, so a known accumulator stays
    // (looking it up takes a lock per parameter and unshard).
    if (e.grad_accumulator && !mixed_precision() && !offloaded()) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(e.param);
    if (accumulator == e.grad_accumulator) continue;
    e.grad_accumulator = std::move(accumulator);
    fresh.push_back(i);
  }
  return fresh;
}

}  // namespace fsdp
