// The schedules as data: each rank's list of actions ([Note: pipeline stages and schedules]).
#include <fsdp/pipeline.h>

#include "pp/schedule_building.h"

#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace fsdp::pp {

namespace {

// One micro-batch's forward on `stage`: its input from the previous stage, its output to the next.
void add_forward(std::vector<Action>& out, int stage, int num_stages, int mb) {
  if (stage > 0) out.push_back({ActionKind::RecvActivation, mb, stage});
  out.push_back({ActionKind::Forward, mb, stage});
  if (stage + 1 < num_stages) out.push_back({ActionKind::SendActivation, mb, stage});
}

// Its backward (or its input half): the output's gradient from the next stage, the input's to the
// previous one. The weight half (ZBV's W) neither receives nor sends.
void add_backward(std::vector<Action>& out, ActionKind kind, int stage, int num_stages, int mb) {
  if (stage + 1 < num_stages) out.push_back({ActionKind::RecvGradient, mb, stage});
  out.push_back({kind, mb, stage});
  if (stage > 0) out.push_back({ActionKind::SendGradient, mb, stage});
}

std::vector<Compute> gpipe(int microbatches, int stage) {
  std::vector<Compute> order;
  for (int mb = 0; mb < microbatches; ++mb) order.push_back({ActionKind::Forward, stage, mb});
  for (int mb = 0; mb < microbatches; ++mb) order.push_back({ActionKind::Backward, stage, mb});
  return order;
}

// 1F1B: P-1-s forwards fill the pipeline, then one forward and one backward alternate, then the
// remaining backwards drain it. At most P-s micro-batches' activations are held at once.
std::vector<Compute> one_f_one_b(int num_stages, int microbatches, int stage) {
  TORCH_CHECK(microbatches >= num_stages, "pipeline schedule 1F1B: ", microbatches, " micro-batches for ",
              num_stages, " stages; 1F1B needs at least one micro-batch per stage (its warm-up would "
              "wait for micro-batches that do not exist). Use at least ", num_stages,
              " micro-batches, or the GPipe schedule.");
  const int warmup = num_stages - 1 - stage;
  std::vector<Compute> order;
  for (int mb = 0; mb < warmup; ++mb) order.push_back({ActionKind::Forward, stage, mb});
  for (int k = 0; k + warmup < microbatches; ++k) {
    order.push_back({ActionKind::Forward, stage, k + warmup});
    order.push_back({ActionKind::Backward, stage, k});
  }
  for (int mb = microbatches - warmup; mb < microbatches; ++mb) order.push_back({ActionKind::Backward, stage, mb});
  return order;
}

const char* action_token(ActionKind kind) {
  switch (kind) {
    case ActionKind::Unshard: return "UNSHARD";
    case ActionKind::RecvActivation: return "RA";
    case ActionKind::Forward: return "F";
    case ActionKind::SendActivation: return "SA";
    case ActionKind::RecvGradient: return "RG";
    case ActionKind::Backward: return "B";
    case ActionKind::BackwardInput: return "I";
    case ActionKind::BackwardWeight: return "W";
    case ActionKind::SendGradient: return "SG";
    case ActionKind::ReduceScatter: return "REDUCE_SCATTER";
    case ActionKind::Reshard: return "RESHARD";
  }
  return "?";
}

}  // namespace

// FSDP's stage-wide actions: gathered once before the first forward, reduced once after the last
// backward (after its gradient has left, so the previous stage is not kept waiting), then freed.
std::vector<Action> expanded(const std::vector<Compute>& order, int num_stages, const std::vector<int>& local_stages) {
  std::vector<Action> out;
  for (int stage : local_stages) out.push_back({ActionKind::Unshard, -1, stage});
  for (const Compute& c : order) {
    if (c.kind == ActionKind::Forward) {
      add_forward(out, c.stage, num_stages, c.microbatch);
    } else if (c.kind == ActionKind::BackwardWeight) {
      out.push_back({c.kind, c.microbatch, c.stage});
    } else {
      add_backward(out, c.kind, c.stage, num_stages, c.microbatch);
    }
  }
  for (int stage : local_stages) {
    out.push_back({ActionKind::ReduceScatter, -1, stage});
    out.push_back({ActionKind::Reshard, -1, stage});
  }
  return out;
}

std::vector<Action> schedule_actions(Schedule schedule, int num_stages, int microbatches, int stage) {
  TORCH_CHECK(schedule == Schedule::GPipe || schedule == Schedule::OneFOneB, "pipeline schedule ",
              to_string(schedule), " runs several stages per rank: its lists are per rank (rank_actions)");
  return rank_actions(schedule, num_stages, num_stages, microbatches, stage);
}

std::vector<Action> rank_actions(Schedule schedule, int pp_size, int num_stages, int microbatches, int rank) {
  TORCH_CHECK(microbatches >= 1, "pipeline schedule ", to_string(schedule), ": ", microbatches,
              " micro-batches; there must be at least one");
  const std::vector<int> local = stages_of_rank(rank, pp_size, num_stages, placement_of(schedule));
  switch (schedule) {
    case Schedule::GPipe:
    case Schedule::OneFOneB:
      TORCH_CHECK(num_stages == pp_size, "pipeline schedule ", to_string(schedule), ": ", num_stages,
                  " stages over ", pp_size, " pp ranks; it runs one stage per rank: give module_fqns_per_stage ",
                  pp_size, " lists, or use Interleaved1F1B for several stages per rank");
      return expanded(schedule == Schedule::GPipe ? gpipe(microbatches, rank)
                                                  : one_f_one_b(num_stages, microbatches, rank),
                      num_stages, local);
    case Schedule::Interleaved1F1B:
      return expanded(interleaved_order(pp_size, num_stages, microbatches, rank), num_stages, local);
    case Schedule::ZBV:
      return expanded(zbv_order(pp_size, num_stages, microbatches, rank), num_stages, local);
  }
  return {};
}

std::string to_string(const std::vector<Action>& actions) {
  bool several_stages = false;
  for (const Action& a : actions) several_stages = several_stages || a.stage != actions.front().stage;
  std::string out;
  for (const Action& a : actions) {
    if (!out.empty()) out += ' ';
    if (several_stages) out += std::to_string(a.stage);
    out += action_token(a.kind);
    if (a.microbatch >= 0) out += std::to_string(a.microbatch);
  }
  return out;
}

std::string to_string(Schedule schedule) {
  switch (schedule) {
    case Schedule::GPipe: return "GPipe";
    case Schedule::OneFOneB: return "1F1B";
    case Schedule::Interleaved1F1B: return "Interleaved1F1B";
    case Schedule::ZBV: return "ZBV";
  }
  return "?";
}

}  // namespace fsdp::pp
