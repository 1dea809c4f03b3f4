#pragma once
// A unit's flat parameter groups: one per kind of parameter (trainable or frozen, computed in
// param_dtype or kept in full precision), and the buffers mixed precision casts.

#include "core/fsdp_state.h"

#include <fsdp/named_tensors.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace fsdp::detail {

using TensorSet = std::unordered_set<const c10::TensorImpl*>;

// [Note: full-precision modules]
// Under mixed precision, BatchNorm's parameters stay in the model's dtype (as PyTorch FSDP1 does
// by default, through _module_classes_to_ignore): with bf16 weights and fp32 running statistics
// ATen's batch_norm refuses to run ("expected scalar type BFloat16 but found Float"), while bf16
// inputs with fp32 weights and statistics are a supported mixed-type call whose output stays bf16.
// So a unit's BatchNorm parameters form a flat parameter of their own, gathered in full precision
// with the unit and reduced in full precision; their running statistics keep their dtype too
// (buffer_dtype skips them). MixedPrecision::keep_batch_norm_in_full_precision(false) turns it off.

/// The parameters of `root` and its submodules that mixed precision leaves in full precision.
TensorSet full_precision_params(const torch::nn::Module& root, const MixedPrecision& policy);

/// Shards `params` as the unit `name`, with one flat parameter per kind of parameter (trainable
/// or frozen, computed in param_dtype or kept in full precision: those in `full_precision`), and
/// appends it to `state.units()`.
std::shared_ptr<ParamGroup> add_unit(FsdpState& state, const std::string& name, NamedTensors params,
                                     bool is_root, const TensorSet& full_precision);

/// The entries of all of a unit's flat parameters.
std::vector<FlatEntry*> unit_entries(ParamGroup& unit);

/// Casts the floating-point buffers to the policy's buffer_dtype, but those of full-precision modules.
void cast_floating_buffers(torch::nn::Module& root, const MixedPrecision& policy);

}  // namespace fsdp::detail
