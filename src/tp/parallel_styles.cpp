#include "tp/parallel_styles.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/embedding.h>
#include <torch/nn/functional/linear.h>

namespace fsdp::tp::detail {

namespace {

thread_local int prepared_depth = 0;

// The one thread's count of the prepared modules it is inside.
struct PreparedScope {
  PreparedScope() { ++prepared_depth; }
  ~PreparedScope() { --prepared_depth; }
};

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
}

class ColwiseLayer : public StyledLayer {
 public:
  ColwiseLayer(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module, std::string name,
               const ColwiseParallel& style, bool prepared)
      : StyledLayer(std::move(tp), module, std::move(name)), style_(style), prepared_(prepared) {}

  at::Tensor run(const at::Tensor& input, const std::function<at::Tensor(const at::Tensor&)>&) override {
    mark_ran();
    const at::Tensor y = linear(prepare(input), param("weight"), param("bias"));
    return style_.output_layout() == Layout::Replicate ? tp_->gather_last(y) : y;
  }

 private:
  at::Tensor prepare(const at::Tensor& x) {
    if (prepared_) {
      TORCH_CHECK(inside_prepared_module(), "tensor parallelism: '", name_, "' is column-wise "
                  "on the input its parent's PrepareModuleInput gathers, but it ran outside that "
                  "parent's call: hold the parent as fsdp::tp::Parallel<...> and call it through "
                  "the holder (its communication would be skipped)");
      return x;  // the gather's backward sums the gradient over the ranks, once
    }
    if (style_.input_layout() == Layout::ShardSequence) return tp_->gather_sequence(x);
    return tp_->copy_to(x);
  }

  ColwiseParallel style_;
  bool prepared_;
};

class RowwiseLinearLayer : public StyledLayer {
 public:
  RowwiseLinearLayer(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module, std::string name,
                     const RowwiseParallel& style)
      : StyledLayer(std::move(tp), module, std::move(name)), style_(style) {}

  at::Tensor run(const at::Tensor& input, const std::function<at::Tensor(const at::Tensor&)>&) override {
    mark_ran();
    const at::Tensor partial = at::linear(input, param("weight"));
    const at::Tensor y = style_.output_layout() == Layout::ShardSequence
                             ? tp_->reduce_scatter_sequence(partial)
                             : tp_->reduce(partial);
    const at::Tensor bias = param("bias");
    return bias.defined() ? y + bias : y;  // once, after the sum
  }

 private:
  RowwiseParallel style_;
};

class VocabParallelEmbedding : public StyledLayer {
 public:
  VocabParallelEmbedding(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module, std::string name,
                         const RowwiseParallel& style, int64_t vocab_size)
      : StyledLayer(std::move(tp), module, std::move(name)), style_(style), vocab_size_(vocab_size) {}

  at::Tensor run(const at::Tensor& ids, const std::function<at::Tensor(const at::Tensor&)>&) override {
    mark_ran();
    const at::Tensor weight = param("weight");
    const int64_t rows = weight.size(0), first = tp_->rank() * rows;
    TORCH_CHECK(ids.numel() == 0 || (ids.min().item<int64_t>() >= 0 && ids.max().item<int64_t>() < vocab_size_),
                "'", name_, "': an id is outside the vocabulary of ", vocab_size_);
    const at::Tensor here = (ids >= first) & (ids < first + rows);
    const at::Tensor local_ids = at::where(here, ids - first, at::zeros_like(ids));
    const at::Tensor partial = at::embedding(weight, local_ids) * here.unsqueeze(-1).to(weight.scalar_type());
    return style_.output_layout() == Layout::ShardSequence ? tp_->reduce_scatter_sequence(partial)
                                                            : tp_->reduce(partial);
  }

 private:
  RowwiseParallel style_;
  int64_t vocab_size_;
};

class SequenceParallelLayer : public StyledLayer {
 public:
  using StyledLayer::StyledLayer;
  // Runs on the sequence shard as it is; the parameters' gradients are summed by their hooks.
  at::Tensor run(const at::Tensor& input, const std::function<at::Tensor(const at::Tensor&)>& forward) override {
    mark_ran();
    return forward(input);
  }
};

class PreparedInputLayer : public StyledLayer {
 public:
  PreparedInputLayer(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module, std::string name,
                     const PrepareModuleInput& style)
      : StyledLayer(std::move(tp), module, std::move(name)), style_(style) {}

