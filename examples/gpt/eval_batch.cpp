#include "eval_batch.h"

#include "token_file.h"

#include <limits>

namespace gpt {

EvalBatch EvalBatch::load(const std::string& path, int64_t vocab_size, int64_t seq) {
  const auto tokens = read_token_file(path, "--eval-tokens", vocab_size, std::numeric_limits<int64_t>::max(),
                                      seq + 1).to(torch::kLong);
  const int64_t rows = tokens.numel() / (seq + 1);
  const auto table = tokens.narrow(0, 0, rows * (seq + 1)).view({rows, seq + 1});
  return {table.narrow(1, 0, seq).contiguous(), table.narrow(1, 1, seq).contiguous()};
}

EvalResult evaluate(fsdp::Unit<GPT>& model, const EvalBatch& batch, const c10::Device& device) {
  torch::NoGradGuard no_grad;
  auto logits = model(batch.inputs.to(device));
  EvalResult result;
  result.loss = lm_loss(logits, batch.targets.to(device)).item<double>();
  result.logits = logits.to(torch::kCPU, torch::kFloat);
  return result;
}

}  // namespace gpt
