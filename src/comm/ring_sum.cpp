#include "comm/ring_sum.h"

#include <ATen/ATen.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace fsdp {

void add_floats(float* to, const float* x, const float* y, int64_t n, bool streaming, float divisor) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (streaming && divisor == 1.0f && reinterpret_cast<uintptr_t>(to) % 16 == 0) {
    for (; i + 8 <= n; i += 8) {
      _mm_stream_ps(to + i, _mm_add_ps(_mm_loadu_ps(x + i), _mm_loadu_ps(y + i)));
      _mm_stream_ps(to + i + 4, _mm_add_ps(_mm_loadu_ps(x + i + 4), _mm_loadu_ps(y + i + 4)));
    }
    for (; i < n; ++i) to[i] = x[i] + y[i];
    _mm_sfence();
    return;
  }
#endif
  if (divisor == 1.0f) {
    for (; i < n; ++i) to[i] = x[i] + y[i];
    return;
  }
  for (; i < n; ++i) {
    const float sum = x[i] + y[i];  // rounded first, as ATen's add leaves it
    to[i] = sum / divisor;
  }
}

namespace {

at::Tensor view_of(const void* data, int64_t n, c10::ScalarType dtype) {
  return at::from_blob(const_cast<void*>(data), {n}, at::TensorOptions().dtype(dtype));
}

}  // namespace

void sum_in_ring_order(void* out, const std::vector<const void*>& peers, const void* own, int64_t n,
                       c10::ScalarType dtype, void* scratch, bool streaming, double divide_by) {
  TORCH_INTERNAL_ASSERT(!peers.empty(), "a sum over ranks has at least one peer");
  // ATen divides a float tensor by a double scalar cast to float.
  const auto float_divisor = static_cast<float>(divide_by);
  if (peers.size() == 1 && dtype == at::kFloat) {
    add_floats(static_cast<float*>(out), static_cast<const float*>(peers[0]),
               static_cast<const float*>(own), n, streaming, float_divisor);
    return;
  }
  at::Tensor partial = view_of(peers[0], n, dtype);
  if (peers.size() > 1) {
    at::Tensor sum = scratch ? view_of(scratch, n, dtype) : at::empty({n}, at::TensorOptions().dtype(dtype));
    at::add_out(sum, partial, view_of(peers[1], n, dtype));
    for (size_t k = 2; k < peers.size(); ++k) sum.add_(view_of(peers[k], n, dtype));
    partial = sum;
  }
  at::Tensor result = view_of(out, n, dtype);
  if (dtype == at::kFloat) {
    add_floats(static_cast<float*>(out), partial.const_data_ptr<float>(), static_cast<const float*>(own),
               n, streaming, float_divisor);
  } else {
    at::add_out(result, partial, view_of(own, n, dtype));
    if (divide_by != 1.0) result.div_(divide_by);
  }
}

}  // namespace fsdp
