#pragma once
// Spans for fsdp/trace.h. Recording costs one clock read per span boundary and nothing when off.

#include <fsdp/trace.h>

#include <chrono>
#include <string>

namespace fsdp {

enum class TraceLane { Compute = 1, Communication = 2 };

/// Records [start, now) under `name` in `lane` if tracing is on.
void record_span(const std::string& name, TraceLane lane,
                 std::chrono::steady_clock::time_point start);

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

}  // namespace fsdp
