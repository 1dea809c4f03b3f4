#pragma once
// The options of a torch::optim param group (lr, betas, momentum...) as a checkpoint holds them:
// JSON under the names PyTorch's optimizers give them, every option of the class, so that a
// resumed run continues with the values the saved run had reached (an lr schedule's), exactly
// as torch::load of a torch::save'd optimizer does.

#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>

namespace fsdp::detail {

/// Every option of `options` (of SGD, Adam, AdamW, RMSprop, Adagrad or Muon) as JSON:
/// {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-08, "weight_decay": 0.01, "amsgrad": false}.
nlohmann::json options_to_json(const torch::optim::OptimizerOptions& options);

/// A copy of `like` (the class the program built) holding every value of `saved`; throws naming
/// `source` and the option when one is missing or of another type.
std::unique_ptr<torch::optim::OptimizerOptions> options_from_json(
    const torch::optim::OptimizerOptions& like, const nlohmann::json& saved, const std::string& source);

}  // namespace fsdp::detail
