// A rank that dies or stalls gives the others a clear error within the timeout, never a hang.
// Each test ends a rank's useful life, so ctest runs each in its own launch (tests/CMakeLists.txt).
#include "dist_env.h"
#include "test_models.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <unistd.h>

namespace fsdp_test {
namespace {

using Clock = std::chrono::steady_clock;

// One training step of the awkward model on this rank's rows.
void train_step(fsdp::Unit<OddNet>& model, torch::optim::Optimizer& optim) {
  auto [x, y] = odd_batch(0, 2 * dist().world_size());
  optim.zero_grad();
  torch::mse_loss(model(x.narrow(0, 2 * dist().rank(), 2)), y.narrow(0, 2 * dist().rank(), 2))
      .backward();
  optim.step();
}

// Runs a step expected to fail; returns the error and checks it came within the timeout.
std::string failing_step(fsdp::Unit<OddNet>& model, torch::optim::Optimizer& optim) {
  const auto start = Clock::now();
  std::string message;
  try {
    train_step(model, optim);
    ADD_FAILURE() << "the step succeeded without its peer";
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  }
  const auto waited = Clock::now() - start;
  EXPECT_LT(waited, dist().world->timeout() + std::chrono::seconds(10)) << message;
  std::printf("rank %d failed after %.1f s: %s\n", dist().rank(),
              std::chrono::duration<double>(waited).count(), message.substr(0, 200).c_str());
  return message;
}

TEST(Fault, PeerThatDiesGivesAClearErrorNotAHang) {
  ASSERT_EQ(dist().world_size(), 2);
  auto model = fsdp::fully_shard(make_odd_net(1), *dist().world);
  torch::optim::SGD optim(model->parameters(), torch::optim::SGDOptions(0.1));
  train_step(model, optim);  // all well so far
  if (dist().rank() == 1) {
    std::fflush(nullptr);
    _exit(0);  // vanishes without a word (exit 0: the launcher lets rank 0 report)
  }
  const std::string message = failing_step(model, optim);
  EXPECT_NE(message.find("rank 0"), std::string::npos) << message;
  EXPECT_NE(message.find("peer rank has probably died"), std::string::npos) << message;
}

TEST(Fault, PeerThatStallsTimesOutWithAClearError) {
  ASSERT_EQ(dist().world_size(), 2);
  auto model = fsdp::fully_shard(make_odd_net(1), *dist().world);
  torch::optim::SGD optim(model->parameters(), torch::optim::SGDOptions(0.1));
  train_step(model, optim);
  if (dist().rank() == 1) std::this_thread::sleep_for(dist().world->timeout() + std::chrono::seconds(3));
  // Rank 0 times out waiting; rank 1 then finds rank 0 gone or timed out. Both fail, clearly.
  const std::string message = failing_step(model, optim);
  EXPECT_NE(message.find("failed"), std::string::npos) << message;
}

// SummonFullParams built on rank 0 alone (inside `if (rank == 0)`): rank 0 fails naming the scope
// and the fix, in one line without a C++ backtrace, which a program that does not catch it prints.
TEST(Fault, SummonOnOneRankFailsInOneClearLine) {
  ASSERT_EQ(dist().world_size(), 2);
  auto model = fsdp::fully_shard(make_odd_net(1), *dist().world);
  if (dist().rank() == 1) {
    std::fflush(nullptr);
    _exit(0);  // goes on without the scope (here: ends), as a rank outside `if (rank == 0)` does
  }
  try {
    fsdp::SummonFullParams full(model);
    ADD_FAILURE() << "the scope was built without rank 1";
  } catch (const c10::Error& e) {
    const std::string what = e.what();  // what std::terminate prints
    EXPECT_NE(what.find("SummonFullParams"), std::string::npos) << what;
    EXPECT_NE(what.find("every rank must build the scope"), std::string::npos) << what;
    EXPECT_EQ(what.find("Exception raised from"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace fsdp_test
