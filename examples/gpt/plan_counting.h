#pragma once
// The planner's byte counts of a GPT (gpt_plan.cpp and the families' *_plan.cpp), checked: a
// count beyond int64 throws naming the flags, never wraps.

#include <fsdp/checked_math.h>
#include <fsdp/parallelize.h>
#include <fsdp/plan.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace gpt {

// Bytes counted from the GPT's sizes, checked: minGPT's attention scores alone are H·T² per
// sequence, beyond int64 at the largest --heads and --seq.
inline int64_t must_fit(std::optional<int64_t> bytes) {
  TORCH_CHECK(bytes, "the GPT's sizes (--layers, --dim, --heads, --seq, --vocab) count more bytes "
              "than int64 holds; choose a smaller model");
  return *bytes;
}

inline int64_t product(std::initializer_list<int64_t> factors) {
  return must_fit(fsdp::checked_product(std::vector<int64_t>(factors)));
}

inline int64_t sum(std::initializer_list<int64_t> terms) { return must_fit(fsdp::checked_sum(terms)); }

// Tensor parallelism's collectives: plan_tp_moves.cpp, from the styles' own descriptions.
/// What one of tp ranks sends to all-reduce n elements of `bytes` each: 2(tp-1)/tp·n·bytes
/// (fsdp::tp::sent_bytes's ring).
inline int64_t tp_all_reduce_bytes(int64_t n, int64_t bytes, int64_t tp) {
  return must_fit(fsdp::tp::sent_bytes({fsdp::tp::Move::AllReduce, true, "", n, false, ""}, tp, bytes));
}

}  // namespace gpt
