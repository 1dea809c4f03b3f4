#pragma once
/// A device mesh: the world's ranks laid out on named dimensions, outermost first (torchtitan's
/// `dp_replicate x dp_shard x tp`), with a process group along each dimension. Tensor
/// parallelism runs on the innermost (consecutive ranks: one host's), FSDP on the others.
///
/// Example (8 ranks: 2 replicas of FSDP over 2 ranks, each rank a tensor-parallel pair):
///   auto dist = fsdp::init_distributed();
///   fsdp::DeviceMesh mesh(dist->world, {{"dp_replicate", 2}, {"dp_shard", 2}, {"tp", 2}});
///   fsdp::ProcessGroup& tp = mesh.group("tp");             // ranks {2k, 2k+1}
///   fsdp::ProcessGroup& dp = mesh.group({"dp_replicate", "dp_shard"});  // 4 ranks, one tp index

#include <fsdp/distributed.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

struct MeshDim {
  std::string name;
  int size = 1;
};

class DeviceMesh {
 public:
  /// Lays the ranks of `world` out on `dims` (their sizes multiply to the world's size; names
  /// distinct). Every rank constructs it alike: the groups along each dimension are made here
  /// (a collective among each group's members). Warns, on the group's first rank, when a group
  /// of the innermost dimension spans hosts (tensor parallelism belongs inside a host).
  DeviceMesh(std::shared_ptr<ProcessGroup> world, std::vector<MeshDim> dims);

  const std::vector<MeshDim>& dims() const { return dims_; }
  /// The size of dimension `dim`; throws naming the mesh's dimensions if it has none such.
  int size(const std::string& dim) const;
  /// This rank's index along `dim`.
  int coordinate(const std::string& dim) const;
  /// The ranks that differ from this one along `dim` only, in its order.
  ProcessGroup& group(const std::string& dim) { return *group_ptr(dim); }
  std::shared_ptr<ProcessGroup> group_ptr(const std::string& dim);
  /// The ranks that differ from this one along `dims` only (outermost first, as the mesh orders
  /// them): e.g. FSDP's {"dp_replicate", "dp_shard"}. Made at the first call, a collective of
  /// its members: every rank asks for the same groups in the same order.
  ProcessGroup& group(const std::vector<std::string>& dims) { return *group_ptr(dims); }
  std::shared_ptr<ProcessGroup> group_ptr(const std::vector<std::string>& dims);
  ProcessGroup& world() { return *world_; }

 private:
  int index_of(const std::string& dim) const;
  std::vector<int> members_along(const std::vector<int>& dim_indices) const;

  std::shared_ptr<ProcessGroup> world_;
  std::vector<MeshDim> dims_;
  std::vector<int> coordinates_;  // this rank's, per dimension
  std::map<std::vector<int>, std::shared_ptr<ProcessGroup>> groups_;  // by dimension indices
};

}  // namespace fsdp
