#include "eval_batch.h"

#include "token_file.h"

#include <fsdp/tensor_file.h>

#include <cstdio>
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

void write_eval(const std::string& path, const EvalBatch& batch, const EvalResult& initial,
                const EvalResult& final) {
  std::printf("eval loss: initial %.8f final %.8f\n", initial.loss, final.loss);
  std::fflush(stdout);
  if (path.empty()) return;
  fsdp::save_tensor_dict(path, {{"inputs", batch.inputs},
                                {"targets", batch.targets},
                                {"loss_initial", torch::tensor(initial.loss, torch::kDouble)},
                                {"logits_initial", initial.logits},
                                {"loss_final", torch::tensor(final.loss, torch::kDouble)},
                                {"logits_final", final.logits}});
}

}  // namespace gpt
