// Weights used by a stage that does not hold them, refused by name (borrowed_weights.h).
#include "pp/borrowed_weights.h"

#include <c10/util/Exception.h>

#include <set>
#include <string>
#include <vector>

namespace fsdp::pp {

BorrowedWeights::BorrowedWeights(const std::vector<Stage>& local_stages) {
  std::set<const c10::TensorImpl*> held, listed;
  for (const Stage& stage : local_stages) {
    local_stages_.push_back(stage.index());
    for (const auto& item : stage.named_parameters()) held.insert(item.value().unsafeGetTensorImpl());
  }
  for (const Stage& stage : local_stages) {
    for (const auto& item : stage.other_stages_parameters()) {
      const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
      if (held.count(impl) == 0 && listed.insert(impl).second) others_.emplace_back(item.key(), item.value());
    }
  }
}

void BorrowedWeights::before_step() {
  had_grad_.assign(others_.size(), false);
  for (size_t i = 0; i < others_.size(); ++i) had_grad_[i] = others_[i].second.grad().defined();
}

std::string BorrowedWeights::after_step() const {
  for (size_t i = 0; i < others_.size(); ++i) {
    if (had_grad_.at(i) || !others_[i].second.grad().defined()) continue;
    std::string stages;
    for (int s : local_stages_) stages += (stages.empty() ? "" : ", ") + std::to_string(s);
    return c10::str("pipeline: parameter '", others_[i].first, "' got a gradient on the pp rank of stage(s) ",
                stages, ", which do not hold it: one of them uses another stage's weight (a tie made in "
                "forward, e.g. F::linear(x, wte->weight)), and that gradient would never reach the stage "
                "that trains it. Register the shared tensor in the module that uses it too (e.g. "
                "register_parameter(\"weight\", wte->weight) in the head), so that the pipeline finds the tie "
                "and sums its gradient over the stages holding it.");
  }
  return "";
}

}  // namespace fsdp::pp
