#include "nonfinite_guard.h"

#include <cmath>

namespace gpt {

bool parameters_finite(GPT& gpt, fsdp::Distributed* dist) {
  torch::NoGradGuard no_grad;
  auto bad = torch::zeros({1}, torch::kFloat64);
  for (const auto& p : gpt->parameters()) {
    if (p.numel() == 0) continue;
    // A NaN propagates into the minimum and the maximum, an inf becomes one of them: two values
    // to check instead of a boolean tensor of the parameter's size (1.3 GB at 1.3 B parameters).
    const auto [min, max] = torch::aminmax(p);
    if (!torch::isfinite(torch::stack({min, max})).all().item<bool>()) bad += 1;
  }
  if (dist) fsdp::all_reduce_sum(*dist->world, bad);
  return bad.item<double>() == 0;
}

void NonFiniteGuard::count(double loss, int64_t step) {
  const TrainOptions& o = options_;
  if (std::isfinite(loss)) {
    consecutive_ = 0;
  } else if (++consecutive_ >= o.max_nonfinite_steps) {
    TORCH_CHECK(false, "the loss was ", loss, " for ", consecutive_,
                " consecutive steps (last: step ", step + 1, "); stopping (--max-nonfinite-steps ",
                o.max_nonfinite_steps, "). Lower --lr, set --clip, or check --init-from; no "
                "checkpoint of the non-finite model was saved",
                o.save_every > 0 ? " (the last good one is in --checkpoint-dir)" : "");
  }
}

void NonFiniteGuard::check_finished(GPT& gpt, fsdp::Distributed* dist) const {
  // The parameters' check is a collective; every rank skips it alike (the loss is all-reduced).
  TORCH_CHECK(consecutive_ == 0 && parameters_finite(gpt, dist),
              "training ended with a non-finite ", consecutive_ > 0 ? "loss" : "model",
              " (NaN/inf); not writing ",
              options_.save_full.empty() ? "the model" : options_.save_full,
              ". Lower --lr, set --clip, or check --init-from");
}

}  // namespace gpt
