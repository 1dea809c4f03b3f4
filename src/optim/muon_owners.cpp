#include "optim/muon_owners.h"

#include <algorithm>
#include <map>

namespace fsdp::optim::muon {

std::vector<int> choose_owners(const std::vector<MatrixCost>& matrices, int group_size) {
  std::vector<int> owners(matrices.size(), 0);
  std::vector<double> load(group_size, 0.0);
  std::map<int, std::vector<size_t>, std::greater<>> by_unit;  // the last unit first
  for (size_t i = 0; i < matrices.size(); ++i) by_unit[matrices[i].unit].push_back(i);
  for (auto& [unit, members] : by_unit) {
    std::stable_sort(members.begin(), members.end(),
                     [&](size_t a, size_t b) { return matrices[a].flops > matrices[b].flops; });
    for (size_t i : members) {
      const int least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      owners[i] = least;
      load[least] += matrices[i].flops;
    }
  }
  return owners;
}

StepOwners choose_step_owners(const std::vector<MatrixCost>& matrices, int shard_group_size, int tp_size) {
  StepOwners owners{choose_owners(matrices, shard_group_size), std::vector<int>(matrices.size(), -1)};
  for (int position = 0; position < shard_group_size; ++position) {
    std::vector<size_t> split;  // the split matrices this position owns, in order
    std::vector<MatrixCost> costs;
    for (size_t i = 0; i < matrices.size(); ++i) {
      if (!matrices[i].split || owners.shard[i] != position) continue;
      split.push_back(i);
      costs.push_back({matrices[i].flops, 0});
    }
    const std::vector<int> chosen = choose_owners(costs, tp_size);
    for (size_t k = 0; k < split.size(); ++k) owners.tp[split[k]] = chosen[k];
  }
  return owners;
}

}  // namespace fsdp::optim::muon
