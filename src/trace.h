#pragma once
// Spans for fsdp/trace.h. Recording costs one clock read per span boundary and nothing when off.

#include <fsdp/trace.h>

#include <chrono>
#include <string>

namespace fsdp {

// Waits: the compute thread blocked on communication or the rate limiter (exposed communication).
enum class TraceLane { Compute = 1, Communication = 2, Waits = 3 };

/// Records [start, now) under `name` in `lane` if tracing is on.
void record_span(const std::string& name, TraceLane lane,
                 std::chrono::steady_clock::time_point start);

/// Whether spans are being recorded.
bool trace_enabled();

/// Records its own lifetime as a span.
class TraceSpan {
 public:
  TraceSpan(std::string name, TraceLane lane)
      : name_(std::move(name)), lane_(lane), start_(std::chrono::steady_clock::now()) {}
  ~TraceSpan() { record_span(name_, lane_, start_); }

 private:
  std::string name_;
  TraceLane lane_;
  std::chrono::steady_clock::time_point start_;
};

/// Records the time the compute thread spends blocked on `what` ("wait all_gather <label>") in
/// the Waits lane; costs nothing when tracing is off.
class WaitSpan {
 public:
  WaitSpan(const char* what, const std::string& label)
      : what_(what), label_(label), on_(trace_enabled()) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~WaitSpan() {
    if (on_) record_span(std::string("wait ") + what_ + " " + label_, TraceLane::Waits, start_);
  }

 private:
  const char* what_;
  const std::string& label_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace fsdp
