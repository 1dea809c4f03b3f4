#include <fsdp/device_mesh.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <set>

namespace fsdp {

namespace {

std::string mesh_text(const std::vector<MeshDim>& dims) {
  std::string out;
  for (const auto& d : dims) out += (out.empty() ? "" : " x ") + d.name + " " + std::to_string(d.size);
  return out;
}

// How many of `members` (world ranks) share this rank's host: hosts hold LOCAL_WORLD_SIZE
// consecutive ranks, as torchrun and fsdprun place them (unknown: all of them).
int members_on_this_host(const ProcessGroup& world, const std::vector<int>& members) {
  const auto local = world.settings().local_world_size;
  if (!local || *local < 1) return static_cast<int>(members.size());
  const int host = world.rank() / *local;
  return static_cast<int>(std::count_if(members.begin(), members.end(),
                                        [&](int r) { return r / *local == host; }));
}

// Every rank must build the same mesh: a rank that gave other dimensions (or another order)
// would wait in its subgroups' rendezvous until the timeout. The ranks' descriptions meet first,
// in one all-reduce of a table with a row per rank, and a difference is refused on every rank,
// naming what each gave.
void check_same_mesh_on_every_rank(ProcessGroup& world, const std::string& text) {
  if (world.size() == 1) return;
  constexpr int64_t kWidth = 160;
  at::Tensor table = at::zeros({world.size(), kWidth}, at::kInt);
  auto row = table.accessor<int, 2>()[world.rank()];
  for (size_t i = 0; i < text.size() && static_cast<int64_t>(i) < kWidth; ++i) row[i] = static_cast<unsigned char>(text[i]);
  all_reduce_sum(world, table);
  auto rows = table.accessor<int, 2>();
  std::vector<std::string> given(world.size());
  for (int r = 0; r < world.size(); ++r) {
    for (int64_t i = 0; i < kWidth && rows[r][i] != 0; ++i) given[r] += static_cast<char>(rows[r][i]);
  }
  std::string differing;
  for (int r = 1; r < world.size(); ++r) {
    if (given[r] != given[0]) differing += ", rank " + std::to_string(r) + " gave " + given[r];
  }
  TORCH_CHECK(differing.empty(), "DeviceMesh: the ranks built different meshes: rank 0 gave ", given[0], differing,
              "; build the same mesh (the same dimensions and sizes, in the same order) on every rank");
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, std::vector<MeshDim> dims)
    : world_(std::move(world)), dims_(std::move(dims)) {
  TORCH_CHECK(!dims_.empty(), "DeviceMesh: give at least one dimension");
  int64_t product = 1;
  std::set<std::string> names;
  for (const auto& d : dims_) {
    TORCH_CHECK(d.size >= 1, "DeviceMesh: dimension '", d.name, "' has size ", d.size, "; sizes are >= 1");
    TORCH_CHECK(names.insert(d.name).second, "DeviceMesh: dimension '", d.name, "' is named twice");
    product *= d.size;
  }
  TORCH_CHECK(product == world_->size(), "DeviceMesh ", mesh_text(dims_), " has ", product,
              " ranks but the world has ", world_->size(),
              ": choose sizes whose product is the number of ranks (e.g. --tp dividing it)");
  check_same_mesh_on_every_rank(*world_, mesh_text(dims_));
  int rest = world_->rank();
  coordinates_.assign(dims_.size(), 0);
  for (size_t i = dims_.size(); i-- > 0;) {
    coordinates_[i] = rest % dims_[i].size;
    rest /= dims_[i].size;
  }
  for (size_t i = 0; i < dims_.size(); ++i) group_ptr(std::vector<std::string>{dims_[i].name});
  // Tensor parallelism moves activations at every layer: across hosts it waits on the network.
  ProcessGroup& inner = group(dims_.back().name);
  const std::vector<int> inner_members = members_along({static_cast<int>(dims_.size()) - 1});
  if (inner.size() > 1 && members_on_this_host(*world_, inner_members) < inner.size() &&
      inner.rank() == 0) {
    std::fprintf(stderr,
                 "fsdp: warning: the mesh's '%s' group (%d ranks) spans hosts; tensor parallelism "
                 "all-gathers and reduce-scatters activations at every layer, so keep it inside a "
                 "host (a size dividing the ranks per host)\n",
                 dims_.back().name.c_str(), inner.size());
  }
}

int DeviceMesh::index_of(const std::string& dim) const {
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].name == dim) return static_cast<int>(i);
  }
  TORCH_CHECK(false, "DeviceMesh ", mesh_text(dims_), " has no dimension '", dim, "'");
}

int DeviceMesh::size(const std::string& dim) const { return dims_[index_of(dim)].size; }

int DeviceMesh::coordinate(const std::string& dim) const { return coordinates_[index_of(dim)]; }

std::shared_ptr<ProcessGroup> DeviceMesh::group_ptr(const std::string& dim) {
  return group_ptr(std::vector<std::string>{dim});
}

std::vector<int> DeviceMesh::members_along(const std::vector<int>& dim_indices) const {
  // Every rank whose coordinates equal this one's outside `dim_indices`, in row-major order.
  std::vector<int> members;
  for (int r = 0; r < world_->size(); ++r) {
    int rest = r;
    bool same = true;
    for (size_t i = dims_.size(); i-- > 0;) {
      const int c = rest % dims_[i].size;
      rest /= dims_[i].size;
      const bool varies = std::find(dim_indices.begin(), dim_indices.end(), static_cast<int>(i)) != dim_indices.end();
      if (!varies && c != coordinates_[i]) same = false;
    }
    if (same) members.push_back(r);
  }
  return members;
}

std::shared_ptr<ProcessGroup> DeviceMesh::group_ptr(const std::vector<std::string>& dims) {
  std::vector<int> indices;
  for (const auto& d : dims) indices.push_back(index_of(d));
  TORCH_CHECK(std::is_sorted(indices.begin(), indices.end()) &&
                  std::adjacent_find(indices.begin(), indices.end()) == indices.end(),
              "DeviceMesh: name the dimensions of a group once each, outermost first, as the mesh orders them (",
              mesh_text(dims_), ")");
  auto& group = groups_[indices];
  if (group) return group;
  std::string name = "mesh";
  for (const auto& d : dims) name += "." + d;
  const std::vector<int> members = members_along(indices);
  // A store key of its own: a second mesh over the same world (a program that trains twice)
  // would otherwise meet the first one's Gloo addresses under the same prefix and time out.
  group = world_->subgroup(members, world_->next_store_key(name));
  // The hybrid strategies' default shard group: the group's ranks on one host.
  if (world_->settings().local_world_size) {
    GroupSettings settings = group->settings();
    settings.local_world_size = members_on_this_host(*world_, members);
    group->set_settings(settings);
  }
  return group;
}

}  // namespace fsdp
