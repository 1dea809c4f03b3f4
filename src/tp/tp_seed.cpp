// fsdp::tp::manual_seed (parallelize.h): one generator state per tensor-parallel group, for
// dropout in replicated regions ([Note: replicas that drifted apart] in src/io/tp_replica_check.cpp).
#include <fsdp/parallelize.h>

#include <torch/utils.h>

namespace fsdp::tp {

int64_t tp_group_index(const DeviceMesh& mesh, const std::string& tp_dim) {
  (void)mesh.size(tp_dim);  // throws naming the mesh's dimensions when it has no such one
  int64_t index = 0;
  for (const auto& dim : mesh.dims()) {
    if (dim.name != tp_dim) index = index * dim.size + mesh.coordinate(dim.name);
  }
  return index;
}

void manual_seed(const DeviceMesh& mesh, uint64_t seed, const std::string& tp_dim) {
  torch::manual_seed(seed + static_cast<uint64_t>(tp_group_index(mesh, tp_dim)));
}

}  // namespace fsdp::tp
