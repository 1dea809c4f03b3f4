#pragma once
// Which collectives a group's host tensors go through: shared memory where every rank of the group
// is on this host, else the ring over Gloo ([Note: shared-memory collectives]).

#include "comm/collectives.h"
#include "comm/shm_collectives.h"

#include <cstddef>
#include <memory>

namespace fsdp {

/// Collective over `group` (every rank of it decides alike): shared-memory collectives moving
/// `chunk_bytes` per round, or the ring over Gloo.
std::unique_ptr<Collectives> host_collectives(ProcessGroup& group, size_t chunk_bytes = kShmChunkBytes);

}  // namespace fsdp
