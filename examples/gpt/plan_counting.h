#pragma once
// The planner's byte counts of a GPT (gpt_plan.cpp and the families' *_plan.cpp), checked: a
// count beyond int64 throws naming the flags, never wraps.

#include <fsdp/checked_math.h>
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

// Tensor parallelism's collectives (tp ranks; sequence parallel: docs/planner.md "Tensor
// parallelism", the ring formulas of [Note: tensor parallelism in the plan]).
/// What one rank sends per sequence to all-gather or reduce-scatter a [seq, C] activation
/// along the sequence: (tp-1)/tp·seq·C·e (tp divides seq).
inline int64_t tp_sequence_bytes(int64_t seq, int64_t C, int64_t e, int64_t tp) {
  return product({tp - 1, seq / tp, C, e});
}

/// What one rank sends to all-reduce n elements of `bytes` each: 2(tp-1)/tp·n·bytes.
inline int64_t tp_all_reduce_bytes(int64_t n, int64_t bytes, int64_t tp) {
  return product({2, tp - 1, n, bytes}) / tp;
}

/// A [seq, C] activation gathered or scattered along the sequence, per sequence.
inline fsdp::PlanTpCollective tp_sequence_collective(fsdp::PlanTpCollective::Kind kind, bool backward,
                                                     std::string what, int64_t seq, int64_t C, int64_t e,
                                                     int64_t tp) {
  return {kind, std::move(what), backward, /*per_sequence=*/true, tp_sequence_bytes(seq, C, e, tp), /*parameter=*/""};
}

/// The gradient of a parameter replicated over TP (a norm's, a row-wise layer's bias), `n`
/// elements of `bytes`, all-reduced once per micro-batch by backward.
inline fsdp::PlanTpCollective tp_replicated_gradient(const std::string& name, int64_t n, int64_t bytes, int64_t tp) {
  return {fsdp::PlanTpCollective::AllReduce, name + "'s gradient, summed over TP", /*backward=*/true,
          /*per_sequence=*/false, tp_all_reduce_bytes(n, bytes, tp), name};
}

/// A block's activations collectives (both families): attention's and the MLP's inputs gathered
/// along the sequence, their row-wise outputs reduce-scattered back; backward the converse.
/// Then the all-reduces of `replicated` (each parameter's name and elements).
inline std::vector<fsdp::PlanTpCollective> block_tp_collectives(
    const std::string& unit, int64_t seq, int64_t C, int64_t e, int64_t tp,
    const std::vector<std::pair<std::string, int64_t>>& replicated) {
  using K = fsdp::PlanTpCollective;
  std::vector<K> out;
  if (tp == 1) return out;
  for (const char* part : {"attention", "MLP"}) {
    out.push_back(tp_sequence_collective(K::AllGather, false, std::string(part) + "'s input", seq, C, e, tp));
    out.push_back(tp_sequence_collective(K::ReduceScatter, false, std::string(part) + "'s output", seq, C, e, tp));
  }
  for (const char* part : {"MLP", "attention"}) {
    out.push_back(tp_sequence_collective(K::AllGather, true, std::string(part) + "'s output gradient", seq, C, e, tp));
    out.push_back(tp_sequence_collective(K::ReduceScatter, true, std::string(part) + "'s input gradient", seq, C, e, tp));
  }
  for (const auto& [name, n] : replicated) out.push_back(tp_replicated_gradient(unit + "." + name, n, e, tp));
  return out;
}

}  // namespace gpt
