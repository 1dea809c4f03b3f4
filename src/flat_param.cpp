#include "flat_param.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

namespace fsdp {

namespace {

void release_storage(const at::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }

void refill_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->nbytes() == nbytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

// A tensor sharing `base`'s storage at [offset, offset + numel) with `shape`, that autograd does
// not consider a view: optimizers call detach_() on gradients, which views refuse.
at::Tensor alias(const at::Tensor& base, int64_t offset, at::IntArrayRef shape) {
  torch::NoGradGuard no_grad;
  return at::empty({0}, base.options()).set_(base.storage(), base.storage_offset() + offset, shape,
                                             c10::contiguous_strides(shape));
}

void point_data(at::Tensor& param, const at::Tensor& data) {
  torch::NoGradGuard no_grad;
  param.set_data(data);
}

}  // namespace

FlatParam::FlatParam(std::vector<std::pair<std::string, at::Tensor>> params, int rank,
                     int world_size)
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
    entry.numel = param.numel();
    entry.offset = numel_;
    numel_ += entry.numel;
    if (param.requires_grad()) {
      ++requires_grad_count_;
      // Created now, while the parameter has its full shape: autograd checks incoming
      // gradients against the shape the accumulator was made with.
      entry.grad_accumulator = torch::autograd::impl::grad_accumulator(param);
    }
    entries_.push_back(std::move(entry));
  }
  shard_numel_ = (numel_ + world_size - 1) / world_size;
  const int64_t shard_offset = rank * shard_numel_;
  for (auto& e : entries_) {
    e.shard_begin = std::clamp(e.offset - shard_offset, int64_t{0}, shard_numel_);
    e.shard_end = std::clamp(e.offset + e.numel - shard_offset, int64_t{0}, shard_numel_);
  }

  auto options = params.empty() ? at::TensorOptions(at::kFloat)
                                 : params.front().second.options().requires_grad(false);
  full_ = at::zeros({padded_numel()}, options);
  {
    torch::NoGradGuard no_grad;
    for (auto& e : entries_) full_.narrow(0, e.offset, e.numel).copy_(e.param.reshape({-1}));
  }
  shard_ = sharded() ? full_.narrow(0, shard_offset, shard_numel_).clone() : full_;
  use_sharded_params();  // releases the parameters' original storage
  free_full();
  full_grad_ = at::empty({padded_numel()}, options);
  free_full_grad();
}

int64_t FlatParam::element_size() const { return static_cast<int64_t>(shard_.element_size()); }

at::Tensor& FlatParam::grad_shard() {
  if (!grad_shard_.defined()) grad_shard_ = at::zeros_like(shard_);
  return grad_shard_;
}

void FlatParam::allocate_full() {
  if (sharded()) refill_storage(full_);
}
void FlatParam::free_full() {
  if (sharded()) release_storage(full_);
}

void FlatParam::allocate_full_grad() {
  refill_storage(full_grad_);
  full_grad_.zero_();
}
void FlatParam::free_full_grad() { release_storage(full_grad_); }

void FlatParam::use_full_params() {
  for (auto& e : entries_) point_data(e.param, full_.narrow(0, e.offset, e.numel).view(e.shape));
}

void FlatParam::use_sharded_params() {
  if (!sharded()) return use_full_params();
  for (auto& e : entries_) {
    point_data(e.param, shard_.narrow(0, e.shard_begin, e.shard_end - e.shard_begin));
  }
}

void FlatParam::use_full_grads() {
  for (auto& e : entries_) {
    if (!e.param.requires_grad()) continue;
    e.param.mutable_grad() = alias(full_grad_, e.offset, e.shape);
  }
}

void FlatParam::use_sharded_grads() {
  at::Tensor& grads = grad_shard();
  for (auto& e : entries_) {
    if (!e.param.requires_grad()) continue;
    e.param.mutable_grad() = sharded()
                                 ? alias(grads, e.shard_begin, {e.shard_end - e.shard_begin})
                                 : alias(grads, e.offset, e.shape);
  }
}

bool FlatParam::has_sharded_grads() const {
  if (!grad_shard_.defined()) return false;
  for (const auto& e : entries_) {
    if (e.param.requires_grad() && !e.param.grad().defined()) return false;
  }
  return true;
}

}  // namespace fsdp
