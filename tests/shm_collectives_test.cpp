// Shared-memory collectives (src/comm/shm_collectives.cpp) with real ranks over real Gloo: bitwise the
// rings' results on random data (fp32 and bf16, odd sizes, one round and many), the same byte
// accounting, a peer that never arrives named within a short timeout, and no segment left in
// /dev/shm. Fault.SharedMemoryRankKilledMidCollective runs only from tests/shm_kill_e2e.py.
#include "dist_env.h"
#include "collective_testing.h"

#include "comm/collectives.h"
#include "device/device.h"
#include "comm/shm_collectives.h"
#include "comm/shm_segment.h"

#include <fsdp/comm_stats.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

namespace fsdp_test {
namespace {

using Clock = std::chrono::steady_clock;

// Every rank runs each collective through the ring and through shared memory on the same input.
void compare_with_ring(fsdp::Collectives& ring, fsdp::Collectives& shm, int64_t s,
                       at::ScalarType dtype, const std::string& label) {
  const int w = ring.size(), r = ring.rank();
  at::Tensor shard = rank_values(s, 1, dtype);
  at::Tensor full_ring = at::zeros({w * s}, dtype), full_shm = at::zeros({w * s}, dtype);
  ring.all_gather(full_ring, shard);
  shm.all_gather(full_shm, shard);
  expect_bitwise(full_ring, full_shm, "all_gather " + label);
  // The shard may be the full buffer's own chunk too (a unit gathering in place).
  at::Tensor gathered_in_place = at::zeros({w * s}, dtype);
  gathered_in_place.narrow(0, r * s, s).copy_(shard);
  shm.all_gather(gathered_in_place, gathered_in_place.narrow(0, r * s, s));
  expect_bitwise(full_ring, gathered_in_place, "in-place all_gather " + label);

  const at::Tensor grads = rank_values(w * s, 2, dtype);
  at::Tensor out_ring = at::empty({s}, dtype), out_shm = at::empty({s}, dtype);
  ring.reduce_scatter_sum(out_ring, grads.clone());
  shm.reduce_scatter_sum(out_shm, grads.clone());
  expect_bitwise(out_ring, out_shm, "reduce_scatter_sum " + label);
  // The shard may be the full buffer's own chunk (FSDP reduces in place).
  at::Tensor in_place = grads.clone();
  shm.reduce_scatter_sum(in_place.narrow(0, r * s, s), in_place);
  expect_bitwise(out_ring, in_place.narrow(0, r * s, s), "in-place reduce_scatter_sum " + label);

  at::Tensor sum_ring = rank_values(w * s + 3, 3, dtype), sum_shm = sum_ring.clone();
  ring.all_reduce_sum(sum_ring);
  shm.all_reduce_sum(sum_shm);
  expect_bitwise(sum_ring, sum_shm, "all_reduce_sum " + label);

  at::Tensor from_ring = rank_values(s + 1, 4, dtype), from_shm = from_ring.clone();
  ring.broadcast(from_ring, w - 1);
  shm.broadcast(from_shm, w - 1);
  expect_bitwise(from_ring, from_shm, "broadcast " + label);
}

TEST(ShmCollectives, GiveTheRingsResultsBitwise) {
  fsdp::ProcessGroup& world = *dist().world;
  auto ring = fsdp::make_ring_collectives(world);
  // Small rounds (4 KiB: many per tensor, pieces that do not divide the sizes) and the default.
  for (size_t chunk_bytes : {size_t{4096}, fsdp::kShmChunkBytes}) {
    auto shm = fsdp::make_shm_collectives(world, chunk_bytes);
    ASSERT_TRUE(shm) << "the segment could not be set up";
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      // 300007 elements: several rounds and several of Gloo's 1 MiB segments per rank; 2100001
      // fp32: outputs over 8 MiB, written with streaming stores.
      for (int64_t s : {1, 37, 1001, 300007, 2100001}) {
        if (s > 1000000 && (dtype != at::kFloat || chunk_bytes != fsdp::kShmChunkBytes)) continue;
        compare_with_ring(*ring, *shm, s, dtype,
                          std::string(c10::toString(dtype)) + " S=" + std::to_string(s) +
                              " chunk=" + std::to_string(chunk_bytes));
      }
    }
  }
}

fsdp::CommStats run_counted(fsdp::Collectives& c, int64_t s) {
  const int w = c.size();
  fsdp::reset_comm_stats();
  c.all_gather(at::zeros({w * s}), at::ones({s}));
  c.reduce_scatter_sum(at::empty({s}), at::ones({w * s}));
  c.all_reduce_sum(at::ones({s + 5}));
  c.broadcast(at::ones({s}), 0);
  return fsdp::comm_stats();
}

TEST(ShmCollectives, CountBytesAsTheRingDoes) {
  fsdp::ProcessGroup& world = *dist().world;
  auto ring = fsdp::make_ring_collectives(world);
  auto shm = fsdp::make_shm_collectives(world, 4096);
  ASSERT_TRUE(shm);
  const fsdp::CommStats by_ring = run_counted(*ring, 12345);
  const fsdp::CommStats by_shm = run_counted(*shm, 12345);
  EXPECT_EQ(by_ring.all_gather_bytes, by_shm.all_gather_bytes);
  EXPECT_EQ(by_ring.reduce_scatter_bytes, by_shm.reduce_scatter_bytes);
  EXPECT_EQ(by_ring.all_reduce_bytes, by_shm.all_reduce_bytes);
  EXPECT_EQ(by_ring.broadcast_bytes, by_shm.broadcast_bytes);
  if (world.size() > 1) {
    EXPECT_GT(by_shm.all_gather_bytes, 0);
  }
}

// The world's ranks, backend and host names, but a timeout of one second and a store of its own.
std::shared_ptr<fsdp::ProcessGroup> short_timeout_group(const std::string& name) {
  return group_with(name, {}, std::chrono::seconds(1));
}

// Runs `fn`, expected to fail within the timeout; returns the error.
template <class Fn>
std::string expect_error_in_time(const fsdp::ProcessGroup& group, Fn&& fn) {
  const auto start = Clock::now();
  std::string message;
  try {
    fn();
    ADD_FAILURE() << "it succeeded without its peer";
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  }
  EXPECT_LT(Clock::now() - start, group.timeout() + std::chrono::seconds(5)) << message;
  return message;
}

// Segments of this process in /proc/self/maps (they stay mapped, unlinked, while in use).
std::vector<std::string> mapped_segments() {
  std::ifstream maps("/proc/self/maps");
  std::vector<std::string> out;
  for (std::string line; std::getline(maps, line);) {
    if (line.find(std::string("/dev/shm/") + fsdp::kShmSegmentPrefix) != std::string::npos) {
      out.push_back(line);
    }
  }
  return out;
}

// Segments in /dev/shm created by this job (their names carry the pid of the group's rank 0;
// other jobs on the machine may be setting up theirs at the same time). Collective.
size_t segments_of_this_job() {
  at::Tensor pid = at::full({1}, static_cast<int64_t>(getpid()), at::kLong);
  fsdp::broadcast(*dist().world, pid, 0);
  const std::string prefix = fsdp::kShmSegmentPrefix + std::to_string(pid.item<int64_t>()) + "-";
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    n += entry.path().filename().string().rfind(prefix, 0) == 0;
  }
  dist().world->backend().barrier()->wait();  // before rank 0 creates the next one
  return n;
}

