// [Note: loss parallelism]
// The cross-entropy of logits sharded over the vocabulary (Megatron-LM's
// vocab_parallel_cross_entropy; PyTorch's loss_parallel): a [tokens, V] logits tensor never
// exists on any rank. Each row's maximum is gathered (one float per row and rank) so that every
// rank shifts by the same value; the sums of exp(shifted) and the target's shifted logit (held by
// the one rank whose chunk has the target) are summed over the group, one all-reduce of two
// floats per row. loss = mean(log(sum exp) - target logit). Backward needs no communication:
// each rank's gradient is its chunk of softmax - one-hot, which it already holds.
#include <fsdp/tensor_parallel.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

namespace fsdp::tp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local_logits,
                            const at::Tensor& targets, TensorParallel* tp) {
    const int64_t vocab_chunk = local_logits.size(-1);
    const at::Tensor logits = local_logits.reshape({-1, vocab_chunk}).to(at::kFloat);
    const at::Tensor rows_targets = targets.reshape({-1});
    TORCH_CHECK(rows_targets.size(0) == logits.size(0), "cross_entropy: ", logits.size(0),
                " rows of logits for ", rows_targets.size(0), " targets");
    // The maximum over the whole vocabulary: every rank shifts its chunk by the same value.
    const at::Tensor row_max = tp->all_gather_along(std::get<0>(logits.max(-1)).unsqueeze(0), 0)
                                   .amax(0);
    const at::Tensor shifted = logits - row_max.unsqueeze(1);
    const int64_t first = tp->rank() * vocab_chunk;
    const at::Tensor here = (rows_targets >= first) & (rows_targets < first + vocab_chunk);
    const at::Tensor local_targets = at::where(here, rows_targets - first, at::zeros_like(rows_targets));
    const at::Tensor exp = shifted.exp();
    at::Tensor stats = at::stack({exp.sum(-1),
                                  shifted.gather(1, local_targets.unsqueeze(1)).squeeze(1) * here})
                           .contiguous();
    tp->all_reduce_(stats);
    const at::Tensor sum_exp = stats[0], target_logit = stats[1];
    ctx->save_for_backward({exp / sum_exp.unsqueeze(1), local_targets, here});
    ctx->saved_data["dtype"] = static_cast<int64_t>(local_logits.scalar_type());
    ctx->saved_data["shape"] = local_logits.sizes().vec();
    return (sum_exp.log() - target_logit).mean();
  }

  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& local_targets = saved[1];
    const at::Tensor& here = saved[2];
    at::Tensor grad = softmax.clone();
    grad.scatter_add_(1, local_targets.unsqueeze(1), -here.to(grad.scalar_type()).unsqueeze(1));
    grad.mul_(g[0] / static_cast<double>(softmax.size(0)));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype).view(ctx->saved_data["shape"].toIntVector()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor TensorParallel::cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets) {
  TORCH_CHECK(local_logits.dim() >= 1 && local_logits.size(-1) > 0,
              "cross_entropy: the logits need a vocabulary dimension");
  return VocabParallelCrossEntropy::apply(local_logits, targets, this);
}

}  // namespace fsdp::tp
