#pragma once
// Llama's RMSNorm, y = weight · x / sqrt(mean(x²) + eps) over the last dimension, as transformers'
// LlamaRMSNorm computes it ([Note: RMSNorm in one pass] in rms_norm.cpp).

#include <torch/torch.h>

namespace gpt {

/// In fp32: one autograd node that keeps x and one inverse RMS per row for backward (on the host
/// one pass forward, two backward). Other dtypes: transformers' formula op by op (in fp32, the
/// normalised x cast back to x's dtype before the weight multiplies it).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace gpt
