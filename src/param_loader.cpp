#include <fsdp/param_loader.h>

#include "fsdp_state.h"

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

ParamShapes param_shapes(FsdpState& state) {
  ParamShapes shapes;
  for (auto& group : state.groups()) {
    for (const auto& e : group->flat().entries()) shapes.emplace_back(e.name, e.shape);
  }
  return shapes;
}

ParamShapes param_shapes(torch::nn::Module& module) {
  ParamShapes shapes;
  for (const auto& item : module.named_parameters()) {
    shapes.emplace_back(item.key(), item.value().sizes().vec());
  }
  return shapes;
}

void load_params_from(FsdpState& state, const ParamRangeReader& read) {
  torch::NoGradGuard no_grad;
  const int rank = state.collectives().rank();  // within the shard group
  for (auto& group : state.groups()) {
    FlatParam& flat = group->flat();
    const int64_t shard_offset = rank * flat.shard_numel();  // in the unsharded flat buffer
    for (const auto& e : flat.entries()) {
      const int64_t length = e.shard_end - e.shard_begin;
      if (length == 0) continue;
      const int64_t begin = shard_offset + e.shard_begin - e.offset;  // within the parameter
      flat.shard().narrow(0, e.shard_begin, length)
          .copy_(read_checked(read, e.name, begin, begin + length));
    }
  }
}

void load_params_from(torch::nn::Module& module, const ParamRangeReader& read) {
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    at::Tensor& param = item.value();
    param.copy_(read_checked(read, item.key(), 0, param.numel()).view(param.sizes()));
  }
}

}  // namespace fsdp::detail
