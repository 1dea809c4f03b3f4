#pragma once
// What gpt_train's end-of-run summary needs of its steps, in bounded memory: a run of a million
// steps keeps no record per step (about 110 bytes each), only running aggregates and a bounded
// uniform sample of the step times for their median.

#include <cstdint>
#include <random>
#include <vector>

namespace gpt {

struct StepRecord;

class StepSummary {
 public:
  void add(const StepRecord& record);

  int64_t steps() const { return steps_; }
  double first_loss() const { return first_loss_; }
  double last_loss() const { return last_loss_; }
  /// This rank's peak memory over the steps after the first (which creates the optimizer
  /// state), or the first's when it is the only one.
  int64_t peak_bytes() const { return steps_ > 1 ? later_peak_ : first_peak_; }
  /// The median step time, over the same steps: exact up to kSample steps, else a sample's.
  double median_step_ms() const;

  static constexpr size_t kSample = 4096;

 private:
  int64_t steps_ = 0;
  double first_loss_ = 0, last_loss_ = 0, first_ms_ = 0;
  int64_t first_peak_ = 0, later_peak_ = 0;
  std::vector<double> later_ms_;  // a uniform sample (reservoir) of the later steps' times
  std::mt19937_64 pick_{0};       // fixed: the same run prints the same summary
};

}  // namespace gpt
