// The schedules as data: each rank's list of actions ([Note: pipeline stages and schedules]).
#include <fsdp/pipeline.h>

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

// Its backward: the output's gradient from the next stage, the input's to the previous one.
void add_backward(std::vector<Action>& out, int stage, int num_stages, int mb) {
  if (stage + 1 < num_stages) out.push_back({ActionKind::RecvGradient, mb, stage});
  out.push_back({ActionKind::Backward, mb, stage});
  if (stage > 0) out.push_back({ActionKind::SendGradient, mb, stage});
}

// FSDP's stage-wide actions: gathered once before the first forward, reduced once after the last
// backward (after its gradient has left, so the previous stage is not kept waiting), then freed.
std::vector<Action> framed(int stage, const std::vector<Action>& body) {
  std::vector<Action> out{{ActionKind::Unshard, -1, stage}};
  out.insert(out.end(), body.begin(), body.end());
  out.push_back({ActionKind::ReduceScatter, -1, stage});
  out.push_back({ActionKind::Reshard, -1, stage});
  return out;
}

std::vector<Action> gpipe(int num_stages, int microbatches, int stage) {
  std::vector<Action> body;
  for (int mb = 0; mb < microbatches; ++mb) add_forward(body, stage, num_stages, mb);
  for (int mb = 0; mb < microbatches; ++mb) add_backward(body, stage, num_stages, mb);
  return body;
}

// 1F1B: P-1-s forwards fill the pipeline, then one forward and one backward alternate, then the
// remaining backwards drain it. At most P-s micro-batches' activations are held at once.
std::vector<Action> one_f_one_b(int num_stages, int microbatches, int stage) {
  TORCH_CHECK(microbatches >= num_stages, "pipeline schedule 1F1B: ", microbatches, " micro-batches for ",
              num_stages, " stages; 1F1B needs at least one micro-batch per stage (its warm-up would "
              "wait for micro-batches that do not exist). Use at least ", num_stages,
              " micro-batches, or the GPipe schedule.");
  const int warmup = num_stages - 1 - stage;
  std::vector<Action> body;
  for (int mb = 0; mb < warmup; ++mb) add_forward(body, stage, num_stages, mb);
  for (int k = 0; k + warmup < microbatches; ++k) {
    add_forward(body, stage, num_stages, k + warmup);
    add_backward(body, stage, num_stages, k);
  }
  for (int mb = microbatches - warmup; mb < microbatches; ++mb) add_backward(body, stage, num_stages, mb);
  return body;
}

const char* action_token(ActionKind kind) {
  switch (kind) {
    case ActionKind::Unshard: return "UNSHARD";
    case ActionKind::RecvActivation: return "RA";
    case ActionKind::Forward: return "F";
    case ActionKind::SendActivation: return "SA";
    case ActionKind::RecvGradient: return "RG";
    case ActionKind::Backward: return "B";
    case ActionKind::SendGradient: return "SG";
    case ActionKind::ReduceScatter: return "REDUCE_SCATTER";
    case ActionKind::Reshard: return "RESHARD";
  }
  return "?";
}

}  // namespace

std::vector<int> stages_of_rank(int rank, int pp_size, int num_stages) {
  TORCH_CHECK(num_stages == pp_size, "pipeline: ", num_stages, " stages over ", pp_size,
              " pp ranks; one stage per rank (\"loop\" placement) is what is built: give "
              "module_fqns_per_stage one list per pp rank (V stages per rank is not built yet)");
  TORCH_CHECK(rank >= 0 && rank < pp_size, "pipeline: rank ", rank, " is not one of ", pp_size, " pp ranks");
  return {rank};
}

std::vector<Action> schedule_actions(Schedule schedule, int num_stages, int microbatches, int stage) {
  TORCH_CHECK(num_stages >= 1 && microbatches >= 1 && stage >= 0 && stage < num_stages,
              "pipeline schedule: stage ", stage, " of ", num_stages, " with ", microbatches,
              " micro-batches; there must be at least one stage and one micro-batch");
  return framed(stage, schedule == Schedule::GPipe ? gpipe(num_stages, microbatches, stage)
                                                   : one_f_one_b(num_stages, microbatches, stage));
}

std::string to_string(const std::vector<Action>& actions) {
  std::string out;
  for (const Action& a : actions) {
    if (!out.empty()) out += ' ';
    out += action_token(a.kind);
    if (a.microbatch >= 0) out += std::to_string(a.microbatch);
  }
  return out;
}

std::string to_string(Schedule schedule) { return schedule == Schedule::GPipe ? "GPipe" : "1F1B"; }

}  // namespace fsdp::pp
