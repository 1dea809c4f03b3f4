// The pipeline schedules as data: each rank's actions against lists written by hand (GPipe, 1F1B
// for P = 2, 4 and M = 2, 4; interleaved 1F1B and ZBV at P = 2), what each refuses by name, and
// every list run as the runner runs it (blocking receives) to its end. No collective: every rank
// checks the same lists.
#include "error_of.h"

#include <fsdp/pipeline.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace fsdp_test {

namespace {

using fsdp::pp::Schedule;

void expect_lists(Schedule schedule, int stages, int microbatches, const std::vector<std::string>& expected) {
  ASSERT_EQ(static_cast<int>(expected.size()), stages);
  for (int s = 0; s < stages; ++s) {
    const std::string body = fsdp::pp::to_string(fsdp::pp::schedule_actions(schedule, stages, microbatches, s));
    EXPECT_EQ(body, "UNSHARD " + expected[static_cast<size_t>(s)] + " REDUCE_SCATTER RESHARD")
        << fsdp::pp::to_string(schedule) << " P=" << stages << " M=" << microbatches << " stage " << s;
  }
}

// The stage-wide FSDP actions frame every list: gathered once before the first forward, reduced
// once after the last backward (expect_lists adds them).
const char* kFirstOfTwoM2 = "F0 SA0 F1 SA1 RG0 B0 RG1 B1";
const char* kGPipeLastM2 = "RA0 F0 RA1 F1 B0 SG0 B1 SG1";
const char* kGPipeFirstM4 = "F0 SA0 F1 SA1 F2 SA2 F3 SA3 RG0 B0 RG1 B1 RG2 B2 RG3 B3";
const char* kGPipeLastM4 = "RA0 F0 RA1 F1 RA2 F2 RA3 F3 B0 SG0 B1 SG1 B2 SG2 B3 SG3";

}  // namespace

TEST(PipelineSchedule, GPipeRunsEveryForwardThenEveryBackward) {
  expect_lists(Schedule::GPipe, 2, 2, {kFirstOfTwoM2, kGPipeLastM2});
  expect_lists(Schedule::GPipe, 2, 4, {kGPipeFirstM4, kGPipeLastM4});
  const char* middle_m2 = "RA0 F0 SA0 RA1 F1 SA1 RG0 B0 SG0 RG1 B1 SG1";
  expect_lists(Schedule::GPipe, 4, 2, {kFirstOfTwoM2, middle_m2, middle_m2, kGPipeLastM2});
  const char* middle_m4 = "RA0 F0 SA0 RA1 F1 SA1 RA2 F2 SA2 RA3 F3 SA3 RG0 B0 SG0 RG1 B1 SG1 RG2 B2 SG2 RG3 B3 SG3";
  expect_lists(Schedule::GPipe, 4, 4, {kGPipeFirstM4, middle_m4, middle_m4, kGPipeLastM4});
  // Fewer micro-batches than stages: GPipe still runs.
  expect_lists(Schedule::GPipe, 4, 1, {"F0 SA0 RG0 B0", "RA0 F0 SA0 RG0 B0 SG0", "RA0 F0 SA0 RG0 B0 SG0",
                                       "RA0 F0 B0 SG0"});
}

TEST(PipelineSchedule, OneFOneBWarmsUpThenAlternatesThenDrains) {
  const char* last_m2 = "RA0 F0 B0 SG0 RA1 F1 B1 SG1";
  expect_lists(Schedule::OneFOneB, 2, 2, {kFirstOfTwoM2, last_m2});
  const char* last_m4 = "RA0 F0 B0 SG0 RA1 F1 B1 SG1 RA2 F2 B2 SG2 RA3 F3 B3 SG3";
  expect_lists(Schedule::OneFOneB, 2, 4, {"F0 SA0 F1 SA1 RG0 B0 F2 SA2 RG1 B1 F3 SA3 RG2 B2 RG3 B3", last_m4});
  expect_lists(Schedule::OneFOneB, 4, 4,
               {"F0 SA0 F1 SA1 F2 SA2 F3 SA3 RG0 B0 RG1 B1 RG2 B2 RG3 B3",
                "RA0 F0 SA0 RA1 F1 SA1 RA2 F2 SA2 RG0 B0 SG0 RA3 F3 SA3 RG1 B1 SG1 RG2 B2 SG2 RG3 B3 SG3",
                "RA0 F0 SA0 RA1 F1 SA1 RG0 B0 SG0 RA2 F2 SA2 RG1 B1 SG1 RA3 F3 SA3 RG2 B2 SG2 RG3 B3 SG3",
                last_m4});
}

