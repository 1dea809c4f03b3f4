#pragma once
// [Note: what an optimizer keeps, once]
// Each optimizer the library knows, as plain data: the state tensors it keeps per parameter (and
// the option that adds each), whether it counts steps, and from that the bytes it keeps and moves
// per parameter element. The checkpoints (io/optimizer_state.cpp) read their kinds from here, and
// the planner (plan/plan_optimizer.h) its optimizer state and step traffic: an optimizer added
// here is known to both, and one missing is an error in both, never a silent AdamW.
//
// Every state tensor has its parameter's shape and dtype (torch::optim makes each one with
// zeros_like / full_like / clone of the parameter or its gradient), so one parameter element
// keeps one element of each. fsdp::optim::AdamW and fsdp::optim::SGD (the fused kernels) derive
// from torch::optim's AdamW and SGD and keep the same state: they are those entries.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::optimizers {

/// The option of an optimizer that adds a state tensor (Always: none, it is always kept).
enum class AddedBy { Always, Amsgrad, Momentum, Centered };

/// The options that change what an optimizer keeps (amsgrad: Adam's and AdamW's; momentum:
/// SGD's and RMSprop's, nonzero; centered: RMSprop's).
struct StateOptions {
  bool amsgrad = false;
  bool momentum = false;
  bool centered = false;
};

/// One per-parameter state tensor, in the parameter's shape and dtype.
struct StateTensor {
  const char* kind;  ///< its name in checkpoints and state dicts: "exp_avg", "momentum_buffer", ...
  AddedBy added_by;
};

/// What one optimizer keeps.
struct OptimizerKind {
  const char* name;          ///< torch::optim's class ("AdamW"): what checkpoints record
  bool counts_steps;         ///< a step count per parameter ("step", an int64 scalar)
  bool state_from_start;     ///< builds every parameter's state at construction (Adagrad)
  std::vector<StateTensor> tensors;  ///< every kind it may keep, in a fixed order (the same on every rank)
};

/// Every optimizer known: SGD, Adam, AdamW, RMSprop, Adagrad, Muon.
const std::vector<OptimizerKind>& known_optimizers();
/// "SGD, Adam, AdamW, RMSprop and Adagrad": for error messages.
std::string known_optimizer_names();
/// The optimizer named `name`; nullptr when none is.
const OptimizerKind* find_optimizer(std::string_view name);

/// Whether `option` adds a state tensor to `optimizer` (an option it does not have adds none).
bool has_option(const OptimizerKind& optimizer, AddedBy option);
/// The kinds `optimizer` keeps with `options`, in that order.
std::vector<std::string> kinds_kept(const OptimizerKind& optimizer, const StateOptions& options);
/// The option that adds `kind` to whichever optimizer keeps it (Always for a kind no option adds,
/// or none knows).
AddedBy option_adding(std::string_view kind);

/// Bytes of state kept per parameter element of `element_bytes` (its dtype's size).
int64_t state_bytes_per_element(const OptimizerKind& optimizer, const StateOptions& options, int64_t element_bytes);
/// Bytes one step reads and writes per parameter element, in one pass (what a fused kernel moves):
/// the parameter, its gradient and each state tensor read, the parameter and each state tensor
/// written. LibTorch's loop of kernels per parameter moves more; that is left out.
int64_t step_bytes_per_element(const OptimizerKind& optimizer, const StateOptions& options, int64_t element_bytes);

}  // namespace fsdp::optimizers
