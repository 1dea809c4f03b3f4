// local_heads (parallelize.h): the attention heads of one tensor-parallel rank, refused by name
// where the tp size does not divide them (else a model's view fails inside ATen, naming neither).
#include <fsdp/parallelize.h>

#include <c10/util/Exception.h>

namespace fsdp::tp {

int64_t local_heads(int64_t heads, int tp_size, const std::string& what) {
  TORCH_CHECK(tp_size >= 1, "local_heads: the tp size must be at least 1, got ", tp_size);
  TORCH_CHECK(heads >= 1 && heads % tp_size == 0, "tensor parallelism: the tp size ", tp_size,
              " (--tp) does not divide the ", heads, " ", what, ": each tp rank runs ", what,
              " / tp of them. Choose a tp size dividing ", heads, ", or a number of ", what,
              " that the tp size divides");
  return heads / tp_size;
}

int64_t local_heads(int64_t heads, const TensorParallel& tp, const std::string& what) {
  return local_heads(heads, tp.size(), what);
}

}  // namespace fsdp::tp
