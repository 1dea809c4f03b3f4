#include "optim/optimizer_kinds.h"

#include <algorithm>

namespace fsdp::optimizers {

const std::vector<OptimizerKind>& known_optimizers() {
  // Adam and AdamW keep the same state; only their weight decay differs.
  static const std::vector<StateTensor> adam_state{
      {"exp_avg", AddedBy::Always}, {"exp_avg_sq", AddedBy::Always}, {"max_exp_avg_sq", AddedBy::Amsgrad}};
  static const std::vector<OptimizerKind> known{
      {"SGD", false, false, {{"momentum_buffer", AddedBy::Momentum}}},
      {"Adam", true, false, adam_state},
      {"AdamW", true, false, adam_state},
      {"RMSprop", true, false,
       {{"square_avg", AddedBy::Always}, {"momentum_buffer", AddedBy::Momentum}, {"grad_avg", AddedBy::Centered}}},
      {"Adagrad", true, true, {{"sum", AddedBy::Always}}},
      {"Muon", false, false, {{"momentum_buffer", AddedBy::Always}}},
  };
  return known;
}

std::string known_optimizer_names() {
  const auto& known = known_optimizers();
  std::string names;
  for (size_t i = 0; i < known.size(); ++i) {
    if (i > 0) names += i + 1 == known.size() ? " and " : ", ";
    names += known[i].name;
  }
  return names;
}

const OptimizerKind* find_optimizer(std::string_view name) {
  for (const auto& optimizer : known_optimizers()) {
    if (name == optimizer.name) return &optimizer;
  }
  return nullptr;
}

bool has_option(const OptimizerKind& optimizer, AddedBy option) {
  return std::any_of(optimizer.tensors.begin(), optimizer.tensors.end(),
                     [&](const StateTensor& t) { return t.added_by == option; });
}

namespace {

bool kept_with(AddedBy added_by, const StateOptions& options) {
  switch (added_by) {
    case AddedBy::Always: return true;
    case AddedBy::Amsgrad: return options.amsgrad;
    case AddedBy::Momentum: return options.momentum;
    case AddedBy::Centered: return options.centered;
  }
  return false;
}

}  // namespace

std::vector<std::string> kinds_kept(const OptimizerKind& optimizer, const StateOptions& options) {
  std::vector<std::string> kinds;
  for (const auto& tensor : optimizer.tensors) {
    if (kept_with(tensor.added_by, options)) kinds.emplace_back(tensor.kind);
  }
  return kinds;
}

AddedBy option_adding(std::string_view kind) {
  for (const auto& optimizer : known_optimizers()) {
    for (const auto& tensor : optimizer.tensors) {
      if (kind == tensor.kind) return tensor.added_by;
    }
  }
  return AddedBy::Always;
}

int64_t state_bytes_per_element(const OptimizerKind& optimizer, const StateOptions& options, int64_t element_bytes) {
  return static_cast<int64_t>(kinds_kept(optimizer, options).size()) * element_bytes;
}

int64_t step_bytes_per_element(const OptimizerKind& optimizer, const StateOptions& options, int64_t element_bytes) {
  const auto state = static_cast<int64_t>(kinds_kept(optimizer, options).size());
  return (3 + 2 * state) * element_bytes;  // parameter read and written, gradient read; each state both
}

}  // namespace fsdp::optimizers
