#include "sample.h"

#include <algorithm>
#include <vector>

namespace gpt {

std::string generate(fsdp::Unit<GPT>& model, const c10::Device& device, const std::string& prompt,
                     int64_t n, int64_t max_seq, uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  // Bytes, not chars (a signed char above 127 would be a negative token). An empty prompt starts
  // from a newline, which the sample does not show.
  std::vector<int64_t> tokens;
  for (unsigned char byte : prompt) tokens.push_back(byte);
  const size_t hidden = tokens.empty() ? 1 : 0;
  if (tokens.empty()) tokens.push_back('\n');
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - max_seq);
    auto context = torch::tensor(std::vector<int64_t>(tokens.begin() + start, tokens.end()),
                                 torch::kLong).unsqueeze(0).to(device);
    auto logits = model(context).select(1, -1).squeeze(0) / 0.8;
    tokens.push_back(torch::multinomial(torch::softmax(logits, -1), 1).item<int64_t>());
  }
  return std::string(tokens.begin() + hidden, tokens.end());
}

}  // namespace gpt
