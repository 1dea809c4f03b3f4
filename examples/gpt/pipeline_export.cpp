#include "pipeline_export.h"

#include <fsdp/distributed.h>

#include <c10/util/Exception.h>

#include <map>

namespace gpt {

namespace {

// The stage whose modules hold parameter `name` ("h.2.attn.q_proj.weight": the stage of "h.2").
int stage_of(const std::string& name, const std::vector<std::vector<std::string>>& modules) {
  for (size_t s = 0; s < modules.size(); ++s) {
    for (const auto& module : modules[s]) {
      if (name.rfind(module + ".", 0) == 0) return static_cast<int>(s);
    }
  }
  TORCH_CHECK(false, "--pp: parameter '", name, "' is in no stage's modules");
}

// The pp rank holding stage `stage`.
int pp_rank_of(int stage, int pp, int num_stages, fsdp::pp::Placement placement) {
  for (int r = 0; r < pp; ++r) {
    for (int s : fsdp::pp::stages_of_rank(r, pp, num_stages, placement)) {
      if (s == stage) return r;
    }
  }
  TORCH_CHECK(false, "--pp: stage ", stage, " is on no rank");
}

// This rank's stages' parameters, whole (a sharded stage's gathered over its dp ranks).
std::map<std::string, torch::Tensor> local_full_params(fsdp::pp::Pipeline& pipe) {
  std::map<std::string, torch::Tensor> local;
  for (const fsdp::pp::Stage& stage : pipe.stages()) {
    if (stage.is_sharded()) {
      for (auto& [name, tensor] : fsdp::gather_full_params(stage.sharded_model())) local[name] = tensor;
    } else {
      for (const auto& item : stage.named_parameters()) local[item.key()] = item.value().detach().clone();
    }
  }
  return local;
}

}  // namespace

fsdp::NamedTensors pipeline_full_params(GPT& gpt, fsdp::pp::Pipeline& pipe, fsdp::DeviceMesh& mesh,
                                        const std::vector<std::vector<std::string>>& modules,
                                        fsdp::pp::Placement placement) {
  const std::map<std::string, torch::Tensor> local = local_full_params(pipe);
  const int pp = mesh.size("pp"), dp = mesh.size("dp"), num_stages = static_cast<int>(modules.size());
  fsdp::NamedTensors params;
  for (const auto& item : gpt->named_parameters()) {
    const int root = pp_rank_of(stage_of(item.key(), modules), pp, num_stages, placement) * dp;  // pp outermost
    // A stage's own parameters are its shards in `gpt`: their whole shape is the gathered one's.
    const auto mine = local.find(item.key());
    torch::Tensor whole = mine != local.end() ? mine->second.clone() : torch::empty_like(item.value());
    fsdp::broadcast(mesh.world(), whole, root);
    params.emplace_back(item.key(), whole);
  }
  return params;
}

}  // namespace gpt
