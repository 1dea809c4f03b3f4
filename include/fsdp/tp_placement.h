#pragma once
/// fsdp::tp::Placement: how one parameter of a parallelized model lies over the tensor-parallel
/// ranks. Tensor-free: the sharded model's record of each parameter holds one
/// ([Note: one placement per parameter] in src/core/flat_param.h).

#include <cstdint>
#include <memory>
#include <vector>

namespace fsdp::tp {

class TensorParallel;

struct Placement {
  std::shared_ptr<TensorParallel> tp;
  int64_t dim = -1;                   ///< the dimension split over the ranks; -1: replicated
  int64_t fused_chunks = 1;           ///< parts side by side along `dim`, each split
  std::vector<int64_t> global_shape;  ///< the whole parameter's shape
  bool replicated() const { return dim < 0; }
};

}  // namespace fsdp::tp
