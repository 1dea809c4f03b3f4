#pragma once
// Collectives run on one communication thread per sharded model, in the order they are issued,
// so compute on the caller's thread overlaps them (paper, section 3.4).
//
// [Note: collective order]
// Ring collectives pair sends and receives by their position in this FIFO, so every rank must
// issue the same collectives in the same order. Any decision to issue one (prefetch, the rate
// limiter) must depend only on state that is the same on every rank, never on timing: two
// same-sized collectives issued in different orders would silently exchange each other's data.

#include "util/worker_thread.h"

#include <functional>
#include <memory>

namespace fsdp {

/// The completion of one submitted task. wait() returns once the task's results may be used by
/// the caller (on a GPU: once the caller's stream is ordered after them) and rethrows the task's
/// exception (e.g. a timeout).
class CommHandle {
 public:
  struct Completion {
    virtual ~Completion() = default;
    virtual void wait() = 0;
    /// Returns once the task's results are in memory the host may read (a GPU's work done, not
    /// only ordered): what a CPU step of an offloaded shard's gradient needs.
    virtual void wait_host() { wait(); }
  };
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<Completion> completion) : completion_(std::move(completion)) {}
  bool valid() const { return completion_ != nullptr; }
  void wait() {
    if (completion_) completion_->wait();
  }
  void wait_host() {
    if (completion_) completion_->wait_host();
  }

 private:
  std::shared_ptr<Completion> completion_;
};

/// The model's communication thread: a WorkerThread whose tasks' completions are CommHandles. A
/// failed collective leaves the ranks out of step: running the next ones would only wait for the
/// timeout again, so they fail at once with the first error.
class CommThread {
 public:
  CommHandle submit(std::function<void()> task);
  /// On the caller's thread when every task submitted before has finished, else queued
  /// (WorkerThread::run_or_submit): the same order, without the hand-off.
  CommHandle run_or_submit(std::function<void()> task);

 private:
  WorkerThread worker_;
};

}  // namespace fsdp
