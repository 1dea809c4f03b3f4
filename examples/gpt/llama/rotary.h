#pragma once
// The rotary position embedding's rotation ([Note: the rotation in one pass] in rotary.cpp).

#include <torch/torch.h>

namespace gpt {

/// Rotates `x` ([B, heads, T, d]) by its positions 0..T-1: x·cos + rotate_half(x)·sin, where
/// rotate_half(x) = [-x₂, x₁] of x's two halves and cos, sin ([T, d]) repeat each frequency's angle
/// in both halves (transformers' apply_rotary_pos_emb). In fp32 on the host one pass each way,
/// bitwise the ops' results; otherwise op by op.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace gpt
