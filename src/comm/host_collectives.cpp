#include "comm/host_collectives.h"

#include <iostream>
#include <string>

namespace fsdp {

// [Note: shared-memory collectives]
// When every rank of a group runs on one host, its collectives go through a shared-memory
// segment (shm_collectives.h): one copy in and one copy (or reduction) out per byte instead of
// the ring's send, receive and extra copies through Gloo's sockets, with results bitwise the
// ring's and the same byte accounting. This holds for the units' collectives (one segment per
// model's group, kShmChunkBytes a round) and for the group's own all_reduce_sum and broadcast (a
// smaller segment of the group's, made at their first call: a step's loss all-reduce through
// Gloo woke two threads per rank and cost ~1 ms of a 20 ms step on 2 cores).
// CpuCollectives::Ring (FSDP_CPU_COLLECTIVES=ring) forces the ring (the fallback, for groups
// across hosts and for tests); the default, SharedMemory, picks shared memory where it applies.
// A group whose segment cannot be set up on some rank (/dev/shm full or not shared) falls back
// to the ring on every rank, with a warning. Every rank must choose the same (the group's
// settings, from init_distributed).
std::unique_ptr<Collectives> host_collectives(ProcessGroup& group, size_t chunk_bytes) {
  const bool ring_wanted = group.settings().cpu_collectives == CpuCollectives::Ring;
  if (group.size() == 1 || ring_wanted || !all_on_one_host(group)) {
    return make_ring_collectives(group);
  }
  std::string why_not;
  if (auto shm = make_shm_collectives(group, chunk_bytes, &why_not)) return shm;
  if (group.rank() == 0) {
    std::cerr << "fsdp: warning: shared-memory collectives for process group '" << group.name()
              << "' are unavailable (" << why_not << "); using the ring over Gloo" << std::endl;
  }
  return make_ring_collectives(group);
}

}  // namespace fsdp
