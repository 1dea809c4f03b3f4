#pragma once
// Building blocks of fully_shard() shared by its eager and deferred forms: turning one unit's
// parameters into its flat parameter groups, describing parameters for the cross-rank model
// check, and the rank-0 broadcasts.

#include "fsdp_state.h"
#include "model_check.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::detail {

using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

/// Shards `params` as the unit `name`: one ParamGroup for the trainable parameters and, if the
/// unit has frozen ones too, a second for those, attached to the first. Both are appended to
/// `state.groups()`; returns the unit's (first) group.
std::shared_ptr<ParamGroup> add_unit_groups(FsdpState& state, const std::string& name,
                                            NamedParams params, bool is_root);

/// One model-check line: "name dtype [shape] (frozen) unit=U".
std::string describe_param(const std::string& unit, const std::string& name, const at::Tensor& dtype_of,
                           at::IntArrayRef shape, bool requires_grad);
void add_description(ModelDescription& description, const std::string& unit, const NamedParams& params);

std::vector<at::Tensor> tensors_of(const NamedParams& params);
/// Runs `init` on every parameter, without recording gradients.
void initialise(NamedParams& params, const ParamInit& init);

/// Makes every rank's tensors equal to rank 0's.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, ProcessGroup& world);
void cast_floating_buffers(torch::nn::Module& root, c10::ScalarType dtype);

}  // namespace fsdp::detail
