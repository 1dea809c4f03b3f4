#pragma once
// Parameters marked as a pipeline stage's, for the library calls that would silently see one
// stage as the whole model ([Note: calls that see one stage] in core/stage_marks.cpp).

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::detail {

/// One parameter of a stage: its name in the model and the stage's description ("stage 1 of 2").
struct StageMark {
  std::string name;
  std::string stage;
};

/// Marks `marks[i]` as what `params[i]` is, for as long as the returned token lives (the
/// Pipeline holds it).
std::shared_ptr<const void> mark_stage_parameters(const std::vector<at::Tensor>& params,
                                                  const std::vector<StageMark>& marks);
/// The mark of `param` while the pipeline that made it lives, else nothing.
std::optional<StageMark> stage_mark_of(const at::Tensor& param);

}  // namespace fsdp::detail
