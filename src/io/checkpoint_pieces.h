#pragma once
// The model as a checkpoint sees it: this rank's pieces of the parameters (what it saves and
// what it loads), and the description of every parameter that metadata.json holds.

#include "io/checkpoint_format.h"
#include "io/optimizer_set.h"
#include "core/sharded_view.h"

#include <fsdp/named_tensors.h>

#include <cstdint>
#include <vector>

namespace fsdp::detail {

/// Every parameter's part of this rank's shards, unit by unit, after resharding the units a
/// forward left unsharded ([Note: resharding between steps]); throws when a unit's backward is
/// under way.
std::vector<ShardedParam> local_pieces(const ShardedView& model);

/// The model's parameters as metadata: names, (whole) shapes, dtypes, and this rank's optimizer steps,
/// kinds of state and the class of the optimizer holding each.
std::vector<ParamMeta> describe_model(const ShardedView& model, const OptimizerSet& optimizers);

/// The model's buffers as metadata (names, shapes, dtypes; no file yet).
std::vector<BufferMeta> describe_buffers(const NamedTensors& buffers);

}  // namespace fsdp::detail
