#pragma once
// Before the first collective, every rank must hold the same model: a rank with another layer
// size would otherwise exchange buffers of different lengths and hang or corrupt the others.
// And before sharding, the same initial values: LibTorch seeds each process at random, so an
// unseeded program builds another model on every rank, and each rank would train its own shards
// of a model no rank holds whole.

#include <fsdp/distributed.h>
#include <fsdp/named_tensors.h>

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

/// Compares a 64-bit hash of each tensor's bytes (its elements' bits in order: NaN and inf are
/// values like any other, a permutation is a difference) across the ranks of `world` in one
/// all-reduce, and throws on every rank naming the first tensor that differs, the ranks and the
/// fix. Every rank must pass the same names and shapes (check_same_model_on_all_ranks first).
void check_same_initial_values(ProcessGroup& world, const NamedTensors& tensors);

}  // namespace fsdp
