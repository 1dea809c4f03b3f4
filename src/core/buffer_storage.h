#pragma once
// The storage of a unit's refilled buffers (the unsharded parameters, their gradient, the gradient
// shard): their bytes released in place and given again, the storage object kept, so that views
// of them (autograd's saved tensors, the parameters) stay valid ([Note: storage reuse] in
// core/flat_param.h).

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fsdp {

/// Frees `t`'s bytes; its storage object (and every view of it) stays.
void release_storage(const at::Tensor& t);
/// Gives `t`'s storage the bytes of `t` again, unless it holds them.
void refill_storage(const at::Tensor& t);
/// A 1-D tensor of `numel` elements whose storage holds no bytes yet (refill_storage gives them):
/// creating the unsharded buffers must not allocate them, even for a moment.
at::Tensor unallocated(int64_t numel, const at::TensorOptions& options);

}  // namespace fsdp
