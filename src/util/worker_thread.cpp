#include "util/worker_thread.h"

namespace fsdp {

void QueuedTask::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

void QueuedTask::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
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

std::shared_ptr<QueuedTask> WorkerThread::run_or_submit(std::function<void()> task) {
  std::exception_ptr earlier;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (running_ || !queue_.empty()) {
      auto queued = std::make_shared<QueuedTask>();
      queue_.emplace_back(std::move(task), queued);
      queue_cv_.notify_one();
      return queued;
    }
    running_ = true;  // the worker starts nothing submitted meanwhile until this task is done
    earlier = first_error_;
  }
  auto done = std::make_shared<QueuedTask>();
  std::exception_ptr error = run_task(task, earlier);
  task_done(error);
  done->finish(std::move(error));
  return done;
}

std::exception_ptr WorkerThread::run_task(std::function<void()>& task, std::exception_ptr earlier) {
  if (earlier) return earlier;
  try {
    task();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void WorkerThread::task_done(std::exception_ptr error) {
  bool more;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
    if (error && !first_error_) first_error_ = error;
    more = !queue_.empty();
  }
  // Only when the worker has something to start: a wake-up for nothing costs two context switches.
  if (more) queue_cv_.notify_one();
}

void WorkerThread::run() {
  for (;;) {
    std::function<void()> task;
    std::shared_ptr<QueuedTask> queued;
    std::exception_ptr earlier;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [&] { return !running_ && (stopping_ || !queue_.empty()); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front().first);
      queued = std::move(queue_.front().second);
      queue_.pop_front();
      running_ = true;
      earlier = first_error_;
    }
    std::exception_ptr error = run_task(task, earlier);
    task_done(error);
    queued->finish(std::move(error));
  }
}

}  // namespace fsdp
