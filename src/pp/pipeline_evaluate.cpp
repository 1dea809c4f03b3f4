// A forward-only pass of a pipeline's stages: evaluation ([Note: a pipeline's evaluation]).
#include <fsdp/pipeline.h>

#include "pp/stage_messages.h"

#include <fsdp/distributed.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <vector>

namespace fsdp::pp {
namespace {

// [Note: a pipeline's evaluation]
// No backward follows, so no schedule's order is needed: each rank runs micro-batch by micro-batch
// and, within one, its stages in increasing index. Stage s of micro-batch m waits only on stage
// s-1 of m, which comes earlier in that order on whichever rank runs it, and sends do not block:
// every receive is eventually served, whatever the placement (loop or V). A sharded stage is
// gathered and held for every micro-batch, then freed: no gradient exists, so there is nothing to
// reduce. The last stage adds each micro-batch's summed loss; the mean over the batch's tokens
// travels to every rank in one all-reduce over the pp group.

std::vector<at::Tensor> evaluated_microbatches(const at::Tensor& batch, int microbatches, const char* what) {
  TORCH_CHECK(batch.defined() && batch.dim() >= 1 && batch.size(0) % microbatches == 0, "pipeline: evaluate's ",
              what, " (", batch.defined() ? batch.sizes().vec() : std::vector<int64_t>{},
              ") do not split along dim 0 into ", microbatches,
              " equal micro-batches; give a batch whose first size is a multiple of the micro-batch count");
  return batch.chunk(microbatches, 0);
}

c10::Device evaluation_device(const Stage& stage) {
  const auto params = stage.parameters();
  return params.empty() ? c10::Device(c10::kCPU) : params.front().device();
}

}  // namespace

double Pipeline::evaluate(const torch::Tensor& inputs, const torch::Tensor& targets, int microbatches) {
  TORCH_CHECK(microbatches >= 0, "pipeline: evaluate's micro-batches is ", microbatches,
              "; give a positive count, or 0 for the pipeline's");
  torch::NoGradGuard no_grad;
  if (microbatches == 0) microbatches = options_.microbatches();
  const bool has_first = stages_.front().is_first(), has_last = stages_.back().is_last();
  const std::vector<at::Tensor> input_mbs = has_first ? evaluated_microbatches(inputs, microbatches, "inputs")
                                                      : std::vector<at::Tensor>{};
  const std::vector<at::Tensor> target_mbs = has_last ? evaluated_microbatches(targets, microbatches, "targets")
                                                      : std::vector<at::Tensor>{};
  StageMessages messages(*pp_, rank_of_, microbatches);
  for (auto& sharding : shardings_) sharding->unshard();
  double loss_sum = 0;
  for (int m = 0; m < microbatches; ++m) {
    for (Stage& stage : stages_) {  // in increasing index
      const c10::Device device = evaluation_device(stage);
      at::Tensor x = stage.is_first() ? input_mbs.at(static_cast<size_t>(m)).to(device)
                                      : messages.recv_activation(stage.index(), m).to(device);
      at::Tensor y = stage.forward(x);
      if (!stage.is_last()) {
        messages.send_activation(stage.index(), m, y);
        continue;
      }
      at::Tensor summed = loss_sum_(y, target_mbs.at(static_cast<size_t>(m)).to(device));
      TORCH_CHECK(summed.numel() == 1, "pipeline: the loss function returned ", summed.sizes(),
                  "; it must return the micro-batch's loss summed over its tokens (one number)");
      loss_sum += summed.item<double>();
    }
  }
  messages.finish();
  for (auto& sharding : shardings_) sharding->reshard();
  at::Tensor mean = at::zeros({1}, at::kDouble);
  if (has_last) mean[0] = loss_sum / static_cast<double>(targets.numel());
  all_reduce_sum(*pp_, mean);
  return mean[0].item<double>();
}

}  // namespace fsdp::pp
