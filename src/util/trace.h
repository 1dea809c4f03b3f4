#pragma once
// Spans for fsdp/trace.h, named "<what> <unit>" ("all_gather h.3"). When tracing is off a span
// costs one flag read: no clock read, no string.

#include <fsdp/trace.h>

#include <chrono>
#include <string>

namespace fsdp {

// Waits: the compute thread blocked on communication or the rate limiter (exposed communication).
enum class TraceLane { Compute = 1, Communication = 2, Waits = 3 };

using TraceClock = std::chrono::steady_clock;

/// Whether spans are being recorded.
bool trace_enabled();

/// Now if tracing is on, else the epoch (a span started then is not recorded either).
inline TraceClock::time_point trace_now() {
  return trace_enabled() ? TraceClock::now() : TraceClock::time_point();
}

/// Records [start, now) as "<what> <label>" in `lane` if tracing is on.
void record_span(const char* what, const std::string& label, TraceLane lane,
                 TraceClock::time_point start);

/// Records its own lifetime as the span "<what> <label>". `label` must outlive it.
class TraceSpan {
 public:
  TraceSpan(const char* what, const std::string& label, TraceLane lane)
      : what_(what), label_(label), lane_(lane), start_(trace_now()) {}
  ~TraceSpan() { record_span(what_, label_, lane_, start_); }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* what_;
  const std::string& label_;
  TraceLane lane_;
  TraceClock::time_point start_;
};

}  // namespace fsdp
