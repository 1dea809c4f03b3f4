#pragma once
// [Note: a tied weight's second backward]
// The check that a split layer ran through its holder ([Note: a layer called around its holder])
// matches each backward that reaches a split parameter with one forward of its layer. A weight
// tied across two pipeline stages (GPT-2's wte and head) is also used by the other stage, around
// the layer: on another pp rank, where the layer never runs, or on the same rank (ZBV puts both
// on rank 0), where each stage's backward brings a gradient for the layer's one forward. The
// pipeline runs the backward of a stage holding a tie inside this scope, where a gradient left
// without a forward to match is the tie's other use, not a call around the holder.
// Process-wide (the engine may run hooks on its device threads), as one pipeline runs per process.

#include <atomic>

namespace fsdp::tp::detail {

inline std::atomic<int> tied_backwards{0};

class TiedBackwardScope {
 public:
  TiedBackwardScope() { tied_backwards.fetch_add(1); }
  ~TiedBackwardScope() { tied_backwards.fetch_sub(1); }
  TiedBackwardScope(const TiedBackwardScope&) = delete;
  TiedBackwardScope& operator=(const TiedBackwardScope&) = delete;
};

}  // namespace fsdp::tp::detail
