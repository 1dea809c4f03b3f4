#pragma once
// One thread that runs the tasks submitted to it in order. Each task depends on the ones before
// it: once one has failed, the later ones fail at once with its error instead of running.

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace fsdp {

/// The completion of one submitted task.
class QueuedTask {
 public:
  /// Blocks until the task has run (or failed without running); rethrows its error.
  void wait();

 private:
  friend class WorkerThread;
  void finish(std::exception_ptr error);

  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class WorkerThread {
 public:
  WorkerThread();
  ~WorkerThread();  // finishes queued tasks, then joins
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  std::shared_ptr<QueuedTask> submit(std::function<void()> task);
  /// Runs `task` on the calling thread, now, when every task submitted before it has finished;
  /// otherwise queues it as submit() does. Either way it runs after those and before any
  /// submitted after it, and its error (or an earlier task's) is in the returned completion.
  std::shared_ptr<QueuedTask> run_or_submit(std::function<void()> task);

 private:
  void run();
  /// Runs `task` unless an earlier one failed; returns the error it ends with.
  std::exception_ptr run_task(std::function<void()>& task, std::exception_ptr earlier);
  /// Marks the task that ran as done and failed with `error` (nullptr: it succeeded).
  void task_done(std::exception_ptr error);

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<QueuedTask>>> queue_;
  bool running_ = false;            // a task runs, on the worker or on a run_or_submit caller
  bool stopping_ = false;
  std::exception_ptr first_error_;  // after a failure, later tasks fail at once with it
  std::thread thread_;
};

}  // namespace fsdp
