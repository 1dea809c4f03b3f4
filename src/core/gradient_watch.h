#pragma once
// Gradients scaled after backward by a factor that differs across the ranks: [Note: gradients
// scaled by each rank alone] in gradient_watch.cpp.

#include "core/flat_param.h"

#include <fsdp/distributed.h>

#include <string>
#include <vector>

namespace fsdp {

/// One buffer the watch looks at: its flat parameter and the unit it belongs to.
struct WatchedBuffer {
  FlatParam* flat;
  const std::string* unit;
};

class GradientWatch {
 public:
  /// A backward ended: keeps a few elements of each buffer's gradient shard, when a check is due.
  void record(const std::vector<WatchedBuffer>& buffers);
  /// The next forward starts: compares how each buffer's kept elements changed, over `groups`
  /// (summed over each in turn: together they must cover the ranks of one model); warns once,
  /// from the rank where `prints`.
  void check(const std::vector<WatchedBuffer>& buffers, const std::vector<ProcessGroup*>& groups,
             c10::Device device, bool prints);

 private:
  int64_t backwards_ = 0;
  std::vector<std::vector<double>> kept_;  // per buffer, on the host; empty: nothing kept
  bool warned_ = false;
};

}  // namespace fsdp
