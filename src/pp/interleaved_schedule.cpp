// Interleaved 1F1B (Megatron-LM; torch.distributed.pipelining's ScheduleInterleaved1F1B): V stages
// per rank in loop placement, rank r holding stages r, r+P, ..., r+(V-1)P ([Note: V stages per rank]).
#include "pp/schedule_building.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <vector>

namespace fsdp::pp {

namespace {

// Micro-batches go through a rank's stages in rounds: the forwards of one round on the rank's first
// stage, then the same round on its second stage, ...; the backwards the same way from its last
// stage. The size of a round: P micro-batches (M a multiple of P), or all M when M < P.
int microbatches_per_round(int pp_size, int microbatches) {
  const int rounds = std::max(1, microbatches / pp_size);
  TORCH_CHECK(microbatches % rounds == 0, "pipeline schedule Interleaved1F1B: ", microbatches,
              " micro-batches over ", pp_size, " pp ranks do not split into ", rounds,
              " equal rounds (the micro-batch count divided by the pp size, rounded down). Use a count of "
              "micro-batches that is a multiple of the pp size (e.g. ", rounds * pp_size, " or ",
              (rounds + 1) * pp_size, "), or at most ", pp_size, ".");
  return microbatches / rounds;
}

}  // namespace

// The warm-up is the last rank's (V-1) rounds of forwards plus two per hop to the last rank (a
// forward there and a backward back); after it one forward and one backward alternate, then the
// remaining backwards drain. With M = P this is Megatron's (P-r-1)*2 + (V-1)*P.
std::vector<Compute> interleaved_order(int pp_size, int num_stages, int microbatches, int rank) {
  const int local_count = num_stages / pp_size;
  const int per_round = microbatches_per_round(pp_size, microbatches);
  const int computations = local_count * microbatches;  // forwards, and as many backwards
  const int warmup = std::min((local_count - 1) * per_round + 2 * (pp_size - 1 - rank), computations);
  auto forward_stage = [&](int op) { return ((op / per_round) % local_count) * pp_size + rank; };
  auto backward_stage = [&](int op) {
    return (local_count - 1 - ((op - warmup) / per_round) % local_count) * pp_size + rank;
  };
  std::map<int, int> next_forward, next_backward;  // per stage: its next micro-batch
  std::vector<Compute> order;
  for (int op = 0; op < warmup + computations; ++op) {
    if (op < computations) {
      const int stage = forward_stage(op);
      order.push_back({ActionKind::Forward, stage, next_forward[stage]++});
    }
    if (op >= warmup) {
      const int stage = backward_stage(op);
      order.push_back({ActionKind::Backward, stage, next_backward[stage]++});
    }
  }
  return order;
}

}  // namespace fsdp::pp
