#pragma once
// A weight one stage uses without holding it (a tie made in forward: the head calling
// F::linear(x, wte->weight) on the last stage while wte is the first stage's): its gradient would
// land in this rank's copy of a tensor no local stage trains, and the holder would never see it.
// Nothing declares such a use, so the step looks for it: a tensor that no stage here holds and
// that gained a gradient during the step is refused by name ([Note: tied weights across stages]).

#include <fsdp/pipeline.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace fsdp::pp {

class BorrowedWeights {
 public:
  /// The model's parameters that none of `local_stages` holds (under any name).
  explicit BorrowedWeights(const std::vector<Stage>& local_stages);

  /// Notes which of them have no gradient yet.
  void before_step();
  /// The error naming the first of them that gained a gradient since before_step(); empty if none.
  std::string after_step() const;

 private:
  std::vector<std::pair<std::string, at::Tensor>> others_;
  std::vector<bool> had_grad_;
  std::vector<int> local_stages_;
};

}  // namespace fsdp::pp