  at::Tensor run(const at::Tensor& input, const std::function<at::Tensor(const at::Tensor&)>& forward) override {
    mark_ran();
    if (style_.desired_input_layout() == Layout::Replicate) {
      const at::Tensor whole = tp_->gather_sequence(input);
      PreparedScope scope;
      return forward(whole);
    }
    return forward(tp_->sequence_chunk(input));
  }

 private:
  PrepareModuleInput style_;
};

}  // namespace

at::Tensor StyledLayer::param(const char* which) const {
  const auto params = module_->named_parameters(/*recurse=*/false);
  const at::Tensor* found = params.find(which);
  if (!found) return at::Tensor();
  // A part replaced by a whole tensor (torch::load of an unsplit model, `p.set_data(whole)`)
  // would compute every rank's share and sum it T times.
  const auto kept = kept_shapes_.find(which);
  TORCH_CHECK(kept == kept_shapes_.end() || found->sizes() == kept->second, "tensor parallelism: '",
              name_, ".", which, "' is ", found->sizes(), " but this rank's part of it is ", kept->second,
              ": it was replaced by another tensor (torch::load of an unsplit model?). Load whole "
              "parameters before parallelize_module, inside fsdp::SummonFullParams of the sharded "
              "model, or a checkpoint of the split model. (Inside fsdp::SummonFullParams a "
              "tensor-parallel model shows whole parameters, to save, load or inspect: run it "
              "outside the scope, on every rank)");
  return *found;
}

std::optional<Placement> StyledLayer::placement_of(const at::Tensor& param) const {
  const auto own = module_->named_parameters(/*recurse=*/false);
  for (const auto& [which, placement] : placements_) {
    const at::Tensor* mine = own.find(which);
    if (mine && mine->unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return placement;
  }
  return std::nullopt;
}

void StyledLayer::keep_shapes() {
  for (const auto& item : module_->named_parameters(/*recurse=*/false)) {
    kept_shapes_[item.key()] = item.value().sizes().vec();
  }
}

bool inside_prepared_module() { return prepared_depth > 0; }

const char* to_string(Layout layout) {
  switch (layout) {
    case Layout::Replicate:
      return "Replicate";
    case Layout::ShardSequence:
      return "ShardSequence";
    case Layout::ShardLast:
      return "ShardLast";
  }
  return "?";
}

std::unique_ptr<StyledLayer> make_colwise(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module,
                                          std::string name, const ColwiseParallel& style, bool prepared) {
  return std::make_unique<ColwiseLayer>(std::move(tp), module, std::move(name), style, prepared);
}

std::unique_ptr<StyledLayer> make_rowwise_linear(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module,
                                                 std::string name, const RowwiseParallel& style) {
  return std::make_unique<RowwiseLinearLayer>(std::move(tp), module, std::move(name), style);
}

std::unique_ptr<StyledLayer> make_vocab_parallel_embedding(std::shared_ptr<TensorParallel> tp,
                                                           torch::nn::Module& module, std::string name,
                                                           const RowwiseParallel& style, int64_t vocab_size) {
  return std::make_unique<VocabParallelEmbedding>(std::move(tp), module, std::move(name), style, vocab_size);
}

std::unique_ptr<StyledLayer> make_sequence_parallel(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module,
                                                    std::string name) {
  return std::make_unique<SequenceParallelLayer>(std::move(tp), module, std::move(name));
}

std::unique_ptr<StyledLayer> make_prepared_input(std::shared_ptr<TensorParallel> tp, torch::nn::Module& module,
                                                 std::string name, const PrepareModuleInput& style) {
  return std::make_unique<PreparedInputLayer>(std::move(tp), module, std::move(name), style);
}

}  // namespace fsdp::tp::detail
