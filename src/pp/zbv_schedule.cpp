// ZBV (zero bubble, V placement; torch.distributed.pipelining's ScheduleZBVZeroBubble): rank r
// holds stages r and 2P-1-r, and each backward is split into the input's gradient (I: sent back at
// once) and the weights' (W: deferred to fill what would be bubbles) ([Note: V stages per rank]).
#include "pp/schedule_building.h"

#include <algorithm>
#include <vector>

namespace fsdp::pp {

namespace {

// The order for max(M, 2P-1) micro-batches, as ZBV is written for at least that many; the
// computations of the micro-batches past M are then dropped.
class ZbvOrder {
 public:
  ZbvOrder(int num_stages, int rank) : down_(rank), up_(num_stages - 1 - rank) {}

  void forward_down() { order_.push_back({ActionKind::Forward, down_, f_down++}); }
  void forward_up() { order_.push_back({ActionKind::Forward, up_, f_up++}); }
  void input_down() { order_.push_back({ActionKind::BackwardInput, down_, i_down++}); }
  void input_up() { order_.push_back({ActionKind::BackwardInput, up_, i_up++}); }
  void weight_down() { order_.push_back({ActionKind::BackwardWeight, down_, w_down++}); }
  void weight_up() { order_.push_back({ActionKind::BackwardWeight, up_, w_up++}); }

  // How many of each computation are in the order so far, on the stage down and the stage up.
  int f_down = 0, f_up = 0, i_down = 0, i_up = 0, w_down = 0, w_up = 0;

  std::vector<Compute> order_of_first(int microbatches) const {
    std::vector<Compute> out;
    for (const Compute& c : order_) {
      if (c.microbatch < microbatches) out.push_back(c);
    }
    return out;
  }

 private:
  int down_, up_;  // the rank's stage on the way down (r) and on the way up (2P-1-r)
  std::vector<Compute> order_;
};

}  // namespace

std::vector<Compute> zbv_order(int pp_size, int num_stages, int microbatches, int rank) {
  const int n = std::max(2 * pp_size - 1, microbatches);
  ZbvOrder z(num_stages, rank);
  // Warm-up: forwards down the V, then down and up alternating, then the first full backwards up.
  for (int k = 0; k < 2 * (pp_size - rank) - 1; ++k) z.forward_down();
  for (int k = 0; k < rank; ++k) {
    z.forward_up();
    z.forward_down();
  }
  for (int k = 0; k < pp_size - rank; ++k) {
    z.forward_up();
    z.input_up();
    z.weight_up();
  }
  // Steady state: a forward and a full backward on each of the two stages.
  while (z.f_up < z.f_down || z.f_down < n) {
    if (z.f_down < n) z.forward_down();
    z.input_down();
    z.weight_down();
    z.forward_up();
    z.input_up();
    z.weight_up();
  }
  // Cool-down: the remaining input gradients first (they unblock other ranks), weights after.
  for (int k = 0; k < rank; ++k) {
    z.input_down();
    z.input_up();
  }
  for (int k = 0; k < pp_size - rank; ++k) {
    z.input_down();
    z.weight_down();
  }
  while (z.w_up < z.i_up) z.weight_up();
  while (z.w_down < z.i_down) z.weight_down();
  return z.order_of_first(microbatches);
}

}  // namespace fsdp::pp
