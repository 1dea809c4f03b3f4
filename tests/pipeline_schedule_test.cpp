// The pipeline schedules as data: each rank's actions against lists written by hand, for P = 2, 4
// and M = 2, 4; 1F1B with fewer micro-batches than stages refused by name. No collective: every
// rank checks the same lists.
#include "error_of.h"

#include <fsdp/pipeline.h>

#include <gtest/gtest.h>

#include <string>
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

TEST(PipelineSchedule, OneStagePerRankIsWhatIsBuilt) {
  EXPECT_EQ(fsdp::pp::stages_of_rank(1, 2, 2), std::vector<int>{1});
  const std::string error = error_of([] { fsdp::pp::stages_of_rank(0, 2, 4); });
  EXPECT_NE(error.find("V stages per rank is not built"), std::string::npos) << error;
}

}  // namespace fsdp_test
