#include "io/checkpoint_agreement.h"

#include <fsdp/error_text.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

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
