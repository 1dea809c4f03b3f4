#pragma once
// What the schedules share: a schedule is first an order of computations on a rank (forwards and
// backwards of (stage, micro-batch)), then expanded into the list the runner executes, each
// computation with its receive before and its send after, framed by FSDP's stage-wide actions.

#include <fsdp/pipeline.h>

#include <vector>

namespace fsdp::pp {

/// One computation: Forward, Backward, BackwardInput or BackwardWeight of `microbatch` on `stage`.
struct Compute {
  ActionKind kind;
  int stage;
  int microbatch;
};

/// The runner's list for `order` on a rank holding `local_stages` (increasing) of `num_stages`.
std::vector<Action> expanded(const std::vector<Compute>& order, int num_stages, const std::vector<int>& local_stages);

/// The orders of the schedules past one stage per rank (interleaved_schedule.cpp, zbv_schedule.cpp).
std::vector<Compute> interleaved_order(int pp_size, int num_stages, int microbatches, int rank);
std::vector<Compute> zbv_order(int pp_size, int num_stages, int microbatches, int rank);

}  // namespace fsdp::pp