// The public all_reduce_sum and broadcast of a group on one host map a segment of the group's own
// at their first call (a step's loss no longer wakes Gloo's threads) and give Gloo's results
// bitwise, over several rounds and for a non-contiguous tensor; with the ring chosen, they stay on
// Gloo and map nothing.
TEST(ShmCollectives, GroupsOwnCollectivesGoThroughSharedMemoryOnOneHost) {
  fsdp::ProcessGroup& world = *dist().world;
  const int w = world.size();
  for (auto choice : {fsdp::CpuCollectives::SharedMemory, fsdp::CpuCollectives::Ring}) {
    fsdp::GroupSettings settings;
    settings.cpu_collectives = choice;
    const bool shm = choice == fsdp::CpuCollectives::SharedMemory;
    auto group = group_with(shm ? "own_shm" : "own_ring", settings, world.timeout());
    const size_t mapped_before = mapped_segments().size();
    // 200003 x 2 fp32 (1.6 MB): several of the group's 256 KiB rounds; the transpose is not contiguous.
    const at::Tensor values = rank_values(400006, 7, at::kFloat).view({200003, 2}).t();
    at::Tensor by_gloo = values.contiguous(), by_group = values.clone();
    fsdp::backend_all_reduce_sum(*group, by_gloo);
    fsdp::all_reduce_sum(*group, by_group);
    expect_bitwise(by_gloo, by_group.contiguous(), "all_reduce_sum");
    EXPECT_EQ(mapped_segments().size(), mapped_before + (shm && w > 1 ? 1 : 0));

    at::Tensor sent_by_gloo = rank_values(70001, 8, at::kBFloat16), sent = sent_by_gloo.clone();
    fsdp::backend_broadcast(*group, sent_by_gloo, w - 1);
    fsdp::broadcast(*group, sent, w - 1);
    expect_bitwise(sent_by_gloo, sent, "broadcast");
    at::Tensor count = at::ones({3}, at::kLong);
    fsdp::all_reduce_sum(*group, count);
    EXPECT_TRUE(count.eq(w).all().item<bool>()) << count;
    EXPECT_EQ(mapped_segments().size(), mapped_before + (shm && w > 1 ? 1 : 0));
  }
}

