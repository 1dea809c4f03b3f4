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

}  // namespace fsdp::optim::muon
