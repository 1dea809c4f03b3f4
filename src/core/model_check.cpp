#include "core/model_check.h"

#include <c10/util/Exception.h>

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

}  // namespace fsdp
