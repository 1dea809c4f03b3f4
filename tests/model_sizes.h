#pragma once
// Sizes the byte-count tests expect, derived from the unsharded model alone (never from what the
// library reports about its units): a GPT's units are its blocks h.{i} and the root, which holds
// every other parameter.

#include "gpt.h"

#include <map>
#include <string>

namespace fsdp_test {

/// Ψ_i, the number of parameter elements of each unit: "h.0", "h.1", ... and "" for the root.
inline std::map<std::string, int64_t> gpt_unit_numels(const gpt::GPTConfig& config) {
  std::map<std::string, int64_t> numels;
  auto model = gpt::make_gpt(config, 1);
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const std::string unit = name.rfind("h.", 0) == 0 ? name.substr(0, name.find('.', 2)) : "";
    numels[unit] += item.value().numel();
  }
  return numels;
}

/// Elements of one rank's shard when `numel` is split over `f` ranks: padded up to a multiple of f.
inline int64_t shard_elements(int64_t numel, int64_t f) { return (numel + f - 1) / f; }

/// Bytes one rank sends in a ring all-reduce of `bytes` over `r` ranks: a reduce-scatter and an
/// all-gather, each passing r-1 of the r chunks on (whole bytes, rounded down as counted).
inline int64_t ring_all_reduce_bytes(int64_t bytes, int64_t r) {
  const int64_t reduce_scatter_sent = (r - 1) * bytes;  // r-1 chunks of bytes/r, times r
  const int64_t all_gather_sent = (r - 1) * bytes;
  return (reduce_scatter_sent + all_gather_sent) / r;
}

}  // namespace fsdp_test
