// gpt_train's flags checked together: what the model needs of memory, checkpoints, Muon, tensor
// parallelism, sharding and the device; the data and Hugging Face flags applied
// (command_line.h declares them).
#include "command_line.h"

#include "search_flags.h"
#include "tensor_parallel_plan.h"

#include "data.h"
#include "gpt.h"
#include "hf_folder.h"
#include "model_family.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <torch/cuda.h>
#include <unistd.h>


namespace gpt {

namespace {

// What the sizes of a model too large for this machine came from, for the message.
std::string sizes_source(const TrainOptions& o) {
  if (o.init_from_hf.empty()) return "--layers/--dim/--seq/--batch ask";
  return "the sizes of --init-from-hf " + o.init_from_hf + "/config.json (n_layer " +
         std::to_string(o.model.layers) + ", n_embd " + std::to_string(o.model.dim) +
         ", n_positions " + std::to_string(o.model.context()) + ", vocab_size " +
         std::to_string(o.model.vocab_size) + ") with --seq " + std::to_string(o.model.max_seq) +
         " and --batch " + std::to_string(o.batch) + " ask";
}

// Sizes whose tensors cannot fit this machine fail here, not in the kernel's OOM killer: the
// parameters (each rank builds them; fp32; wpe has context() rows) and one block's activations,
// both underestimates.
std::string check_model_fits_memory(const TrainOptions& o, bool reference) {
  const double ram = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
  const double d = static_cast<double>(o.model.dim), seq = static_cast<double>(o.model.max_seq);
  const double params = o.model.layers * 12.0 * d * d +
                        (static_cast<double>(o.model.vocab_size) + o.model.context()) * d;
  const double rows = static_cast<double>(o.batch) * (reference ? o.reference_world_size : 1);
  const double activations = rows * (seq * d * 16.0 + o.model.heads * seq * seq) * 4.0;
  if (ram <= 0 || (params * 4.0 <= ram && activations <= ram)) return "";
  char text[256];
  std::snprintf(text, sizeof text, "%.0f GiB of parameters and %.0f GiB of activations per block",
                params * 4.0 / (1 << 30), activations / (1 << 30));
  return sizes_source(o) + " for at least " + text + ", more than this machine's " +
         std::to_string(static_cast<int64_t>(ram / (1 << 30))) +
         " GiB of memory; choose a smaller model or batch";
}

std::string check_checkpoint_flags(const TrainOptions& o, bool reference) {
  if (reference && (o.save_every > 0 || o.resume || !o.checkpoint_dir.empty())) {
    return "--save-every, --checkpoint-dir and --resume need the sharded run, not --reference";
  }
  if (o.save_every > 0 && o.checkpoint_dir.empty()) {
    return "--save-every needs --checkpoint-dir DIR (where to write the checkpoints)";
  }
  if (o.async_save && o.save_every == 0) {
    return "--async-save applies to --save-every N (the saves it makes asynchronous); add it, or drop --async-save";
  }
  if (o.staging_budget > 0 && !o.async_save) {
    return "--staging-budget applies to --async-save (the arena it stages in); add it, or drop --staging-budget";
  }
  if (o.reset_optimizer && !o.resume) {
    return "--reset-optimizer applies to --resume (what it loads); drop it, or add --resume";
  }
  if (o.resume && o.checkpoint_dir.empty()) {
    return "--resume needs --checkpoint-dir DIR (the folder of the run to continue)";
  }
  if (!o.checkpoint_dir.empty() && o.save_every == 0 && !o.resume) {
    return "--checkpoint-dir does nothing without --save-every N (to save) or --resume (to load)";
  }
  return "";
}

// Muon's own flags without --optimizer muon would change nothing: refused, not ignored.
std::string check_muon_flags(const CLI::App& app, const TrainOptions& o) {
  if (o.muon) return "";
  for (const char* flag : {"--muon-lr", "--adjust-lr"}) {
    if (app.count(flag) > 0) return std::string(flag) + " applies to --optimizer muon only";
  }
  return "";
}

// --tp: the model's sizes must split; what does not yet run on a split model is refused by name.
std::string check_tensor_parallel_flags(const CLI::App& app, const TrainOptions& o, bool reference) {
  if (o.tp == 1) return "";
  if (reference) {
    return "--tp splits the sharded run's layers; --reference trains the unsharded model (give "
           "it --world-size WORLD/tp to train on the same global batch)";
  }
  try {
    check_tensor_parallel(o.model, o.tp);
  } catch (const c10::Error& e) {
    return e.msg();
  }
  const std::vector<std::pair<bool, const char*>> not_yet = {
      {!o.eval_tokens.empty(), "--eval-tokens"},
      {o.sample_bytes > 0, "--sample"},
  };
  for (const auto& [given, flag] : not_yet) {
    if (given) return std::string("--tp does not run with ") + flag + " yet; drop one of them";
  }
  return "";
}

std::string check_sharding_flags(const CLI::App& app, const TrainOptions& o) {
  if (o.no_sync && o.grad_accum == 1) {
    return "--no-sync needs --grad-accum N with N >= 2 (it skips the reduction of all but the "
           "last micro-batch)";
  }
  const auto strategy = o.fsdp.strategy();
  if (o.fsdp.shard_group_size() > 0 && strategy != fsdp::ShardingStrategy::HybridShard &&
      strategy != fsdp::ShardingStrategy::HybridShardGradOp) {
    return "--shard-group-size only applies with --strategy hybrid or hybrid_grad_op";
  }
  if (app.count("--loss-scale") > 0 && o.fsdp.mixed_precision().param_dtype() != torch::kHalf) {
    return "--loss-scale only applies with --param-dtype fp16";
  }
  return "";
}

// The GPU part of --device: this LibTorch must have CUDA, and the GPU must exist.
std::string check_gpu_available(const std::string& device, bool cpu_offload) {
  const std::string flags = (cpu_offload ? "--cpu-offload --device " : "--device ") + device;
  if (!at::detail::getCUDAHooks().isBuilt()) {
    return flags + ": this gpt_train is built against a CPU-only LibTorch; build it "
           "against a CUDA LibTorch (bash scripts/build_cuda.sh, binaries in build-cuda/bin) or "
           "pass --device cpu";
  }
  const int count = torch::cuda::device_count();
  if (count == 0) {
    return flags + ": no CUDA GPU is visible to this process (check the driver and "
           "CUDA_VISIBLE_DEVICES); run on a machine with a GPU or pass --device cpu";
  }
  if (device != "cuda" && std::stoi(device.substr(5)) >= count) {
    return "--device " + device + ": this machine has " + std::to_string(count) +
           " CUDA GPU(s), cuda:0 to cuda:" + std::to_string(count - 1);
  }
  return "";
}

// --step-in-backward where it cannot apply is refused, not silently ignored (train_step.cpp's
// steps_in_backward): each of these needs every gradient, or another optimizer, before a step.
std::string check_step_in_backward(const TrainOptions& o, bool reference) {
  if (!o.step_in_backward) return "";
  const char* why = reference ? "--reference has no units to step (it is the unsharded program)"
                    : o.clip > 0 ? "--clip needs the global norm of every gradient before any step"
                    : o.fsdp.mixed_precision().param_dtype() == torch::kHalf
                        ? "fp16's gradient scaler checks every gradient for inf/nan before any step"
                    : !o.fused_optimizer
                        ? "only --optimizer fused or muon (not torch) steps units during backward"
                        : nullptr;
  if (!why) return "";
  return std::string("--step-in-backward cannot apply: ") + why + "; drop --step-in-backward (or the flag "
         "that conflicts with it)";
}

}  // namespace

std::string apply_data_and_hf_flags(const CLI::App& app, const std::string& data_tokens,
                                    TrainOptions& o) {
  if (!data_tokens.empty() && !o.data.empty()) {
    return "--data and --data-tokens both name training data; pass one";
  }
  if (data_tokens.empty() && o.data.empty()) {
    return "--data is required: a text file or a folder of text files (or --data-tokens FILE)";
  }
  o.data_is_tokens = !data_tokens.empty() || is_token_file(o.data);
  if (!data_tokens.empty()) {
    o.data = data_tokens;
    o.data_flag = "--data-tokens";
  }
  if (o.data_is_tokens && o.sample_bytes > 0) {
    return "--sample generates bytes; with token data (" + o.data +
           ") its ids are a tokenizer's: decode a sample in Python instead";
  }
  if (!o.eval_out.empty() && o.eval_tokens.empty()) {
    return "--eval-out needs --eval-tokens FILE (the batch to evaluate)";
  }
  if (o.init_from_hf.empty()) return "";
  if (!o.init_from.empty()) return "--init-from and --init-from-hf both name initial weights; pass one";
  if (std::string error = apply_hf_sizes(app, o); !error.empty()) return error;
  // Built block by block and filled from the files shard by shard: never the whole model at once.
  // (--tp: built whole, filled, then split: tensor_parallel_plan.h; --pp: built whole, filled,
  // then each rank keeps its stages: pipeline_run.cpp.)
  o.deferred_init = o.tp == 1 && o.pp == 0;
  return "";
}

std::string apply_hf_sizes(const CLI::App& app, TrainOptions& o) {
  if (o.init_from_hf.empty()) return "";
  for (const ModelFamily* family : model_families()) {
    for (const std::string& flag : family->flags()) {
      if (app.count(flag) > 0) {
        return flag + " contradicts --init-from-hf, whose config.json sets the model's sizes; "
               "omit " + flag;
      }
    }
  }
  const std::string asked = o.model.family;
  try {
    const GivenSizes given{app.count("--layers") > 0, app.count("--dim") > 0,
                           app.count("--heads") > 0, app.count("--seq") > 0,
                           app.count("--vocab") > 0};
    apply_hf_config(HfConfig::read(o.init_from_hf), o.init_from_hf, given, o.model);
  } catch (const c10::Error& e) {
    return e.msg();
  }
  if (app.count("--model") > 0 && asked != o.model.family) {
    return "--model " + asked + " contradicts --init-from-hf " + o.init_from_hf +
           ", whose config.json holds a " + family_of(o.model).model_text() + " (--model " +
           o.model.family + "); omit --model";
  }
  return "";
}

namespace {

// [Note: what --fault-tolerant composes with] Each replica is a FULL_SHARD world of its own and
// the replicas meet only in the quorum's average of the gradients, before the optimizer steps:
// what steps inside backward, reduces across replicas by itself (fp16's overflow flag), or splits
// a replica otherwise (--tp, --pp) is refused.
std::string check_fault_tolerant_flags(const CLI::App& app, const TrainOptions& o, bool reference) {
  if (!o.fault_tolerant) return "";
  if (reference) return "--fault-tolerant applies to the sharded run, not --reference";
  if (o.fsdp.strategy() != fsdp::ShardingStrategy::HybridShard) {
    return "--fault-tolerant needs --strategy hybrid: the replicas (of --shard-group-size ranks) "
           "are what survives a lost rank";
  }
  if (o.tp > 1) return "--fault-tolerant does not compose with --tp (a replica is one shard group)";
  if (app.count("--pp") > 0) return "--fault-tolerant does not compose with --pp";
  if (app.count("--auto") > 0) {
    return "--fault-tolerant does not compose with --auto (the planner measures one world, not "
           "replicas): give --shard-group-size and the other flags yourself";
  }
  if (o.muon) return "--fault-tolerant moves AdamW's state to a replacement; not --optimizer muon";
  if (o.fsdp.mixed_precision().param_dtype() == torch::kHalf) {
    return "--fault-tolerant does not compose with fp16's loss scaling (--param-dtype fp16)";
  }
  if (o.step_in_backward || o.fsdp.cpu_offload()) {
    return "--fault-tolerant averages the gradients over the replicas before the optimizer "
           "steps: not with --step-in-backward or --cpu-offload, which step inside backward";
  }
  return "";
}

}  // namespace

std::string check_flag_combinations(const CLI::App& app, const TrainOptions& o, bool reference) {
  if (std::string error = check_fault_tolerant_flags(app, o, reference); !error.empty()) return error;
  if (std::string error = check_model_flags(app, o.model); !error.empty()) return error;
  if (std::string error = check_model_fits_memory(o, reference); !error.empty()) return error;
  if (app.count("--world-size") > 0 && !reference) {
    return "--world-size only applies with --reference (a sharded run takes WORLD_SIZE from its "
           "launcher)";
  }
  if (std::string error = check_checkpoint_flags(o, reference); !error.empty()) return error;
  if (std::string error = check_muon_flags(app, o); !error.empty()) return error;
  if (std::string error = check_tensor_parallel_flags(app, o, reference); !error.empty()) return error;
  if (std::string error = check_step_in_backward(o, reference); !error.empty()) return error;
  return check_sharding_flags(app, o);
}

std::string check_device_flags(const std::string& device, bool cpu_offload, bool reference) {
  if (cpu_offload && reference) {
    return "--cpu-offload needs the sharded run (it keeps the shards in host memory), not "
           "--reference";
  }
  if (cpu_offload && device == "cpu") {
    return "--cpu-offload keeps the shards in host memory and computes on a GPU: pass --device "
           "cuda (or cuda:N) with it";
  }
  if (device == "cpu") return "";
  return check_gpu_available(device, cpu_offload);
}

}  // namespace gpt