TEST(ShmCollectives, PeerThatNeverArrivesTimesOutNamingIt) {
  fsdp::ProcessGroup& world = *dist().world;
  if (world.size() == 1) GTEST_SKIP() << "needs a peer";
  const int absent = world.size() - 1;
  const std::string expected_name = world.describe_member(absent);
  {  // It never joins the segment.
    auto group = short_timeout_group("shm_never_joins");
    if (world.rank() != absent) {
      const std::string message =
          expect_error_in_time(*group, [&] { fsdp::make_shm_collectives(*group); });
      EXPECT_NE(message.find(expected_name), std::string::npos) << message;
      EXPECT_NE(message.find("did not map the segment"), std::string::npos) << message;
    }
    world.backend().barrier()->wait();
  }
  EXPECT_EQ(segments_of_this_job(), 0u) << "a failed set-up left its segment behind";
  {  // It joins, then never comes to the all-gather.
    auto group = short_timeout_group("shm_never_gathers");
    auto shm = fsdp::make_shm_collectives(*group, 4096);
    ASSERT_TRUE(shm);
    if (world.rank() != absent) {
      const std::string message = expect_error_in_time(*group, [&] {
        shm->all_gather(at::zeros({world.size() * 10}), at::ones({10}));
      });
      EXPECT_NE(message.find("all_gather (shared memory) on rank " + std::to_string(world.rank())),
                std::string::npos) << message;
      EXPECT_NE(message.find("waiting for " + expected_name), std::string::npos) << message;
      EXPECT_NE(message.find("made no progress"), std::string::npos) << message;
    }
    world.backend().barrier()->wait();
  }
}

// A pid that no process has any more.
int dead_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

TEST(ShmCollectives, LeaveNoSegmentBehind) {
  fsdp::ProcessGroup& world = *dist().world;
  if (world.size() == 1) GTEST_SKIP() << "a group of one needs no segment";
  // A segment left by an earlier job whose rank 0 was killed while its ranks mapped it.
  const std::string stale = "/" + std::string(fsdp::kShmSegmentPrefix) +
                            std::to_string(dead_pid()) + "-left-by-a-killed-job";
  if (world.rank() == 0) {
    const int fd = shm_open(stale.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  world.backend().barrier()->wait();
  const size_t mapped_before = mapped_segments().size();
  {
    auto shm = fsdp::make_shm_collectives(world);
    ASSERT_TRUE(shm);
    EXPECT_EQ(segments_of_this_job(), 0u) << "the segment is unlinked once all ranks mapped it";
    EXPECT_FALSE(std::filesystem::exists("/dev/shm" + stale)) << "the stale segment is removed";
    const auto mapped = mapped_segments();
    ASSERT_EQ(mapped.size(), mapped_before + 1);
    EXPECT_NE(mapped.back().find("(deleted)"), std::string::npos) << mapped.back();
    shm->all_reduce_sum(at::ones({100}));
  }
  EXPECT_EQ(mapped_segments().size(), mapped_before) << "the memory is released with the group";
  world.backend().barrier()->wait();
}

TEST(ShmCollectives, AreTheCpuDevicesDefaultOnOneHost) {
  fsdp::ProcessGroup& world = *dist().world;
  if (world.size() == 1 || world.settings().cpu_collectives == fsdp::CpuCollectives::Ring) {
    GTEST_SKIP();
  }
  ASSERT_TRUE(fsdp::all_on_one_host(world));
  const size_t mapped_before = mapped_segments().size();
  auto collectives = fsdp::make_device(c10::Device(c10::kCPU))->collectives(world);
  EXPECT_EQ(mapped_segments().size(), mapped_before + 1) << "the CPU device chose the ring";
}

// Run by tests/shm_kill_e2e.py only (Fault.* stays out of the dist_world runs): rank 1 is
// SIGKILLed between two all-gathers; rank 0 must name it at once, not wait for the timeout.
TEST(Fault, SharedMemoryRankKilledMidCollective) {
  fsdp::ProcessGroup& world = *dist().world;
  ASSERT_EQ(world.size(), 2);
  auto shm = fsdp::make_shm_collectives(world);
  ASSERT_TRUE(shm);
  at::Tensor full = at::zeros({2 << 20}), shard = at::ones({1 << 20});
  for (int i = 0; i < 3; ++i) shm->all_gather(full, shard);
  if (world.rank() == 1) raise(SIGKILL);
  const auto start = Clock::now();
  const std::string message = expect_error_in_time(world, [&] { shm->all_gather(full, shard); });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2)) << "a dead peer is noticed at once";
  std::printf("rank 0: %s\n", message.c_str());
  EXPECT_NE(message.find("waiting for " + world.describe_member(1) + "): it exited"),
            std::string::npos) << message;
}

}  // namespace
}  // namespace fsdp_test
