#pragma once
/// Tensors with their names, in order: a model's parameters ("h.0.attn.c_attn.weight"), a state
/// dict, the contents of a tensor file.

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace fsdp {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

}  // namespace fsdp
