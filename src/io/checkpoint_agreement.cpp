#include "io/checkpoint_agreement.h"

#include <fsdp/error_text.h>
#include <fsdp/parallelize.h>

#include "core/sharded_view.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

namespace fsdp::detail {

// One all-reduce of the lengths, one of the bytes if any.
std::vector<std::string> all_gather_strings(ProcessGroup& world, const std::string& mine) {
  const int size = world.size(), rank = world.rank();
  at::Tensor lengths = at::zeros({size}, at::kLong);
  lengths.data_ptr<int64_t>()[rank] = static_cast<int64_t>(mine.size());
  all_reduce_sum(world, lengths);
  const int64_t longest = lengths.max().item<int64_t>();
  std::vector<std::string> all(size);
  if (longest == 0) return all;
  at::Tensor bytes = at::zeros({size, longest}, at::kByte);
  std::memcpy(bytes.data_ptr<uint8_t>() + rank * longest, mine.data(), mine.size());
  all_reduce_sum(world, bytes);
  for (int r = 0; r < size; ++r) {
    const char* row = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>() + r * longest);
    all[r].assign(row, static_cast<size_t>(lengths.data_ptr<int64_t>()[r]));
  }
  return all;
}

int AgreementGroups::tp_rank() const { return tp ? tp->rank() : 0; }
int AgreementGroups::tp_size() const { return tp ? tp->size() : 1; }

AgreementGroups agreement_groups(const ShardedView& model) {
  AgreementGroups groups{&model.world(), nullptr};
  for (const auto& p : model.params()) {
    const auto& placement = p.tensor_parallel();
    if (!placement || placement->tp->size() == 1) continue;
    TORCH_CHECK(!groups.tp || &groups.tp->group() == &placement->tp->group(), "checkpoint: the model's "
                "parameters belong to two tensor-parallel groups ('", p.name(), "' to another than the "
                "first parameters'): parallelize a model over one group");
    groups.tp = placement->tp;
  }
  return groups;
}

namespace {

// Strings as one: each as its length, ':', its bytes.
std::string length_prefixed(const std::vector<std::string>& strings) {
  std::string out;
  for (const auto& s : strings) out += std::to_string(s.size()) + ":" + s;
  return out;
}

std::vector<std::string> split_length_prefixed(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = 0; at < text.size();) {
    const size_t colon = text.find(':', at);
    const size_t length = std::stoull(text.substr(at, colon - at));
    out.push_back(text.substr(colon + 1, length));
    at = colon + 1 + length;
  }
  return out;
}

}  // namespace

std::vector<std::string> all_gather_strings(const AgreementGroups& groups, const std::string& mine) {
  const std::vector<std::string> of_world = all_gather_strings(*groups.world, mine);
  if (!groups.tp) return of_world;
  // Each tp rank's list of its world's strings: rank d * T + t is list t's string d.
  const std::vector<std::string> lists = all_gather_strings(groups.tp->group(), length_prefixed(of_world));
  const int tp_size = groups.tp_size(), world_size = groups.world->size();
  std::vector<std::string> all(static_cast<size_t>(world_size * tp_size));
  for (int t = 0; t < tp_size; ++t) {
    const std::vector<std::string> list = split_length_prefixed(lists[t]);
    for (int d = 0; d < world_size; ++d) all[d * tp_size + t] = list[d];
  }
  return all;
}

void throw_if_any_failed(const AgreementGroups& groups, const std::string& error, const std::string& what) {
  if (!groups.tp) return throw_if_any_failed(*groups.world, error, what);
  const auto errors = all_gather_strings(groups, error);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    const auto failed = std::count_if(errors.begin(), errors.end(), [](const std::string& e) { return !e.empty(); });
    TORCH_CHECK(false, what, ": rank ", r, " (dp rank ", r / groups.tp_size(), ", tp rank ", r % groups.tp_size(),
                "): ", errors[r], failed > 1 ? " (and " + std::to_string(failed - 1) + " more ranks failed)" : "");
  }
}

void throw_if_any_failed(ProcessGroup& world, const std::string& error, const std::string& what) {
  const auto errors = all_gather_strings(world, error);
  int failed = 0, first = -1;
  for (int r = 0; r < static_cast<int>(errors.size()); ++r) {
    if (errors[r].empty()) continue;
    ++failed;
    if (first < 0) first = r;
  }
  TORCH_CHECK(failed == 0, what, ": rank ", first, ": ", errors[first],
              failed > 1 ? " (and " + std::to_string(failed - 1) + " more ranks failed)" : "");
}

std::string try_local(const std::function<void()>& local) {
  try {
    local();
  } catch (const std::exception& e) {
    return message_of(e);
  }
  return "";
}

}  // namespace fsdp::detail
