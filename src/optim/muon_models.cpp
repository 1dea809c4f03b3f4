#include "optim/muon_models.h"

namespace fsdp::optim::muon {

// The sharded models holding any of `params`, found once, when the optimizer is made.
std::vector<ModelParams> models_of(const std::vector<at::Tensor>& params) {
  std::vector<ModelParams> models;
  for (auto& model : detail::models_holding(params)) {
    ModelParams m{model, detail::ShardedView(model), {}};
    size_t index = 0;
    for (size_t b = 0; b < m.view.buffers().size(); ++b) {
      for (const auto& p : m.view.buffers()[b].params()) {
        m.by_impl.emplace(p.param().unsafeGetTensorImpl(), Located{p, b, index++});
      }
    }
    models.push_back(std::move(m));
  }
  return models;
}

}  // namespace fsdp::optim::muon
