// Whether two tensors of safetensors files hold the same values, as transformers' torch.equal
// decides it when it meets a tied head stored with its own values or a tensor stored twice.
#include "hf_folder.h"

#include <algorithm>

namespace gpt::hf {

bool same_values(const fsdp::SafetensorsReader& a, const std::string& a_name,
                 const fsdp::SafetensorsReader& b, const std::string& b_name) {
  const auto& first = a.entry(a_name);
  if (first.shape != b.entry(b_name).shape) return false;
  // Compared a piece at a time: an embedding of a large vocabulary never sits whole in memory.
  constexpr int64_t kPiece = int64_t{1} << 22;
  for (int64_t begin = 0; begin < first.numel(); begin += kPiece) {
    const int64_t end = std::min(first.numel(), begin + kPiece);
    // In fp32, exact for every 16-bit dtype: values compare, not their encodings.
    if (!at::equal(a.read_range(a_name, begin, end).to(at::kFloat),
                   b.read_range(b_name, begin, end).to(at::kFloat))) {
      return false;
    }
  }
  return true;
}

}  // namespace gpt::hf
