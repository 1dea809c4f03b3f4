#pragma once
// gpt_train --pp's --save-full and --export-hf: every stage's full parameters gathered into the
// one dict or folder an unpipelined run writes.

#include "gpt.h"

#include <fsdp/device_mesh.h>
#include <fsdp/pipeline.h>
#include <fsdp/state_dict.h>

#include <string>
#include <vector>

namespace gpt {

/// Every parameter of `gpt`, whole, in `gpt`'s order and names, on every rank (a collective over
/// the mesh's ranks): each broadcast from dp rank 0 of the pp rank holding its stage
/// (`modules`: each stage's module names; stage s on the rank `placement` puts it).
fsdp::NamedTensors pipeline_full_params(GPT& gpt, fsdp::pp::Pipeline& pipe, fsdp::DeviceMesh& mesh,
                                        const std::vector<std::vector<std::string>>& modules,
                                        fsdp::pp::Placement placement);

}  // namespace gpt
