#include "optim/newton_schulz.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace fsdp::optim::muon {

at::Tensor orthogonalize(const at::Tensor& update, const std::tuple<double, double, double>& ns_coefficients,
                         int64_t ns_steps, double eps) {
  TORCH_CHECK(ns_steps < 100, "Muon: ns_steps must be less than 100 (torch.optim.Muon's bound), got ", ns_steps);
  TORCH_CHECK(update.dim() == 2, "Muon: the update must be a 2-D matrix, got ", update.sizes());
  const auto [a, b, c] = ns_coefficients;
  const bool tall = update.size(0) > update.size(1);
  at::Tensor x = update.to(at::kBFloat16);
  if (tall) x = x.t();
  // torch's Tensor.norm() with no arguments is linalg.vector_norm(x, 2).
  x.div_(at::linalg_vector_norm(x, 2).clamp_min(eps));
  for (int64_t i = 0; i < ns_steps; ++i) {
    const at::Tensor gram = at::matmul(x, x.t());
    const at::Tensor gram_update = at::addmm(gram, gram, gram, /*beta=*/b, /*alpha=*/c);
    x = at::addmm(x, gram_update, x, /*beta=*/a);
  }
  return tall ? x.t() : x;
}

void check_adjust_lr_fn(const std::string& adjust_lr_fn) {
  TORCH_CHECK(adjust_lr_fn == "original" || adjust_lr_fn == "match_rms_adamw",
              "Muon: adjust_lr_fn '", adjust_lr_fn, "' is not supported; choose \"original\" "
              "(lr x sqrt(max(1, rows / cols))) or \"match_rms_adamw\" (lr x 0.2 sqrt(max(rows, cols)))");
}

double adjusted_lr(double lr, const std::string& adjust_lr_fn, const std::vector<int64_t>& shape) {
  const double rows = static_cast<double>(shape.at(0));
  const double cols = static_cast<double>(shape.at(1));
  if (adjust_lr_fn == "match_rms_adamw") return lr * (0.2 * std::sqrt(std::max(rows, cols)));
  check_adjust_lr_fn(adjust_lr_fn);
  return lr * std::sqrt(std::max(1.0, rows / cols));
}

double iteration_flops(const std::vector<int64_t>& shape, int64_t ns_steps) {
  const double m = static_cast<double>(std::min(shape.at(0), shape.at(1)));
  const double n = static_cast<double>(std::max(shape.at(0), shape.at(1)));
  return static_cast<double>(ns_steps) * (2 * m * m * n + 2 * m * m * m + 2 * m * m * n);
}

}  // namespace fsdp::optim::muon