TEST(PipelineSchedule, OneFOneBWithFewerMicroBatchesThanStagesIsRefusedByName) {
  for (int stage = 0; stage < 4; ++stage) {
    const std::string error = error_of([&] { fsdp::pp::schedule_actions(Schedule::OneFOneB, 4, 2, stage); });
    EXPECT_NE(error.find("1F1B: 2 micro-batches for 4 stages"), std::string::npos) << error;
    EXPECT_NE(error.find("or the GPipe schedule"), std::string::npos) << error;
  }
}

TEST(PipelineSchedule, LoopAndVPlacementsPutStagesWhereTheySay) {
  using fsdp::pp::Placement;
  EXPECT_EQ(fsdp::pp::stages_of_rank(1, 2, 2), std::vector<int>{1});
  EXPECT_EQ(fsdp::pp::stages_of_rank(1, 2, 4), (std::vector<int>{1, 3}));
  EXPECT_EQ(fsdp::pp::stages_of_rank(0, 3, 9), (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(fsdp::pp::stages_of_rank(0, 2, 4, Placement::V), (std::vector<int>{0, 3}));
  EXPECT_EQ(fsdp::pp::stages_of_rank(1, 2, 4, Placement::V), (std::vector<int>{1, 2}));
  EXPECT_EQ(fsdp::pp::stages_of_rank(2, 3, 6, Placement::V), (std::vector<int>{2, 3}));
  EXPECT_EQ(fsdp::pp::rank_of_stage(5, 3, 6, Placement::Loop), 2);
  EXPECT_EQ(fsdp::pp::rank_of_stage(5, 3, 6, Placement::V), 0);
  EXPECT_EQ(fsdp::pp::rank_of_stage(3, 3, 6, Placement::V), 2);
  std::string error = error_of([] { fsdp::pp::stages_of_rank(0, 2, 5); });
  EXPECT_NE(error.find("give module_fqns_per_stage a multiple of 2 lists"), std::string::npos) << error;
  error = error_of([] { fsdp::pp::stages_of_rank(0, 2, 6, Placement::V); });
  EXPECT_NE(error.find("exactly two stages per rank"), std::string::npos) << error;
  error = error_of([] { fsdp::pp::rank_actions(Schedule::OneFOneB, 2, 4, 4, 0); });
  EXPECT_NE(error.find("use Interleaved1F1B for several stages per rank"), std::string::npos) << error;
}

namespace {

// The computations of a list (forwards and backwards, each prefixed with its stage), without the
// receives and sends, which the V = 1 lists above check.
std::string computations(const std::vector<fsdp::pp::Action>& actions) {
  using fsdp::pp::ActionKind;
  std::string out;
  for (const auto& a : actions) {
    const char* token = a.kind == ActionKind::Forward          ? "F"
                        : a.kind == ActionKind::Backward       ? "B"
                        : a.kind == ActionKind::BackwardInput  ? "I"
                        : a.kind == ActionKind::BackwardWeight ? "W"
                                                               : nullptr;
    if (token == nullptr) continue;
    out += (out.empty() ? "" : " ") + std::to_string(a.stage) + token + std::to_string(a.microbatch);
  }
  return out;
}

void expect_computations(Schedule schedule, int pp, int stages, int microbatches,
                         const std::vector<std::string>& expected) {
  for (int r = 0; r < pp; ++r) {
    EXPECT_EQ(computations(fsdp::pp::rank_actions(schedule, pp, stages, microbatches, r)),
              expected[static_cast<size_t>(r)])
        << fsdp::pp::to_string(schedule) << " P=" << pp << " stages=" << stages << " M=" << microbatches
        << " rank " << r;
  }
}

}  // namespace

// Megatron's interleaved 1F1B at P = 2, V = 2, M = 4: rank r warms up with (P-r-1)*2 + (V-1)*P
// forwards, chunk by chunk in rounds of P micro-batches, then alternates, then drains.
TEST(PipelineSchedule, InterleavedOneFOneBFollowsMegatronsOrder) {
  expect_computations(Schedule::Interleaved1F1B, 2, 4, 4,
                      {"0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
                       "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3"});
  // One round of M < P micro-batches: each rank's chunks in turn, then back.
  expect_computations(Schedule::Interleaved1F1B, 2, 4, 1, {"0F0 2F0 2B0 0B0", "1F0 3F0 3B0 1B0"});
  // The whole list of rank 1, its receives and sends included (every boundary crosses ranks).
  EXPECT_EQ(fsdp::pp::to_string(fsdp::pp::rank_actions(Schedule::Interleaved1F1B, 2, 4, 1, 1)),
            "1UNSHARD 3UNSHARD 1RA0 1F0 1SA0 3RA0 3F0 3B0 3SG0 1RG0 1B0 1SG0 "
            "1REDUCE_SCATTER 1RESHARD 3REDUCE_SCATTER 3RESHARD");
}

TEST(PipelineSchedule, InterleavedOneFOneBRefusesMicroBatchesThatDoNotSplitIntoRounds) {
  const std::string error = error_of([] { fsdp::pp::rank_actions(Schedule::Interleaved1F1B, 2, 4, 5, 0); });
  EXPECT_NE(error.find("Interleaved1F1B: 5 micro-batches over 2 pp ranks do not split into 2 equal rounds"),
            std::string::npos) << error;
  EXPECT_NE(error.find("(e.g. 4 or 6)"), std::string::npos) << error;
}

// torch.distributed.pipelining's ScheduleZBVZeroBubble at P = 2, M = 3 (rank r: stages r and 3-r),
// and M = 2 < 2P-1: its order for 2P-1 micro-batches with the missing ones left out.
TEST(PipelineSchedule, ZbvSplitsTheBackwardAndDefersWeights) {
  expect_computations(Schedule::ZBV, 2, 4, 3,
                      {"0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2",
                       "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2"});
  expect_computations(Schedule::ZBV, 2, 4, 2,
                      {"0F0 0F1 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 0I1 0W1",
                       "1F0 2F0 1F1 2F1 2I0 2W0 1I0 1W0 2I1 2W1 1I1 1W1"});
  // Stages 1 and 2 meet on rank 1: the hand-over is in the list as a send and a receive.
  const std::string rank1 = fsdp::pp::to_string(fsdp::pp::rank_actions(Schedule::ZBV, 2, 4, 1, 1));
  EXPECT_EQ(rank1, "1UNSHARD 2UNSHARD 1RA0 1F0 1SA0 2RA0 2F0 2SA0 2RG0 2I0 2SG0 2W0 1RG0 1I0 1SG0 1W0 "
                   "1REDUCE_SCATTER 1RESHARD 2REDUCE_SCATTER 2RESHARD");
}

namespace {

// Every rank's list run as the runner runs it (a receive waits for its send; a send never waits),
// each computation (F, B, I, W) taking one unit of time and messages none.
struct ListsRun {
  std::string error;          // "" when every list reached its end, every micro-batch through every stage
  std::vector<int64_t> busy;  // per rank: units spent computing
  int64_t makespan = 0;       // when the last rank finished
};

ListsRun run_lists(Schedule schedule, int pp, int stages, int microbatches) {
  using fsdp::pp::ActionKind;
  std::vector<std::vector<fsdp::pp::Action>> lists;
  for (int r = 0; r < pp; ++r) lists.push_back(fsdp::pp::rank_actions(schedule, pp, stages, microbatches, r));
  ListsRun out;
  out.busy.assign(static_cast<size_t>(pp), 0);
  std::vector<int64_t> clock(static_cast<size_t>(pp), 0);
  std::vector<size_t> next(static_cast<size_t>(pp), 0);
  std::map<std::tuple<int, int, int>, int64_t> done;  // (kind, stage, micro-batch) -> when it ended
  auto key = [](ActionKind k, int s, int mb) { return std::make_tuple(static_cast<int>(k), s, mb); };
  auto computes = [](ActionKind k) {
    return k == ActionKind::Forward || k == ActionKind::Backward || k == ActionKind::BackwardInput ||
           k == ActionKind::BackwardWeight;
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < lists.size(); ++r) {
      for (size_t& i = next[r]; i < lists[r].size(); ++i) {
        const auto& a = lists[r][i];
        auto sent = done.end();
        if (a.kind == ActionKind::RecvActivation) sent = done.find(key(ActionKind::SendActivation, a.stage - 1, a.microbatch));
        if (a.kind == ActionKind::RecvGradient) sent = done.find(key(ActionKind::SendGradient, a.stage + 1, a.microbatch));
        const bool receives = a.kind == ActionKind::RecvActivation || a.kind == ActionKind::RecvGradient;
        if (receives && sent == done.end()) break;
        if (receives) clock[r] = std::max(clock[r], sent->second);
        const bool forwarded = done.count(key(ActionKind::Forward, a.stage, a.microbatch)) > 0;
        if ((a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) && !forwarded) out.error = "backward before forward";
        if (a.kind == ActionKind::BackwardWeight && !done.count(key(ActionKind::BackwardInput, a.stage, a.microbatch))) out.error = "W before I";
        if (computes(a.kind)) {
          clock[r] += 1;
          out.busy[r] += 1;
        }
        if (!done.emplace(key(a.kind, a.stage, a.microbatch), clock[r]).second && a.microbatch >= 0) out.error = "an action twice";
        moved = true;
      }
    }
  }
  out.makespan = *std::max_element(clock.begin(), clock.end());
  for (size_t r = 0; r < lists.size(); ++r) {
    if (next[r] < lists[r].size()) out.error = "rank " + std::to_string(r) + " waits forever";
  }
  const ActionKind last = schedule == Schedule::ZBV ? ActionKind::BackwardWeight : ActionKind::Backward;
  for (int s = 0; s < stages; ++s) {
    for (int mb = 0; mb < microbatches; ++mb) {
      if (!done.count(key(ActionKind::Forward, s, mb))) out.error = "a forward missing";
      if (!done.count(key(last, s, mb))) out.error = "a backward missing";
    }
  }
  return out;
}

}  // namespace

// Every schedule, every P up to 4, V up to 3, M up to 9: the lists run to their end (no rank waits
// on a message that is never sent) and every micro-batch goes forward and backward on every stage.
TEST(PipelineSchedule, EveryListRunsToItsEndWithEveryMicroBatchThroughEveryStage) {
  for (int pp = 1; pp <= 4; ++pp) {
    for (int m = 1; m <= 9; ++m) {
      EXPECT_EQ(run_lists(Schedule::GPipe, pp, pp, m).error, "") << "GPipe P=" << pp << " M=" << m;
      if (m >= pp) {
        EXPECT_EQ(run_lists(Schedule::OneFOneB, pp, pp, m).error, "") << "1F1B P=" << pp << " M=" << m;
      }
      EXPECT_EQ(run_lists(Schedule::ZBV, pp, 2 * pp, m).error, "") << "ZBV P=" << pp << " M=" << m;
      if (m > pp && m % (m / pp) != 0) continue;  // refused (InterleavedOneFOneBRefuses...)
      for (int v = 1; v <= 3; ++v) {
        EXPECT_EQ(run_lists(Schedule::Interleaved1F1B, pp, v * pp, m).error, "")
            << "Interleaved1F1B P=" << pp << " V=" << v << " M=" << m;
      }
    }
  }
}

// The idle fraction of every rank, with a computation taking one unit and messages none, is the
// documented bubble: (P-1)/(M+P-1) for GPipe and 1F1B, (P-1)/(V*M+P-1) for interleaved 1F1B
// (B counted as one unit, as F), and for ZBV (F, I, W one unit each) (P-1)/(6M+P-1) from M = 2P.
TEST(PipelineSchedule, EachRanksIdleFractionIsTheBubbleFormula) {
  auto expect_bubble = [](Schedule schedule, int pp, int v, int m, int64_t denominator) {
    const ListsRun run = run_lists(schedule, pp, v * pp, m);
    ASSERT_EQ(run.error, "");
    for (int r = 0; r < pp; ++r) {
      const int64_t idle = run.makespan - run.busy[static_cast<size_t>(r)];
      // idle / makespan == (P-1) / denominator, in integers.
      EXPECT_EQ(idle * denominator, (pp - 1) * run.makespan)
          << fsdp::pp::to_string(schedule) << " P=" << pp << " V=" << v << " M=" << m << " rank " << r << ": idle "
          << idle << " of " << run.makespan;
    }
  };
  for (int pp = 2; pp <= 4; ++pp) {
    for (int m : {pp, 2 * pp, 4 * pp}) {
      expect_bubble(Schedule::GPipe, pp, 1, m, m + pp - 1);
      expect_bubble(Schedule::OneFOneB, pp, 1, m, m + pp - 1);
      for (int v = 1; v <= 3; ++v) expect_bubble(Schedule::Interleaved1F1B, pp, v, m, v * m + pp - 1);
      if (m >= 2 * pp) expect_bubble(Schedule::ZBV, pp, 2, m, 6 * m + pp - 1);
    }
  }
}

}  // namespace fsdp_test
