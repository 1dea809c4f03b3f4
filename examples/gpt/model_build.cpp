// The model of a run: --freeze's patterns, the device mesh, the model built (whole, deferred or
// split over tp) and its initial weights (trainer.h declares them).
#include "trainer.h"

#include "checkpointing.h"
#include "data.h"
#include "hf_folder.h"
#include "options.h"
#include "step.h"
#include "tensor_parallel_plan.h"

#include <fsdp/memory.h>
#include <fsdp/param_loader.h>
#include <fsdp/state_dict.h>
#include <fsdp/tensor_file.h>
#include <fsdp/trace.h>

#include <algorithm>
#include <c10/core/DeviceGuard.h>
#include <c10/util/accumulate.h>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <torch/cuda.h>
#include <vector>


namespace gpt {

namespace {

// The names --freeze patterns match, from the same architecture at the smallest width.
std::vector<std::string> freezable_names(const TrainOptions& o) {
  GPTConfig tiny = o.model;
  tiny.dim = 2 * tiny.heads;  // a head of 2 channels: Llama's rotary pairs need an even size
  tiny.head_dim = 0;
  tiny.ffn_dim = 1;
  tiny.vocab_size = 2;
  tiny.max_seq = 2;
  tiny.positions = 0;
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

void freeze_parameters(const TrainOptions& o, torch::nn::Module& model) {
  for (auto& item : model.named_parameters()) {
    if (is_frozen(o, item.key())) item.value().set_requires_grad(false);
  }
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
  // Else autograd's "element 0 of tensors does not require grad" at the first backward.
  const bool trains = std::any_of(names.begin(), names.end(), [&](const std::string& n) { return !is_frozen(o, n); });
  std::string given;
  for (const auto& pattern : o.freeze) given += " --freeze '" + pattern + "'";
  TORCH_CHECK(trains, given.substr(1), " freezes every parameter of the model: nothing would train; freeze "
              "fewer (e.g. 'h.0.' for one block, 'wte' for the embedding)");
}

namespace {

// Under --tp, hybrid sharding shards over the data-parallel ranks (world / tp), not the world: the
// library's check would name the dp group's size as "the world size".
void check_shard_group_under_tp(const TrainOptions& o, int world) {
  const int f = o.fsdp.shard_group_size(), dp = world / o.tp;
  if (f == 0 || !fsdp::is_hybrid(o.fsdp.strategy())) return;
  const std::string sizes = "the data-parallel size " + std::to_string(dp) + " (" + std::to_string(world) +
                            " ranks / --tp " + std::to_string(o.tp) + ")";
  TORCH_CHECK(dp % f == 0, "--shard-group-size ", f, " does not divide ", sizes, ": under --tp, hybrid "
              "sharding splits the data-parallel ranks into groups of F; pick F among the divisors of ", dp);
  TORCH_CHECK(dp / f >= 2, "--shard-group-size ", f, " with ", sizes, " leaves a single replica group: "
              "hybrid needs at least 2; use --strategy full (or grad_op), a smaller --shard-group-size, "
              "or a smaller --tp");
}

}  // namespace

std::shared_ptr<fsdp::DeviceMesh> make_mesh(const TrainOptions& o, fsdp::Distributed* dist) {
  if (!dist || o.tp == 1) return nullptr;
  TORCH_CHECK(dist->world_size() % o.tp == 0, "--tp ", o.tp, " does not divide the ", dist->world_size(),
              " ranks; launch a multiple of --tp ranks");
  check_shard_group_under_tp(o, dist->world_size());
  return std::make_shared<fsdp::DeviceMesh>(
      dist->world, std::vector<fsdp::MeshDim>{{"dp", dist->world_size() / o.tp}, {"tp", o.tp}});
}

namespace {

// --tp --deferred-init: each block built whole, initialised, split over the tp ranks, and its
// part sharded over dp before the next is built; the root's layers last.
fsdp::Unit<GPT> build_tensor_parallel_deferred(const TrainOptions& o, fsdp::DeviceMesh& mesh) {
  auto tp = std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp"));
  auto model = fsdp::fully_shard_deferred(
      [&] {
        torch::manual_seed(o.seed);
        return GPT(o.model);
      },
      mesh.group("dp"), o.fsdp,
      [&](const std::string& name, torch::Tensor& p) {
        init_parameter(o.model, name, p);
        if (is_frozen(o, name)) p.set_requires_grad(false);
      },
      [&](torch::nn::Module& unit, bool is_root) {
        fsdp::tp::parallelize_module(unit, tp, is_root ? root_parallel_plan(o.model) : block_parallel_plan(o.model));
      });
  model->tp = tp;
  return model;
}

// --tp: every rank builds (and loads) the whole model alike, keeps its tensor-parallel part,
// then FSDP shards that over the data-parallel ranks.
fsdp::Unit<GPT> build_tensor_parallel(const TrainOptions& o, fsdp::DeviceMesh& mesh) {
  if (o.deferred_init) return build_tensor_parallel_deferred(o, mesh);
  check_tensor_parallel(o.model, mesh.size("tp"));
  GPT gpt = make_gpt(o.model, o.seed);
  fsdp::Unit<GPT> whole(gpt);
  load_initial_weights(o, whole);
  freeze_parameters(o, *gpt);
  parallelize_gpt(gpt, std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp")));
  return fsdp::fully_shard(gpt, mesh.group("dp"), o.fsdp);
}

}  // namespace

fsdp::Unit<GPT> build_model(const TrainOptions& o, fsdp::Distributed* dist, fsdp::DeviceMesh* mesh) {
  if (dist && mesh) return build_tensor_parallel(o, *mesh);
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
  freeze_parameters(o, *gpt);
  if (dist) return fsdp::fully_shard(gpt, *dist->world, o.fsdp);  // moves it to fsdp.device()
  gpt->to(compute_device(o));
  return fsdp::Unit<GPT>(gpt);
}

void load_initial_weights(const TrainOptions& o, fsdp::Unit<GPT>& model) {
  if (!o.init_from.empty()) {
    fsdp::load_full_params(model, fsdp::load_tensor_dict(o.init_from), o.init_from);
  }
  if (!o.init_from_hf.empty()) load_hf(model, o.init_from_hf);
}

}  // namespace gpt
