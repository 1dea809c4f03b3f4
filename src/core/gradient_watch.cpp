#include "core/gradient_watch.h"

#include "comm/collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <array>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace fsdp {

// [Note: gradients scaled by each rank alone]
// LibTorch's torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm) on a sharded (or
// tensor-parallel) model sees only this rank's pieces: it takes their norm and scales them by
// max_norm / norm, a different factor on every rank (0.71 and 0.34 where the true factor is
// 0.59), and the step trains a model no single program trains. Nothing in LibTorch marks the
// call (it writes through .data(), no version bump, no hook) and nothing runs between it and
// the optimizer's step, so the watch compares values: at the end of a backward it keeps a few
// elements of each gradient shard (up to kSamples, evenly spaced); at the next forward, before
// a shard's bytes are released, it reads them again. Scaling every element by one factor c
// gives c at each kept element: that rank's factor. The factors' sum and sum of squares over
// the ranks tell whether they differ. fsdp::clip_grad_norm_, a grad scaler's unscale, or a
// program's own `grad.mul_(s)` scale every rank alike and pass; clip_grad_value_ (elementwise,
// right under sharding) is no single factor and is not compared; where every rank holds the
// whole gradient (NO_SHARD, no tensor parallelism) LibTorch's clipping is right and nothing is
// compared (replicas of one shard hold equal gradients: the shard group is enough). The check costs
// two small all-reduces, so it runs after the first kFirstChecks backwards and every
// kCheckEvery-th after: clipping that starts later is seen at the next of those.

namespace {

constexpr int64_t kSamples = 16, kFirstChecks = 3, kCheckEvery = 100;

bool check_due(int64_t backward) { return backward <= kFirstChecks || backward % kCheckEvery == 0; }

// The kept elements of `shard`, on the host: up to kSamples, evenly spaced. Read in place on
// the host (no tensor allocated: the step's memory is exact); a GPU's are copied over, which
// waits for backward's kernels on the few steps that check.
std::vector<double> sampled(const at::Tensor& shard) {
  const int64_t n = shard.numel();
  const int64_t step = std::max<int64_t>(1, n / kSamples);
  at::Tensor picked = shard.slice(0, 0, n, step).narrow(0, 0, std::min(n, kSamples));
  if (!picked.is_cpu()) picked = picked.to(at::kCPU);
  std::vector<double> values;
  for (int64_t i = 0; i < picked.numel(); ++i) values.push_back(picked[i].item<double>());
  return values;
}

// Relative rounding of one multiplication in `dtype`, with room.
double tolerance(c10::ScalarType dtype) {
  const double eps = dtype == at::kBFloat16 ? 0x1p-8 : dtype == at::kHalf ? 0x1p-11 : 0x1p-24;
  return std::max(16 * eps, 1e-6);
}

// [1, c, c²] when every kept element was scaled by one factor c; [0, 0, 0] otherwise.
std::array<double, 3> factor_of(const std::vector<double>& was, const std::vector<double>& is, double tol) {
  double sum_was = 0, sum_is = 0;
  for (size_t i = 0; i < was.size() && i < is.size(); ++i) {
    if (was[i] == 0 || !std::isfinite(was[i]) || !std::isfinite(is[i])) continue;
    sum_was += std::abs(was[i]);
    sum_is += std::abs(is[i]);
  }
  if (sum_was == 0) return {0, 0, 0};
  const double c = sum_is / sum_was;
  for (size_t i = 0; i < was.size() && i < is.size(); ++i) {
    if (was[i] == 0 || !std::isfinite(was[i]) || !std::isfinite(is[i])) continue;
    if (std::abs(is[i] - c * was[i]) > tol * std::abs(c * was[i])) return {0, 0, 0};  // not one factor
  }
  return {1, c, c * c};
}

}  // namespace

void GradientWatch::record(const std::vector<WatchedBuffer>& buffers) {
  kept_.clear();
  if (warned_) return;
  bool any = false;
  for (const WatchedBuffer& b : buffers) any = any || b.flat->has_sharded_grads();
  if (!any || !check_due(++backwards_)) return;
  for (const WatchedBuffer& b : buffers) {
    const at::Tensor shard = b.flat->has_sharded_grads() ? b.flat->held_grad_shard() : at::Tensor();
    kept_.push_back(shard.defined() ? sampled(shard) : std::vector<double>());
  }
}

void GradientWatch::check(const std::vector<WatchedBuffer>& buffers, const std::vector<ProcessGroup*>& groups,
                          c10::Device device, bool prints) {
  if (kept_.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<std::array<double, 3>> mine(buffers.size(), {0, 0, 0});
  std::vector<double> tol(buffers.size(), tolerance(at::kFloat));
  for (size_t i = 0; i < buffers.size() && i < kept_.size(); ++i) {
    const at::Tensor shard = buffers[i].flat->held_grad_shard();
    if (kept_[i].empty() || !shard.defined()) continue;
    tol[i] = tolerance(shard.scalar_type());
    mine[i] = factor_of(kept_[i], sampled(shard), tol[i]);
  }
  kept_.clear();
  at::Tensor sums = at::empty({static_cast<int64_t>(mine.size()), 3}, at::kDouble);
  for (size_t i = 0; i < mine.size(); ++i) {
    for (int j = 0; j < 3; ++j) sums[static_cast<int64_t>(i)][j] = mine[i][static_cast<size_t>(j)];
  }
  sums = sums.to(device);
  {
    CheckCounting counting;  // on some steps only: apart from the per-step bytes
    for (ProcessGroup* group : groups) all_reduce_sum(*group, sums);
  }
  const at::Tensor all = sums.to(at::kCPU);
  for (size_t i = 0; i < mine.size(); ++i) {
    const double k = all[static_cast<int64_t>(i)][0].item<double>();
    if (k < 2) continue;
    const double mean = all[static_cast<int64_t>(i)][1].item<double>() / k;
    const double spread = std::sqrt(std::max(0.0, all[static_cast<int64_t>(i)][2].item<double>() / k - mean * mean));
    if (spread <= 4 * tol[i] * mean + 1e-12) continue;
    warned_ = true;
    if (prints) {
      std::ostringstream text;
      const std::string& unit = *buffers[i].unit;
      text << std::setprecision(3) << "fsdp: warning: after backward the gradients of "
           << (unit.empty() ? std::string("the root unit") : "unit '" + unit + "'")
           << " were scaled by a factor that differs across the ranks (" << mine[i][1] << " on this rank, " << mean << " on average over " << k << " ranks): LibTorch's torch::nn::utils::clip_grad_norm_ on a "
           "sharded or tensor-parallel model takes each rank's own norm (of its pieces) and clips by it, so the "
           "step trains no single model. Clip with fsdp::clip_grad_norm_(model->parameters(), max_norm): the "
           "norm over every rank and both dimensions\n";
      std::cerr << text.str();
    }
    return;
  }
}

}  // namespace fsdp
