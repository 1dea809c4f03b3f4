#pragma once
/// Tensor parallelism's communication (Megatron-LM's operators, PyTorch's DTensor
/// redistributions): each is an autograd function over the ranks of one tensor-parallel group,
/// whose backward is the matching collective, and each counts its bytes in
/// comm_stats().tp_* (docs/tensor-parallel.md has their formulas). parallelize.h builds the
/// layers on them; a model calls them itself where its own code needs one (a tied head, the loss).
///
/// Example (the loss over vocabulary-sharded logits, never gathered):
///   auto tp = std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp"));
///   auto local_logits = head(tp->gather_sequence(x));       // [B, T, V / tp]
///   auto loss = tp->cross_entropy(local_logits, targets);    // the same value on every tp rank

#include <fsdp/distributed.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <unordered_map>
#include <memory>
#include <mutex>

namespace fsdp {

class Collectives;
class DeviceRuntime;

namespace tp {

class TensorParallel {
 public:
  explicit TensorParallel(std::shared_ptr<ProcessGroup> group);
  ~TensorParallel();

  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  ProcessGroup& group() const { return *group_; }

  /// Identity; backward all-reduces the gradient (a replicated input to column-wise layers).
  at::Tensor copy_to(const at::Tensor& x);
  /// All-reduce (sum); backward is the identity (a row-wise layer's partial output).
  at::Tensor reduce(const at::Tensor& x);
  /// All-gather of the ranks' chunks along `dim` (the sequence); backward reduce-scatters.
  at::Tensor gather_sequence(const at::Tensor& x, int64_t dim = 1);
  /// Reduce-scatter along `dim`: the sum, this rank's chunk of it; backward all-gathers.
  at::Tensor reduce_scatter_sequence(const at::Tensor& x, int64_t dim = 1);
  /// This rank's chunk along `dim` of a replicated tensor (no communication); backward
  /// all-gathers the chunks' gradients.
  at::Tensor sequence_chunk(const at::Tensor& x, int64_t dim = 1);
  /// All-gather along the last dimension (a column-wise output made whole); backward keeps this
  /// rank's chunk of the (replicated) gradient.
  at::Tensor gather_last(const at::Tensor& x);
  /// Loss parallelism: the mean cross-entropy of `local_logits` ([..., V / size], this rank's
  /// vocabulary chunk, rank r holding classes [r·V/size, (r+1)·V/size)) against `targets`
  /// (class ids < V, the same on every rank), computed in fp32 without gathering the logits:
  /// each row's maximum and its sums cross the group, not the vocabulary. The same value on
  /// every rank; its gradient is each rank's chunk of softmax - one-hot.
  at::Tensor cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets);

  // The collectives themselves, without autograd (the functions above and their backwards).
  void all_reduce_(const at::Tensor& t);
  at::Tensor all_gather_along(const at::Tensor& x, int64_t dim);
  at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim);
  at::Tensor chunk_along(const at::Tensor& x, int64_t dim) const;

 private:
  Collectives& collectives_for(const at::Tensor& t);

  std::shared_ptr<ProcessGroup> group_;
  std::mutex mutex_;  // the collectives made per device
  std::unordered_map<c10::Device, std::pair<std::unique_ptr<DeviceRuntime>, std::unique_ptr<Collectives>>> by_device_;
};

}  // namespace tp
}  // namespace fsdp
