#include "core/model_check.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace fsdp {

namespace {

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += line + "\n";
  return out;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The first difference between two descriptions, in words; empty when they agree.
std::string first_difference(const std::vector<std::string>& mine, int my_rank,
                             const std::vector<std::string>& theirs, int their_rank) {
  const size_t n = std::min(mine.size(), theirs.size());
  for (size_t i = 0; i < n; ++i) {
    if (mine[i] != theirs[i]) {
      return "parameter #" + std::to_string(i) + " is '" + mine[i] + "' on rank " +
             std::to_string(my_rank) + " but '" + theirs[i] + "' on rank " +
             std::to_string(their_rank);
    }
  }
  if (mine.size() == theirs.size()) return "";
  const bool i_have_more = mine.size() > theirs.size();
  const auto& longer = i_have_more ? mine : theirs;
  return "rank " + std::to_string(i_have_more ? my_rank : their_rank) + " has " +
         std::to_string(longer.size()) + " parameters and rank " +
         std::to_string(i_have_more ? their_rank : my_rank) + " only " +
         std::to_string(n) + "; the first extra one is '" + longer[n] + "'";
}

// Relative to a tensor's magnitude: float32 sums of equal values differ only by the order of
// their additions (a rank's thread count), by a few float32 roundings; other values (another
// seed) differ in their leading digits.
constexpr double kTolerance = 1e-5;

// [N, 2] float64 on the host: each tensor's sum and sum of squares (zeros for a meta tensor).
at::Tensor checksums_of(const NamedTensors& tensors) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> rows;
  for (const auto& item : tensors) {
    const at::Tensor& t = item.second;
    if (t.is_meta() || t.numel() == 0) {
      rows.push_back(at::zeros({2}, at::kDouble).to(t.is_meta() ? c10::Device(c10::kCPU) : t.device()));
      continue;
    }
    // Reductions in the tensor's own dtype (float32 or wider) make no copy of it: deferred
    // sharding holds one unit at a time, and a float64 copy would be twice that unit.
    const at::Tensor values = t.is_complex() ? at::view_as_real(t) : t;
    const bool own_dtype = values.scalar_type() == at::kFloat || values.scalar_type() == at::kDouble;
    const std::optional<at::ScalarType> dtype =
        own_dtype ? std::nullopt : std::optional<at::ScalarType>(at::kFloat);
    const at::Tensor norm = at::linalg_vector_norm(values, 2, std::nullopt, false, dtype);
    rows.push_back(at::stack({values.sum(dtype), norm * norm}).to(at::kDouble));
  }
  if (rows.empty()) return at::zeros({0, 2}, at::kDouble);
  // One copy to the host (on a GPU, one synchronisation) for the whole model where it can be.
  const bool one_device = std::all_of(rows.begin(), rows.end(), [&](const at::Tensor& row) {
    return row.device() == rows.front().device();
  });
  if (!one_device) {
    for (auto& row : rows) row = row.cpu();
  }
  return at::stack(rows).cpu();
}

bool same_checksum(const double* a, const double* b, int64_t numel) {
  const double magnitude = std::sqrt(std::max(a[1], b[1]));  // the tensors' L2 norm
  const double sum_scale = magnitude * std::sqrt(static_cast<double>(numel));  // >= sum |x|
  return std::abs(a[0] - b[0]) <= kTolerance * sum_scale &&
         std::abs(a[1] - b[1]) <= kTolerance * std::max(a[1], b[1]);
}

}  // namespace

void check_same_model_on_all_ranks(ProcessGroup& group, const ModelDescription& mine) {
  const std::string key = group.next_store_key("fsdp/model");
  const std::string text = join(mine.lines);
  group.store().set(key + "/" + std::to_string(group.rank()),
                    std::vector<uint8_t>(text.begin(), text.end()));
  std::string difference;
  for (int other = 0; other < group.size() && difference.empty(); ++other) {
    if (other == group.rank()) continue;
    std::vector<uint8_t> bytes;
    try {
      bytes = group.store().get(key + "/" + std::to_string(other));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "fully_shard: rank ", other, " did not publish its model description to rank ",
                  group.rank(), " within the timeout: it has probably died or is stuck before "
                  "fully_shard(). (", e.what(), ")");
    }
    difference = first_difference(mine.lines, group.rank(),
                                  split(std::string(bytes.begin(), bytes.end())), other);
  }
  // Everyone finishes reading before anyone throws: rank 0 serves the store, and its exit would
  // turn the others' clear message into a lost connection.
  group.store().set(key + "/read/" + std::to_string(group.rank()), std::vector<uint8_t>{1});
  std::vector<std::string> read_keys;
  for (int r = 0; r < group.size(); ++r) read_keys.push_back(key + "/read/" + std::to_string(r));
  group.store().wait(read_keys);
  TORCH_CHECK(difference.empty(), "fully_shard: the model differs across ranks: ", difference,
              ". Every rank must build the same model (same code, configuration and dtypes) "
              "before fully_shard().");
}

void check_same_initial_values(ProcessGroup& world, const NamedTensors& tensors) {
  if (world.size() == 1 || tensors.empty()) return;
  const int64_t n = static_cast<int64_t>(tensors.size());
  // Every rank fills its own row; the sum over ranks is every rank's table.
  at::Tensor table = at::zeros({world.size(), n, 2}, at::kDouble);
  table[world.rank()].copy_(checksums_of(tensors));
  all_reduce_sum(world, table);
  const double* sums = table.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    std::ostringstream differing;
    const double* rank0 = sums + 2 * i;
    for (int r = 1; r < world.size(); ++r) {
      const double* other = sums + 2 * (r * n + i);
      if (!same_checksum(rank0, other, tensors[i].second.numel())) {
        differing << (differing.tellp() > 0 ? ", " : "") << "rank " << r;
      }
    }
    TORCH_CHECK(differing.tellp() == 0, "fully_shard: the initial values of parameter '",
                tensors[i].first, "' differ across ranks (", differing.str(), " against rank 0): "
                "every rank must build the same model. LibTorch seeds each process at random: "
                "seed every rank the same before building the model (e.g. torch::manual_seed(0)), "
                "or set FullyShardOptions().sync_module_states(true) to take rank 0's values.");
  }
}

}  // namespace fsdp
