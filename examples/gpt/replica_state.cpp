#include "replica_state.h"

#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <cstdio>
#include <sstream>

namespace gpt {

std::vector<at::Tensor> replica_tensors(fsdp::Unit<GPT>& model) {
  std::vector<at::Tensor> tensors;
  for (const auto& p : model->parameters()) tensors.push_back(p.detach());
  return tensors;
}

fsdp::ReplicaState replica_state(fsdp::Unit<GPT>& model, const TrainOptimizers& optimizers,
                                 int64_t next_step) {
  torch::serialize::OutputArchive archive;
  archive.write("next_step", torch::tensor(next_step, torch::kLong));
  torch::serialize::OutputArchive adamw;
  optimizers.adamw->save(adamw);
  archive.write("adamw", adamw);
  std::ostringstream out;
  archive.save_to(out);
  return {replica_tensors(model), out.str()};
}

int64_t load_replica_bytes(const std::string& bytes, TrainOptimizers& optimizers) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  torch::Tensor next_step;
  archive.read("next_step", next_step);
  torch::serialize::InputArchive adamw;
  archive.read("adamw", adamw);
  optimizers.adamw->load(adamw);
  return next_step.item<int64_t>();
}

namespace {

// FNV-1a over the tensor's bytes.
uint64_t hash_into(uint64_t h, const at::Tensor& t) {
  if (!t.defined()) return h;
  const at::Tensor host = t.detach().to(at::kCPU).contiguous();
  const auto* bytes = static_cast<const unsigned char*>(host.data_ptr());
  for (size_t i = 0; i < host.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ULL;
  return h;
}

std::string hex(uint64_t h) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

}  // namespace

nlohmann::json state_hashes(fsdp::Unit<GPT>& model, const TrainOptimizers& optimizers) {
  uint64_t params = 14695981039346656037ULL, state = params;
  for (const auto& p : model->parameters()) params = hash_into(params, p);
  auto& adamw = *optimizers.adamw;
  for (const auto& group : adamw.param_groups()) {
    for (const auto& p : group.params()) {
      auto found = adamw.state().find(p.unsafeGetTensorImpl());
      if (found == adamw.state().end()) continue;
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*found->second);
      state = hash_into(state, s.exp_avg());
      state = hash_into(state, s.exp_avg_sq());
      state = hash_into(state, s.max_exp_avg_sq());
      state = hash_into(state, torch::tensor(s.step(), torch::kLong));
    }
  }
  return {{"params_hash", hex(params)}, {"optimizer_hash", hex(state)}};
}

}  // namespace gpt
