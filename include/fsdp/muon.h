#pragma once
/// Muon (orthogonalized momentum) for sharded models, exact: each hidden matrix is orthogonalized
/// whole, on the one rank of its shard group that owns it, with torch.optim.Muon's arithmetic.
///
/// Under FSDP a parameter is a 1-D piece of a flat shard, and an optimizer that needs a matrix's
/// whole value cannot step pieces (the FSDP paper, section 7.2.1; PyTorch's FSDP2 with
/// torch.optim.Muon orthogonalizes each rank's rows and trains, silently, on other weights).
/// fsdp::optim::Muon keeps each matrix's momentum sharded like any optimizer state and moves
/// only the update: every rank sends its piece of a matrix's (Nesterov) momentum to the matrix's
/// owner, the owner runs the Newton-Schulz iteration on the whole matrix and sends each rank its
/// piece of the orthogonalized update back (two all-to-alls over the shard group; comm_stats
/// counts them in all_to_all_bytes). Owners are chosen once, balancing the iteration's flops over
/// the shard group ([Note: Muon's owners] in src/optim/muon_owners.h). A parameter outside every
/// sharded model is stepped whole, here, as torch.optim.Muon steps it.
///
/// Given the same gradients its parameters equal torch.optim.Muon's bit for bit (fp32
/// parameters): the element-wise steps (momentum lerp, Nesterov, weight decay, the update) run on
/// each rank's pieces, the iteration on the whole matrix, in bf16, with torch's transposes and
/// addmm calls.
///
/// Example (Keller Jordan's recipe: Muon for the hidden matrices, AdamW for the rest):
///   auto split = fsdp::optim::split_for_muon(*model);
///   fsdp::optim::Muon muon(split.matrices, fsdp::optim::MuonOptions(0.02));
///   fsdp::optim::AdamW adamw(split.others, torch::optim::AdamWOptions(3e-4));
///   ... loss.backward(); muon.step(); adamw.step();

#include <fsdp/steps_in_backward.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace fsdp::optim {

/// (a, b, c) of the quintic Newton-Schulz polynomial; torch's defaults are Keller Jordan's.
using NsCoefficients = std::tuple<double, double, double>;
inline NsCoefficients default_ns_coefficients() { return {3.4445, -4.7750, 2.0315}; }

/// torch.optim.Muon's options, with its defaults.
struct MuonOptions : public torch::optim::OptimizerCloneableOptions<MuonOptions> {
  MuonOptions(double lr = 1e-3);
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(double, weight_decay) = 0.1;
  TORCH_ARG(double, momentum) = 0.95;
  TORCH_ARG(bool, nesterov) = true;
  TORCH_ARG(NsCoefficients, ns_coefficients) = default_ns_coefficients();
  TORCH_ARG(double, eps) = 1e-7;
  TORCH_ARG(int64_t, ns_steps) = 5;
  /// "original" (lr x sqrt(max(1, rows / cols)), Keller Jordan's) or "match_rms_adamw"
  /// (lr x 0.2 sqrt(max(rows, cols)), Moonshot's).
  TORCH_ARG(std::string, adjust_lr_fn) = "original";

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const MuonOptions& lhs, const MuonOptions& rhs);
  double get_lr() const override;
  void set_lr(double lr) override;
  /// Throws naming the option out of its range (Muon's constructor and a checkpoint's load call it).
  void validate() const;
};

/// What Muon keeps per parameter: torch.optim.Muon's "momentum_buffer", in the parameter's shape
/// (a sharded parameter's: its 1-D piece).
struct MuonParamState : public torch::optim::OptimizerCloneableParamState<MuonParamState> {
  TORCH_ARG(torch::Tensor, momentum_buffer);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const MuonParamState& lhs, const MuonParamState& rhs);
};

/// The Newton-Schulz work of this rank's last step(): what bench/ reports of the balance.
struct MuonWork {
  int64_t matrices = 0;  ///< orthogonalized here
  double flops = 0;      ///< of their iterations
  std::vector<std::string> names;  ///< of those matrices ("#i" for a parameter outside a sharded model)
  /// The highest bytes alive in the exchanges and iterations of a sharded model's matrices, and
  /// when: what the planner plans (src/optim/muon_phases.h, [Note: Muon's step in phases]).
  int64_t workspace_bytes = 0;
  std::string workspace_at;
};

class Muon : public torch::optim::Optimizer, public StepsInBackward {
 public:
  /// Every parameter must be 2-D (for a sharded parameter: its original shape); any other is
  /// refused by name at the first step (by index here, where names are not known yet).
  Muon(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, MuonOptions defaults = {});
  explicit Muon(std::vector<at::Tensor> params, MuonOptions defaults = {});
  ~Muon() override;

  /// Waits for the steps queued by StepInBackward (rethrowing the first failure), then steps every
  /// parameter with a gradient that none of them stepped. Every rank of a shard group calls it
  /// (it runs collectives), with gradients on the same parameters.
  torch::Tensor step(LossClosure closure = nullptr) override;
  void step_parameters(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) override;

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// This rank's Newton-Schulz work in the last step() (queued steps included).
  const MuonWork& last_step_work() const { return last_work_; }

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  MuonWork last_work_;
  MuonWork work_;  // accumulating since the last step()
};

/// The modules split_for_muon takes for output heads besides "head" and any whose name ends in
/// "_head" (lm_head, out_head, value_head).
inline std::vector<std::string> default_head_names() { return {"lm_head", "head", "output"}; }

/// Keller Jordan's rule, the one split_for_muon and the planner both read: whether Muon steps the
/// trainable parameter at `path` ("h.0.mlp.c_fc.weight") of `shape` (its whole, original shape),
/// `embedding_module` when its module is a torch::nn::Embedding. A hidden matrix: 2-D, not an
/// embedding's (that module's, or a path holding "embed"), not an output head's (its module's
/// name is "head", ends in "_head" or is one of `head_names`).
bool is_hidden_matrix(const std::string& path, const std::vector<int64_t>& shape, bool embedding_module,
                      const std::vector<std::string>& head_names = default_head_names());

/// A model's parameters split as torch's docs and Keller Jordan's recipe split them: `matrices`,
/// the hidden matrices (is_hidden_matrix, by their original shape when sharded) for Muon;
/// `others` (embeddings, the output head, norms, biases, anything not 2-D) for AdamW. Parameters
/// shared between modules (a tied head) are listed once, by their first name. Frozen parameters
/// are left out of both.
struct MuonSplit {
  std::vector<at::Tensor> matrices, others;
  std::vector<std::string> matrix_names, other_names;
};
MuonSplit split_for_muon(const torch::nn::Module& model,
                         const std::vector<std::string>& head_names = default_head_names());

}  // namespace fsdp::optim
