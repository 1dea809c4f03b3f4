#pragma once
// [Note: a tied weight's second backward]
// The check that a split layer ran through its holder ([Note: a layer called around its holder])
// matches each backward that reaches a split parameter with one forward of its layer. A weight
// tied across two pipeline stages of one rank (GPT-2's wte and head, both on rank 0 under ZBV)
// gets a gradient from each stage's backward for its layer's one forward: the pipeline runs the
// backward of a stage holding a tie inside this scope, where a gradient left without a forward to
// match is the tie's other use, not a call around the holder. Process-wide (the engine may run
// hooks on its device threads), as one pipeline runs per process.

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
