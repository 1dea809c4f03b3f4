// The device seam's contract ([Note: the device seam] in src/device/device.h), on the CPU device: work
// submitted on either lane runs in submission order, off the caller's thread unless it is small
// and nothing is ahead of it ([Note: small collectives inline]); wait() rethrows a task's error
// and later work fails at once with it; memory is counted by the counting allocator; bytes
// handed to release_after are freed; a device this build lacks is a clear error.
#include "device/device.h"

#include <fsdp/memory.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "error_of.h"

#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using fsdp_test::error_of;

// A collective large enough to overlap with compute: it goes to the communication thread.
constexpr int64_t kOverlapped = int64_t{1} << 30;

TEST(DeviceSeam, CpuRunsBothLanesInSubmissionOrderOffTheCallersThread) {
  auto device = fsdp::make_device(c10::Device(c10::kCPU));
  EXPECT_EQ(device->device(), c10::Device(c10::kCPU));
  std::mutex mutex;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::vector<fsdp::CommHandle> handles;
  for (int i = 0; i < 20; ++i) {
    const auto lane = i % 3 == 0 ? fsdp::CommLane::Reduce : fsdp::CommLane::AllGather;
    handles.push_back(device->submit(
        lane,
        [&, i] {
          if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
          std::lock_guard<std::mutex> lock(mutex);
          order.push_back(i);
          threads.push_back(std::this_thread::get_id());
        },
        kOverlapped));
  }
  for (auto& handle : handles) handle.wait();
  std::vector<int> expected(20);
  for (int i = 0; i < 20; ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
  for (auto id : threads) EXPECT_NE(id, std::this_thread::get_id());
}

TEST(DeviceSeam, AFailedTaskFailsItsWaitAndEveryLaterTask) {
  auto device = fsdp::make_device(c10::Device(c10::kCPU));
  std::atomic<bool> later_ran{false};
  auto failing = device->submit(fsdp::CommLane::AllGather, [] { TORCH_CHECK(false, "peer lost"); }, kOverlapped);
  auto later = device->submit(fsdp::CommLane::Reduce, [&] { later_ran = true; }, kOverlapped);
  EXPECT_NE(error_of([&] { failing.wait(); }).find("peer lost"), std::string::npos);
  EXPECT_NE(error_of([&] { later.wait(); }).find("peer lost"), std::string::npos);
  EXPECT_FALSE(later_ran);
}

TEST(DeviceSeam, CpuRunsASmallTaskOnTheCallersThreadWhenNothingIsAheadOfIt) {
  auto device = fsdp::make_device(c10::Device(c10::kCPU));
  std::thread::id ran_on;
  auto handle = device->submit(fsdp::CommLane::AllGather, [&] { ran_on = std::this_thread::get_id(); },
                               /*overlap_bytes=*/0);
  EXPECT_EQ(ran_on, std::this_thread::get_id()) << "a small collective went through the hand-off";
  handle.wait();
}

TEST(DeviceSeam, CpuRunsASmallTaskAfterTheQueuedWorkAheadOfIt) {
  auto device = fsdp::make_device(c10::Device(c10::kCPU));
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::mutex mutex;
  std::vector<int> order;
  auto record = [&](int i) {
    std::lock_guard<std::mutex> lock(mutex);
    order.push_back(i);
  };
  auto first = device->submit(fsdp::CommLane::Reduce, [&] { released.wait(); record(0); }, kOverlapped);
  auto second = device->submit(fsdp::CommLane::AllGather, [&] { record(1); }, /*overlap_bytes=*/0);
  release.set_value();
  first.wait();
  second.wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1})) << "a small collective overtook the queue";
}

TEST(DeviceSeam, ASmallTaskThatFailsFailsEveryLaterTask) {
  auto device = fsdp::make_device(c10::Device(c10::kCPU));
  std::atomic<bool> later_ran{false};
  auto failing = device->submit(fsdp::CommLane::AllGather, [] { TORCH_CHECK(false, "peer lost"); }, 0);
  auto later = device->submit(fsdp::CommLane::Reduce, [&] { later_ran = true; }, kOverlapped);
  EXPECT_NE(error_of([&] { failing.wait(); }).find("peer lost"), std::string::npos);
  EXPECT_NE(error_of([&] { later.wait(); }).find("peer lost"), std::string::npos);
  EXPECT_FALSE(later_ran);
}

TEST(DeviceSeam, CpuCountsMemoryAndReleasesHandedBytes) {
  fsdp::install_memory_counter();
  auto device = fsdp::make_device(c10::Device(c10::kCPU));
  const c10::Device cpu(c10::kCPU);
  const int64_t before = fsdp::memory_stats(cpu).current_bytes;
  at::Tensor t = at::empty({1 << 16}, at::kFloat);
  EXPECT_EQ(fsdp::memory_stats(cpu).current_bytes, before + (4 << 16));
  EXPECT_EQ(fsdp::memory_stats(cpu).current_bytes, fsdp::memory_stats().current_bytes);
  c10::DataPtr bytes = t.storage().unsafeGetStorageImpl()->set_data_ptr(c10::DataPtr(nullptr, t.device()));
  t.storage().unsafeGetStorageImpl()->set_nbytes(0);
  device
      ->submit(
          fsdp::CommLane::Reduce,
          [&] { device->release_after(fsdp::CommLane::Reduce, std::move(bytes)); }, kOverlapped)
      .wait();
  EXPECT_EQ(fsdp::memory_stats(cpu).current_bytes, before);
}

TEST(DeviceSeam, ADeviceThisBuildLacksNamesTheFix) {
#ifndef FSDP_CUDA
  const std::string message = error_of([] { fsdp::make_device(c10::Device(c10::kCUDA, 0)); });
  EXPECT_NE(message.find("no CUDA"), std::string::npos) << message;
  EXPECT_NE(message.find("scripts/build_cuda.sh"), std::string::npos) << message;
#endif
  const std::string meta = error_of([] { fsdp::make_device(c10::Device(c10::kMeta)); });
  EXPECT_NE(meta.find("meta is not supported"), std::string::npos) << meta;
}

}  // namespace
