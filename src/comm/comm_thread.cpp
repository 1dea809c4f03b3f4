#include "comm/comm_thread.h"

namespace fsdp {

namespace {

// A task's completion on the thread: wait() blocks until it has run.
struct Queued final : CommHandle::Completion {
  explicit Queued(std::shared_ptr<QueuedTask> task) : task(std::move(task)) {}
  void wait() override { task->wait(); }
  std::shared_ptr<QueuedTask> task;
};

}  // namespace

CommHandle CommThread::submit(std::function<void()> task) {
  return CommHandle(std::make_shared<Queued>(worker_.submit(std::move(task))));
}

CommHandle CommThread::run_or_submit(std::function<void()> task) {
  return CommHandle(std::make_shared<Queued>(worker_.run_or_submit(std::move(task))));
}

}  // namespace fsdp
