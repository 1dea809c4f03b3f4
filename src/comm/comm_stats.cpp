// The bytes each kind of collective sent from this process, summed over every process group and
// every Collectives implementation (comm_stats.h).
#include "comm/collectives.h"
#include "comm/point_to_point.h"

#include <fsdp/comm_stats.h>

#include <atomic>

namespace fsdp {

namespace {

struct Counters {
  std::atomic<int64_t> all_gather{0};
  std::atomic<int64_t> reduce_scatter{0};
  std::atomic<int64_t> all_reduce{0};
  std::atomic<int64_t> broadcast{0};
  std::atomic<int64_t> all_to_all{0};
  std::atomic<int64_t> tp_all_gather{0};
  std::atomic<int64_t> tp_reduce_scatter{0};
  std::atomic<int64_t> tp_all_reduce{0};
  std::atomic<int64_t> checks{0};
  std::atomic<int64_t> pp_send{0};
};

// Set while this thread runs a tensor-parallel collective (TensorParallelCounting).
thread_local bool counting_tensor_parallel = false;
// Set while this thread runs one of the library's occasional checks (CheckCounting).
thread_local bool counting_checks = false;

Counters& counters() {
  static Counters instance;
  return instance;
}

std::atomic<int64_t>& counter_of(CollectiveKind kind) {
  if (counting_checks) return counters().checks;
  if (counting_tensor_parallel) {
    if (kind == CollectiveKind::AllGather) return counters().tp_all_gather;
    if (kind == CollectiveKind::ReduceScatter) return counters().tp_reduce_scatter;
    if (kind == CollectiveKind::AllReduce) return counters().tp_all_reduce;
  }
  switch (kind) {
    case CollectiveKind::AllGather:
      return counters().all_gather;
    case CollectiveKind::ReduceScatter:
      return counters().reduce_scatter;
    case CollectiveKind::AllReduce:
      return counters().all_reduce;
    case CollectiveKind::AllToAll:
      return counters().all_to_all;
    case CollectiveKind::Broadcast:
      break;
  }
  return counters().broadcast;
}

}  // namespace

void count_sent_bytes(CollectiveKind kind, int64_t bytes) { counter_of(kind) += bytes; }

void count_point_to_point_bytes(int64_t bytes) { counters().pp_send += bytes; }

TensorParallelCounting::TensorParallelCounting() : outer_(counting_tensor_parallel) {
  counting_tensor_parallel = true;
}

TensorParallelCounting::~TensorParallelCounting() { counting_tensor_parallel = outer_; }

CheckCounting::CheckCounting() : outer_(counting_checks) { counting_checks = true; }

CheckCounting::~CheckCounting() { counting_checks = outer_; }

CommStats comm_stats() {
  CommStats s;
  s.all_gather_bytes = counters().all_gather.load();
  s.reduce_scatter_bytes = counters().reduce_scatter.load();
  s.all_reduce_bytes = counters().all_reduce.load();
  s.broadcast_bytes = counters().broadcast.load();
  s.all_to_all_bytes = counters().all_to_all.load();
  s.tp_all_gather_bytes = counters().tp_all_gather.load();
  s.tp_reduce_scatter_bytes = counters().tp_reduce_scatter.load();
  s.tp_all_reduce_bytes = counters().tp_all_reduce.load();
  s.check_bytes = counters().checks.load();
  s.pp_send_bytes = counters().pp_send.load();
  return s;
}

void reset_comm_stats() {
  counters().all_gather = 0;
  counters().reduce_scatter = 0;
  counters().all_reduce = 0;
  counters().broadcast = 0;
  counters().all_to_all = 0;
  counters().tp_all_gather = 0;
  counters().tp_reduce_scatter = 0;
  counters().tp_all_reduce = 0;
  counters().checks = 0;
  counters().pp_send = 0;
}

}  // namespace fsdp
