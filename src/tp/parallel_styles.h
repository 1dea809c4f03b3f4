#pragma once
// The runtimes of parallelize.h's styles: what each parallelized layer runs when called through
// its fsdp::tp::Parallel holder. parallelize.cpp splits the parameters and installs them.

#include <fsdp/parallelize.h>

#include <ATen/core/grad_mode.h>

#include <atomic>
#include <map>
#include <vector>
#include <memory>
#include <optional>
#include <string>

namespace fsdp::tp::detail {

/// A layer's style plus what every style shares: the group, the layer's name, and whether its
/// holder ran it (a layer called around its holder would silently skip its communication).
class StyledLayer : public LayerStyle {
 public:
  StyledLayer(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module, std::string name)
      : tp_(std::move(tp)), module_(&module), name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  /// How many times its holder ran it under grad mode ([Note: a layer called around its holder]).
  int64_t grad_runs() const { return grad_runs_.load(std::memory_order_relaxed); }
  /// Records its parameters' shapes once they are this rank's parts: forward checks them.
  void keep_shapes();
  /// How each of its own parameters (by name: "weight", "bias") lies over the ranks.
  void set_placements(std::vector<std::pair<std::string, Placement>> placements) { placements_ = std::move(placements); }
  /// The placement of `param` if it is one of this layer's own parameters.
  std::optional<Placement> placement_of(const at::Tensor& param) const;

 protected:
  at::Tensor param(const char* which) const;
  void mark_ran() {
    if (at::GradMode::is_enabled()) grad_runs_.fetch_add(1, std::memory_order_relaxed);
  }

  std::shared_ptr<TensorParallel> tp_;
  torch::nn::Module* module_;  // the registry holds it weakly and drops the style with it
  std::string name_;
  std::atomic<int64_t> grad_runs_{0};
  std::map<std::string, std::vector<int64_t>> kept_shapes_;
  std::vector<std::pair<std::string, Placement>> placements_;
};

std::unique_ptr<StyledLayer> make_colwise(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module,
                                          std::string name, const ColwiseParallel& style,
                                          bool input_prepared_by_parent);
std::unique_ptr<StyledLayer> make_rowwise_linear(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module,
                                                 std::string name, const RowwiseParallel& style);
std::unique_ptr<StyledLayer> make_vocab_parallel_embedding(std::shared_ptr<TensorParallel> tp,
                                                           torch::nn::Module& module, std::string name,
                                                           const RowwiseParallel& style,
                                                           int64_t vocab_size);
std::unique_ptr<StyledLayer> make_sequence_parallel(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module,
                                                    std::string name);
std::unique_ptr<StyledLayer> make_prepared_input(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module,
                                                 std::string name, const PrepareModuleInput& style);

/// Whether this thread is inside a module whose PrepareModuleInput gathered its input.
bool inside_prepared_module();

const char* to_string(Layout layout);

}  // namespace fsdp::tp::detail
