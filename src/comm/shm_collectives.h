#pragma once
// Collectives through a shared-memory segment (shm_segment.h) for a group whose ranks all run on
// one host: each rank copies its input in once, the others copy out of it or reduce out of it in
// place. Results are bitwise the ring's (make_ring_collectives): every sum adds the ranks' values
// in the order the ring does for that chunk. Bytes are counted as the ring counts them, so
// comm_stats() does not depend on which implementation ran. [Note: shared-memory collectives] in
// host_collectives.cpp says when it is used; [Note: decoupled collectives] in shm_collectives.cpp
// how the units' small collectives avoid making the ranks meet at every unit.

#include "comm/collectives.h"

#include <cstddef>
#include <memory>
#include <string>

namespace fsdp {

/// How many bytes a rank moves through the segment per round (the segment holds two rounds per
/// rank, whatever the size of the tensors).
constexpr size_t kShmChunkBytes = size_t{1} << 20;

/// Whether every rank of `group` runs on one host (by the host names exchanged at start-up).
bool all_on_one_host(const ProcessGroup& group);

/// Collective over `group`, whose ranks must all be on this host. nullptr on every rank when the
/// segment could not be set up (`why_not` says where and why); throws naming the ranks that never
/// arrived within the group's timeout.
std::unique_ptr<Collectives> make_shm_collectives(ProcessGroup& group,
                                                  size_t chunk_bytes = kShmChunkBytes,
                                                  std::string* why_not = nullptr);

}  // namespace fsdp
