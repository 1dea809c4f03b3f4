#include "model_setup.h"

#include "hf_gpt2.h"

#include <fsdp/state_dict.h>

#include <algorithm>
#include <string>
#include <vector>

namespace gpt {

namespace {

// The names --freeze patterns match, from the same architecture at the smallest width.
std::vector<std::string> freezable_names(const TrainOptions& o) {
  GPTConfig tiny = o.model;
  tiny.dim = tiny.heads;
  tiny.max_seq = 2;
  std::vector<std::string> names;
  for (const auto& item : GPT(tiny)->named_parameters()) {
    std::string name = item.key();
    if (o.deferred_init && name.rfind("h.", 0) == 0) name = name.substr(name.find('.', 2) + 1);
    names.push_back(name);
  }
  return names;
}

}  // namespace

bool is_frozen(const TrainOptions& o, const std::string& name) {
  for (const auto& pattern : o.freeze) {
    if (name.find(pattern) != std::string::npos) return true;
  }
  return false;
}

void check_freeze_patterns(const TrainOptions& o) {
  if (o.freeze.empty()) return;
  const std::vector<std::string> names = freezable_names(o);
  for (const auto& pattern : o.freeze) {
    const bool matches = std::any_of(names.begin(), names.end(), [&](const std::string& name) {
      return name.find(pattern) != std::string::npos;
    });
    TORCH_CHECK(matches, "--freeze '", pattern, "' matches no parameter name",
                o.deferred_init ? " (with --deferred-init, names are relative to a block, e.g. "
                                  "'attn.c_attn', or the root's 'wpe')"
                                : " (e.g. 'wpe', 'h.0.attn', 'ln_f')");
  }
}

fsdp::Unit<GPT> build_model(const TrainOptions& o, fsdp::Distributed* dist) {
  if (dist && o.deferred_init) {
    return fsdp::fully_shard_deferred(
        [&] {
          torch::manual_seed(o.seed);
          return GPT(o.model);
        },
        *dist->world, o.fsdp, [&](const std::string& name, torch::Tensor& p) {
          init_parameter(o.model, name, p);
          if (is_frozen(o, name)) p.set_requires_grad(false);
        });
  }
  GPT gpt = make_gpt(o.model, o.seed);
  for (auto& item : gpt->named_parameters()) {
    if (is_frozen(o, item.key())) item.value().set_requires_grad(false);
  }
  if (dist) return fsdp::fully_shard(gpt, *dist->world, o.fsdp);  // moves it to fsdp.device()
  gpt->to(compute_device(o));
  return fsdp::Unit<GPT>(gpt);
}

void load_initial_weights(const TrainOptions& o, fsdp::Unit<GPT>& model) {
  if (!o.init_from.empty()) {
    fsdp::load_full_params(model, fsdp::load_tensor_dict(o.init_from), o.init_from);
  }
  if (!o.init_from_hf.empty()) load_hf_gpt2(model, o.init_from_hf);
}

}  // namespace gpt
