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

/// The completion of one submitted task; wait() rethrows the task's exception (e.g. a timeout).
class CommHandle {
 public:
  CommHandle() = default;
  bool valid() const { return state_ != nullptr; }
  void wait();

 private:
  friend class CommThread;
  struct State {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::exception_ptr error;
  };
  std::shared_ptr<State> state_;
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

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<CommHandle::State>>> queue_;
  bool stopping_ = false;
  std::exception_ptr first_error_;  // after a failure, later tasks fail at once with it
  std::thread thread_;
};

}  // namespace fsdp
