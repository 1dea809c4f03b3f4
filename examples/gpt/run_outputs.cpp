#include "run_outputs.h"

#include "hf_gpt2.h"
#include "output_errors.h"

#include <string>

namespace gpt {

namespace {

fsdp::NamedTensors named_parameters(fsdp::Unit<GPT>& model) {
  fsdp::NamedTensors params;
  for (auto& item : model->named_parameters()) params.emplace_back(item.key(), item.value());
  return params;
}

}  // namespace

void save_full(const TrainOptions& o, fsdp::Unit<GPT>& model, fsdp::Distributed* dist) {
  if (dist) {
    fsdp::save_full_params(model, o.save_full);
  } else {
    fsdp::save_tensor_dict(o.save_full, named_parameters(model));
  }
}

fsdp::NamedTensors full_params(fsdp::Unit<GPT>& model, fsdp::Distributed* dist) {
  if (dist) return fsdp::gather_full_params(model);
  fsdp::NamedTensors params = named_parameters(model);
  for (auto& [name, tensor] : params) tensor = tensor.detach().clone();
  return params;
}

void export_hf(const TrainOptions& o, const fsdp::NamedTensors& full_params,
               fsdp::Distributed* dist) {
  std::string error;
  if (!dist || dist->rank() == 0) {
    try {
      const nlohmann::json base = o.init_from_hf.empty()
                                      ? nlohmann::json()
                                      : HfGpt2Config::read(o.init_from_hf).json;
      export_hf_gpt2(full_params, o.model, base, o.export_hf);
    } catch (const std::exception& e) {
      error = fsdp::message_of(e);
    }
  }
  auto failed = torch::full({1}, error.empty() ? 0.0f : 1.0f);
  if (dist) fsdp::all_reduce_sum(*dist->world, failed);
  TORCH_CHECK(failed.item<float>() == 0.0f,
              output_failed("--export-hf", o.export_hf, error.empty() ? "on rank 0" : error));
}

}  // namespace gpt
