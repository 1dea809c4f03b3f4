#include "comm/comm_thread.h"

namespace fsdp {

void CommThread::Done::wait() {
  std::unique_lock<std::mutex> lock(mutex);
  done_cv.wait(lock, [&] { return done; });
  if (error) std::rethrow_exception(error);
}

CommThread::CommThread() : thread_([this] { run(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  thread_.join();
}

CommHandle CommThread::submit(std::function<void()> task) {
  auto done = std::make_shared<Done>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(std::move(task), done);
  }
  queue_cv_.notify_one();
  return CommHandle(done);
}

void CommThread::run() {
  for (;;) {
    std::function<void()> task;
    std::shared_ptr<Done> state;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front().first);
      state = std::move(queue_.front().second);
      queue_.pop_front();
    }
    // A failed collective leaves the ranks out of step: running the next ones would only wait
    // for the timeout again, so they fail at once with the first error.
    std::exception_ptr error = first_error_;
    if (!error) {
      try {
        task();
      } catch (...) {
        error = first_error_ = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->done = true;
      state->error = error;
    }
    state->done_cv.notify_all();
  }
}

}  // namespace fsdp
