#include "util/trace.h"

#include "util/atomic_file.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <mutex>
#include <vector>

namespace fsdp {

namespace {

using Clock = TraceClock;

struct Span {
  std::string name;
  TraceLane lane;
  Clock::time_point start, end;
};

struct Recorder {
  std::atomic<bool> on{false};
  std::mutex mutex;
  std::vector<Span> spans;
  Clock::time_point origin;
};

Recorder& recorder() {
  static Recorder instance;
  return instance;
}

const char* lane_name(TraceLane lane) {
  switch (lane) {
    case TraceLane::Compute: return "compute";
    case TraceLane::Communication: return "communication";
    case TraceLane::Waits: return "compute waits";
  }
  return "?";
}

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

}  // namespace

void start_trace() {
  std::lock_guard<std::mutex> lock(recorder().mutex);
  recorder().spans.clear();
  recorder().origin = Clock::now();
  recorder().on = true;
}

bool trace_enabled() { return recorder().on; }

void record_span(const char* what, const std::string& label, TraceLane lane,
                 Clock::time_point start) {
  // A span that started before tracing did (start_trace() mid-span) is not recorded.
  if (!recorder().on || start == Clock::time_point()) return;
  const auto end = Clock::now();
  std::string name = std::string(what) + " " + label;
  std::lock_guard<std::mutex> lock(recorder().mutex);
  recorder().spans.push_back(Span{std::move(name), lane, start, end});
}

void write_trace(const std::string& path, int rank) {
  std::vector<Span> spans;
  Clock::time_point origin;
  {
    std::lock_guard<std::mutex> lock(recorder().mutex);
    recorder().on = false;
    spans.swap(recorder().spans);
    origin = recorder().origin;
  }
  nlohmann::json events = nlohmann::json::array();
  for (TraceLane lane : {TraceLane::Compute, TraceLane::Communication, TraceLane::Waits}) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", static_cast<int>(lane)},
                      {"args", {{"name", lane_name(lane)}}}});
  }
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 1},
                    {"args", {{"name", "rank " + std::to_string(rank)}}}});
  for (const auto& span : spans) {
    events.push_back({{"name", span.name},
                      {"cat", lane_name(span.lane)},
                      {"ph", "X"},
                      {"pid", rank},
                      {"tid", static_cast<int>(span.lane)},
                      {"ts", micros(span.start - origin)},
                      {"dur", micros(span.end - span.start)}});
  }
  const std::string text = nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
  AtomicFileWriter file(path);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace fsdp
