#include "util/worker_thread.h"

namespace fsdp {

void QueuedTask::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

WorkerThread::WorkerThread() : thread_([this] { run(); }) {}

WorkerThread::~WorkerThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  thread_.join();
}

std::shared_ptr<QueuedTask> WorkerThread::submit(std::function<void()> task) {
  auto queued = std::make_shared<QueuedTask>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(std::move(task), queued);
  }
  queue_cv_.notify_one();
  return queued;
}

void WorkerThread::run() {
  for (;;) {
    std::function<void()> task;
    std::shared_ptr<QueuedTask> queued;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front().first);
      queued = std::move(queue_.front().second);
      queue_.pop_front();
    }
    std::exception_ptr error = first_error_;
    if (!error) {
      try {
        task();
      } catch (...) {
        error = first_error_ = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(queued->mutex_);
      queued->done_ = true;
      queued->error_ = error;
    }
    queued->done_cv_.notify_all();
  }
}

}  // namespace fsdp
