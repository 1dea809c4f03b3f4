#pragma once
// The staging arena of an asynchronous save (include/fsdp/async_checkpoint.h): one allocation of
// host memory (pinned when the model is on CUDA, so the copies from the device are DMA) that
// holds copies of the shard files' tensors while a background thread writes them. Its size is
// the save's budget, fixed when it is made: staging never allocates more. A completed save's arena
// is reused by the next one ([Note: the staging arena is kept]).

#include "io/save_snapshot.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace fsdp::detail {

/// The arena bytes one shard file's tensors take (each aligned as the arena places it).
int64_t staged_bytes(const ShardFileContents& file);

/// Ranges [first, last) of `files`, each staged within `budget` bytes, in order; throws naming
/// the file and both sizes when one file alone is larger than the budget.
std::vector<std::pair<size_t, size_t>> plan_waves(const std::vector<ShardFileContents>& files, int64_t budget);

class StagingArena {
 public:
  StagingArena(int64_t bytes, bool pinned);
  /// Replaces the tensors of files [first, last) by copies in the arena, from its start (the
  /// files staged before are written by now); throws when they do not fit.
  void stage(std::vector<ShardFileContents>& files, size_t first, size_t last);
  /// Writes every page once, so that no copy into the arena faults (pinned memory is mapped
  /// already: nothing to do).
  void fault_in();
  int64_t bytes() const { return memory_.numel(); }
  bool pinned() const { return pinned_; }

 private:
  at::Tensor memory_;
  bool pinned_;
};

}  // namespace fsdp::detail
