#pragma once
// What checkpoints read and write of a torch::optim optimizer: each parameter's step (where the
// optimizer counts them) and state tensors (AdamW's exp_avg, SGD's momentum_buffer, ...), by the
// names torch.distributed.checkpoint gives them. The optimizers whose state is known, and what
// each keeps: optim/optimizer_kinds.h's (SGD, Adam, AdamW, RMSprop, Adagrad, and fsdp::optim's,
// which derive from them); here, how to read and write each one's state.

#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::detail {

/// One parameter's optimizer state.
struct ParamOptimState {
  std::optional<int64_t> step;               // empty: the optimizer counts no steps (SGD)
  std::map<std::string, at::Tensor> tensors;  // kind ("exp_avg", ...) -> in the parameter's shape
};

struct OptimizerFamily;

/// A torch::optim optimizer seen as the checkpoints see it.
class OptimizerState {
 public:
  /// Throws, naming the optimizer's class and `what` (the caller), unless its state is known.
  OptimizerState(torch::optim::Optimizer& optimizer, const std::string& what);

  /// "AdamW", "SGD", ...: what metadata.json records as "optimizer".
  std::string name() const;
  /// Every kind of state tensor that some parameter group may hold, in a fixed order (the same
  /// on every rank: the same collectives).
  std::vector<std::string> kinds_in_use() const;
  /// The kinds the group holding `param` keeps (amsgrad adds max_exp_avg_sq; SGD without
  /// momentum keeps none); nullopt when no group holds `param`.
  std::optional<std::vector<std::string>> kinds_needed(const at::Tensor& param) const;
  /// The same with `options` (one per group, as loading stages them) in place of the groups' own.
  std::optional<std::vector<std::string>> kinds_needed(
      const at::Tensor& param, const std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>& options) const;
  /// Whether the optimizer counts steps (a "step" per parameter).
  bool counts_steps() const;

  /// `param`'s state; nullopt when the optimizer holds none for it (never stepped).
  std::optional<ParamOptimState> read(const at::Tensor& param) const;
  /// Replaces `param`'s state (tensors in the parameter's shape); nullopt erases it.
  void write(const at::Tensor& param, const std::optional<ParamOptimState>& state);

 private:
  torch::optim::Optimizer* optimizer_;
  const OptimizerFamily* family_;
};

}  // namespace fsdp::detail
