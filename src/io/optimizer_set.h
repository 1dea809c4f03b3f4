#pragma once
// [Note: several optimizers, one checkpoint]
// A model may be stepped by several optimizers: Muon for its hidden matrices and AdamW for the
// rest (Keller Jordan's recipe). One checkpoint holds them all as torchtitan's
// OptimizersContainer does: the union of their per-parameter state, each tensor under the name
// torch.distributed.checkpoint gives it ("state.NAME.momentum_buffer", "state.NAME.exp_avg"), so
// that dcp.load reads it as it reads one optimizer's. metadata.json records, for each parameter,
// the class of the optimizer that held it ("optimizer": "Muon"), and every optimizer's param
// groups in the order the program passed the optimizers, each tagged with its class. Loading
// gives each parameter's state to the optimizer that holds the parameter now, which must be of
// the saved class: a Muon's momentum is not an AdamW's moments, so a parameter that changed
// optimizers is refused by name. Every parameter belongs to at most one optimizer (its state
// would otherwise be two states under one name). A checkpoint of one optimizer is this with a
// set of one, written as before (no per-parameter class: the file's "optimizer" is every
// parameter's).

#include "core/sharded_view.h"
#include "io/optimizer_state.h"

#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::detail {

/// Each optimizer's param groups' options, as loading stages them (outer: one per optimizer,
/// empty: none staged).
using StagedOptions = std::vector<std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>>;

/// "an AdamW", "a Muon": how messages name one optimizer of a class.
std::string a_class(const std::string& name);

/// The optimizers of one model as the checkpoints see them.
class OptimizerSet {
 public:
  /// Throws (`what`: the caller) unless there is at least one optimizer, none null or listed twice,
  /// each of a class whose state is known, and no parameter of `model` is in two of them.
  OptimizerSet(const std::vector<torch::optim::Optimizer*>& optimizers, const ShardedView& model,
               const std::string& what);

  size_t size() const { return states_.size(); }
  torch::optim::Optimizer& optimizer(size_t k) const { return *optimizers_.at(k); }
  const OptimizerState& state(size_t k) const { return states_.at(k); }

  /// Each optimizer's class, in order ("Muon", "AdamW").
  std::vector<std::string> names() const;
  /// The set as metadata.json's "optimizer" names it: "AdamW"; "Muon+AdamW" for several.
  std::string name() const;
  /// Every kind of state tensor some optimizer's groups may hold, in a fixed order (the same on
  /// every rank: the same collectives).
  std::vector<std::string> kinds_in_use() const;

  /// The index of the optimizer holding `param`; nullopt when none does.
  std::optional<size_t> holder(const at::Tensor& param) const;
  /// The kinds the group holding `param` keeps, with `options` (staged) in place of the groups'
  /// own when given; nullopt when no optimizer holds it.
  std::optional<std::vector<std::string>> kinds_needed(const at::Tensor& param,
                                                       const StagedOptions& options = {}) const;
  /// `param`'s state; nullopt when no optimizer holds state for it.
  std::optional<ParamOptimState> read(const at::Tensor& param) const;
  /// Replaces `param`'s state in the optimizer holding it (none: nothing to do).
  void write(const at::Tensor& param, const std::optional<ParamOptimState>& state);

 private:
  std::vector<torch::optim::Optimizer*> optimizers_;
  std::vector<OptimizerState> states_;
  std::map<const void*, size_t> holder_;  // parameter's TensorImpl -> optimizer
};

}  // namespace fsdp::detail
