#include <fsdp/param_loader.h>

#include "core/sharded_view.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace fsdp::detail {

namespace {

// `read`'s answer for [begin, end) of `name`, checked, as a 1-D tensor.
at::Tensor read_checked(const ParamRangeReader& read, const std::string& name, int64_t begin,
                        int64_t end) {
  at::Tensor piece = read(name, begin, end);
  TORCH_CHECK(piece.defined() && piece.numel() == end - begin, "load_params_from: the reader gave ",
              piece.defined() ? piece.numel() : 0, " elements for '", name, "' [", begin, ", ",
              end, "), not ", end - begin);
  TORCH_CHECK(piece.is_floating_point(), "load_params_from: the reader gave a ", piece.dtype(),
              " tensor for '", name, "', not a floating-point one");
  return piece.reshape({-1});
}

}  // namespace

ParamShapes param_shapes(torch::nn::Module& module) {
  ParamShapes shapes;
  for (const auto& item : module.named_parameters()) {
    shapes.emplace_back(item.key(), item.value().sizes().vec());
  }
  return shapes;
}

void load_params_from(torch::nn::Module& module, const ParamRangeReader& read) {
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    at::Tensor& param = item.value();
    param.copy_(read_checked(read, item.key(), 0, param.numel()).view(param.sizes()));
  }
}

}  // namespace fsdp::detail

namespace fsdp {

ParamShapes param_shapes(const ShardedModel& model) {
  ParamShapes shapes;
  for (const auto& p : detail::ShardedView(model).params()) shapes.emplace_back(p.name(), p.shape());
  return shapes;
}

void load_params_from(const ShardedModel& model, const ParamRangeReader& read) {
  torch::NoGradGuard no_grad;
  for (const auto& p : detail::ShardedView(model).params()) {
    if (!p.empty()) p.data().copy_(detail::read_checked(read, p.name(), p.begin(), p.end()));
  }
}

}  // namespace fsdp
