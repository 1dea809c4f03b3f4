#pragma once
// Muon's arithmetic on one whole matrix, as torch.optim.Muon (torch/optim/_muon.py) does it:
// the Newton-Schulz iteration and the learning-rate adjustment. Same operations in the same
// order (bf16 cast, transpose when the matrix is taller than wide, Frobenius normalisation,
// mm and addmm with the same beta and alpha), so the same input gives the same bits.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace fsdp::optim::muon {

/// The orthogonalized `update` (2-D), in bf16: `ns_steps` quintic Newton-Schulz iterations with
/// coefficients (a, b, c) after normalising by max(Frobenius norm, eps).
at::Tensor orthogonalize(const at::Tensor& update, const std::tuple<double, double, double>& ns_coefficients,
                         int64_t ns_steps, double eps);

/// lr scaled for a matrix of `shape` (rows, cols) by `adjust_lr_fn`: "original" (sqrt(max(1,
/// rows / cols))) or "match_rms_adamw" (0.2 sqrt(max(rows, cols))).
double adjusted_lr(double lr, const std::string& adjust_lr_fn, const std::vector<int64_t>& shape);

/// Throws naming the choices when `adjust_lr_fn` is neither.
void check_adjust_lr_fn(const std::string& adjust_lr_fn);

/// The multiply-adds of orthogonalize on a rows x cols matrix, times two (flops): per iteration
/// the gram matrix (m x n times its transpose), its square and the product with the iterate, m
/// and n the smaller and larger dimension.
double iteration_flops(const std::vector<int64_t>& shape, int64_t ns_steps);

}  // namespace fsdp::optim::muon
