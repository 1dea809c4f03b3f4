#include "step_summary.h"

#include "trainer.h"

#include <algorithm>

namespace gpt {

void StepSummary::add(const StepRecord& record) {
  ++steps_;
  last_loss_ = record.loss;
  if (steps_ == 1) {
    first_loss_ = record.loss;
    first_ms_ = record.step_ms;
    first_peak_ = record.memory.peak_bytes;
    return;
  }
  later_peak_ = std::max(later_peak_, record.memory.peak_bytes);
  const uint64_t later = static_cast<uint64_t>(steps_ - 1);  // this step's count among the later
  if (later_ms_.size() < kSample) {
    later_ms_.push_back(record.step_ms);
  } else if (const uint64_t slot = pick_() % later; slot < kSample) {  // Algorithm R
    later_ms_[slot] = record.step_ms;
  }
}

double StepSummary::median_step_ms() const {
  if (steps_ == 0) return 0;
  std::vector<double> ms = steps_ > 1 ? later_ms_ : std::vector<double>{first_ms_};
  const auto mid = ms.begin() + static_cast<std::ptrdiff_t>(ms.size() / 2);  // the upper one
  std::nth_element(ms.begin(), mid, ms.end());
  return *mid;
}

}  // namespace gpt
