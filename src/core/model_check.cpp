#include "core/model_check.h"
#include "util/hash64.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
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

// Bytes copied to the host at a time from a device: a multiple of kHashChunkBytes, so a tensor
// hashes alike wherever it lives.
constexpr int64_t kHostBlockBytes = int64_t{64} << 20;

// The bits of `t`'s elements in order (a meta tensor's: none). A tensor on a device crosses to
// the host in blocks, so no copy of a whole unit is ever held twice.
uint64_t hash_of(const at::Tensor& t) {
  if (t.is_meta() || t.numel() == 0) return combine_chunk_hashes({}, 0);
  const at::Tensor flat = t.detach().contiguous().view({-1});
  const int64_t element = static_cast<int64_t>(flat.element_size());
  const int64_t total = flat.numel() * element;
  std::vector<uint64_t> chunks;
  if (flat.is_cpu()) {
    hash_chunks(flat.data_ptr(), static_cast<size_t>(total), chunks);
  } else {
    const int64_t block = kHostBlockBytes / element;
    for (int64_t begin = 0; begin < flat.numel(); begin += block) {
      const at::Tensor host = flat.narrow(0, begin, std::min(block, flat.numel() - begin)).cpu();
      hash_chunks(host.data_ptr(), static_cast<size_t>(host.numel() * element), chunks);
    }
  }
  return combine_chunk_hashes(chunks, static_cast<uint64_t>(total));
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
      TORCH_CHECK(false, "fully_shard: rank ", other, " did not send its model description to rank ",
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
  // Every rank fills its own row with its hashes; the sum over ranks is every rank's table.
  at::Tensor table = at::zeros({world.size(), n}, at::kLong);
  int64_t* rows = table.data_ptr<int64_t>();
  {
    torch::NoGradGuard no_grad;
    for (int64_t i = 0; i < n; ++i) {
      rows[world.rank() * n + i] = static_cast<int64_t>(hash_of(tensors[i].second));
    }
  }
  all_reduce_sum(world, table);
  for (int64_t i = 0; i < n; ++i) {
    std::ostringstream differing;
    for (int r = 1; r < world.size(); ++r) {
      if (rows[r * n + i] != rows[i]) differing << (differing.tellp() > 0 ? ", " : "") << "rank " << r;
    }
    TORCH_CHECK(differing.tellp() == 0, "fully_shard: the initial values of parameter '",
                tensors[i].first, "' differ across ranks (", differing.str(), " against rank 0): "
                "every rank must build the same model. LibTorch seeds each process at random: "
                "seed every rank the same before building the model (e.g. torch::manual_seed(0)), "
                "or set FullyShardOptions().sync_module_states(true) to take rank 0's values.");
  }
}

}  // namespace fsdp
