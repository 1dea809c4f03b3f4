#pragma once
// Collectives run on one communication thread per sharded model, in the order they are issued,
// so compute on the caller's thread overlaps them (paper, section 3.4).
//
// [Note: collective order]
// Ring collectives pair sends and receives by their position in this FIFO, so every rank must
// issue the same collectives in the same order. Any decision to issue one (prefetch, the rate
// limiter) must depend only on state that is the same on every rank, never on timing: two
// same-sized collectives issued in different orders would silently exchange each other's data.

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

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

class CommThread {
 public:
  CommThread();
  ~CommThread();  // finishes queued tasks, then joins
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  CommHandle submit(std::function<void()> task);

 private:
  void run();

  // A task's completion on this thread: wait() blocks until it has run.
  struct Done final : CommHandle::Completion {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::exception_ptr error;
    void wait() override;
  };

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<Done>>> queue_;
  bool stopping_ = false;
  std::exception_ptr first_error_;  // after a failure, later tasks fail at once with it
  std::thread thread_;
};

}  // namespace fsdp
