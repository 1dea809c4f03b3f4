#pragma once
// Before the first collective, every rank must hold the same model: a rank with another layer
// size would otherwise exchange buffers of different lengths and hang or corrupt the others.

#include <fsdp/distributed.h>

#include <string>
#include <vector>

namespace fsdp {

/// One line per parameter: "name dtype [shape] unit"; compared across ranks.
struct ModelDescription {
  std::vector<std::string> names;
  std::vector<std::string> lines;
};

/// Exchanges descriptions through the process group's store and throws on every rank, naming the
/// first parameter that differs and the ranks involved. Times out (never hangs) if a rank is gone.
void check_same_model_on_all_ranks(ProcessGroup& group, const ModelDescription& mine);

}  // namespace fsdp
