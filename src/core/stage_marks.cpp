// Parameters marked as a pipeline stage's.
#include "core/stage_marks.h"

#include <c10/util/intrusive_ptr.h>

#include <mutex>
#include <unordered_map>

namespace fsdp::detail {

// [Note: calls that see one stage]
// On a pp rank a stage's parameters look like a whole model's (a sharded stage is a ShardedModel
// of its own), so a call that reduces over the model, fsdp::clip_grad_norm_ above all, would
// compute this stage's norm alone and clip each pp rank by its own, silently. A Pipeline of
// several stages therefore marks its stages' parameters while it lives; such calls look the
// parameters up and refuse by name, pointing to the pipeline's own (fsdp::pp::clip_grad_norm_).
// A mark holds the parameter weakly (its address cannot be reused by another tensor while the
// mark is kept) and ends with the Pipeline's token.
namespace {

struct MarkEntry {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> param;
  std::weak_ptr<const void> pipeline;
  StageMark mark;
};

struct MarkTable {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, MarkEntry> entries;
};

MarkTable& mark_table() {
  static MarkTable instance;
  return instance;
}

bool mark_expired(const MarkEntry& e) { return e.param.expired() || e.pipeline.expired(); }

}  // namespace

std::shared_ptr<const void> mark_stage_parameters(const std::vector<at::Tensor>& params,
                                                  const std::vector<StageMark>& stage_marks) {
  auto token = std::make_shared<int>(0);
  std::lock_guard<std::mutex> lock(mark_table().mutex);
  auto& entries = mark_table().entries;
  for (auto it = entries.begin(); it != entries.end();) it = mark_expired(it->second) ? entries.erase(it) : std::next(it);
  for (size_t i = 0; i < params.size(); ++i) {
    MarkEntry entry{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(params[i].getIntrusivePtr()),
                token, stage_marks[i]};
    entries.insert_or_assign(params[i].unsafeGetTensorImpl(), std::move(entry));
  }
  return token;
}

std::optional<StageMark> stage_mark_of(const at::Tensor& param) {
  if (!param.defined()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mark_table().mutex);
  const auto it = mark_table().entries.find(param.unsafeGetTensorImpl());
  if (it == mark_table().entries.end() || mark_expired(it->second)) return std::nullopt;
  return it->second.mark;
}

}  // namespace fsdp::detail
