// FSDP inside a pipeline stage: the stage's parts as one module, sharded over the stage's
// data-parallel ranks, held unsharded across the step's micro-batches.
#include "pp/stage_sharding.h"

#include "core/sharded_view.h"
#include "core/unshard_hold.h"
#include "pp/part_call.h"

#include <fsdp/fully_shard.h>
#include <fsdp/unit_runtime.h>

#include <c10/util/Exception.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::pp {

// [Note: FSDP inside a stage]
// The FSDP paper's section 7.1.1: each pipeline stage is sharded over its D data-parallel ranks
// (the mesh's "dp" group at the stage's pp coordinate). The stage's parts become the children of
// one module, nested by their names so that its parameters are named as the model's
// ("h.1.fc1.weight"), and fully_shard makes that module one FSDP unit over "dp"; the stage's
// forward runs through it. The schedule's stage-wide actions drive it, as
// torch.distributed.pipelining drives FSDP2 (unshard, no gradient sync, reduce, reshard):
// - Unshard gathers the parameters once and holds them ([Note: units held unsharded]): no
//   forward or backward of the step's micro-batches reshards them, and each backward adds its
//   gradient into one unsharded sum (no_sync);
// - ZBV's W (backward with the stage's weights as inputs) adds into the same sum as a B; its I
//   (the input's gradient alone) reaches no weight;
// - ReduceScatter, after the stage's last backward (or W), reduces that sum once (reduce-scatter, or
//   all-reduce for NO_SHARD and across hybrid replicas), divided by D: each dp rank's loss is
//   the mean over its own tokens, so the mean over the ranks is the global batch's;
// - Reshard frees the gathered parameters: between steps they are this rank's 1-D shards, with
//   gradients of the same shape, and the optimizer steps those.
// PipelineOptions::reshard_after_microbatch trades communication for memory: the runner also
// reshards after each micro-batch's backward and gathers again before the next forward or
// backward (M all-gathers a step instead of one); the gradients are still reduced once. A
// micro-batch whose forward ran before a reshard finds its saved views refilled by the next
// gather ([Note: storage reuse] in core/flat_param.h). What cannot compose is refused here:
// the stage is one unit (its parts are called through AnyModule, which skips an fsdp::Unit
// holder), so a part held by an fsdp::Unit and a per-unit reshard_after_forward (the stage keeps
// its parameters for all its micro-batches) have no meaning; CPU offload is not composed with
// the hold.
//
// [Note: activation checkpointing inside a stage]
// FullyShardOptions::activation_checkpointing on a stage recomputes each of its parts in
// backward: the stage's forward runs every part through detail::run_checkpointed (the same
// mechanics as a checkpointed unit's, core/activation_checkpoint.cpp), so a micro-batch keeps
// only each part's input between its forward and its backward, not the activations inside the
// part. The recomputation runs in the micro-batch's backward, while the stage is held unsharded
// (or gathered again before that backward under reshard_after_microbatch), and its gradients
// reach the same parameters' accumulators, so the held sum is the same. ZBV does not compose:
// its input-gradient pass (torch::autograd::grad w.r.t. the stage's input) would run the
// recomputation's own backward, which accumulates the weights' gradients too, and its weight
// pass would add them again; the Pipeline refuses a recomputing stage under ZBV by name.

namespace {

struct StageModuleImpl : torch::nn::Module {
  StageModuleImpl(const std::vector<Part>& stage_parts, bool recompute_parts)
      : parts(stage_parts), recompute(recompute_parts) {
    std::map<std::string, std::shared_ptr<torch::nn::Module>> containers;  // by prefix ("h")
    for (const Part& part : parts) register_nested(part.name, part.module.ptr(), containers);
  }

  // [Note: activation checkpointing inside a stage]
  at::Tensor forward(at::Tensor x) {
    for (Part& part : parts) {
      if (!recompute) {
        x = call_part(part, std::move(x));
        continue;
      }
      Part* called = &part;  // the parts live as long as this module, which the recomputation needs
      x = detail::run_checkpointed([called](const std::vector<at::Tensor>& in) { return call_part(*called, in[0]); },
                                   {std::move(x)});
    }
    return x;
  }

  // Registers `module` as `name` ("h.1": child "1" of a container "h", made once).
  void register_nested(const std::string& name, std::shared_ptr<torch::nn::Module> module,
                       std::map<std::string, std::shared_ptr<torch::nn::Module>>& containers) {
    torch::nn::Module* parent = this;
    size_t start = 0;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
      const std::string prefix = name.substr(0, dot);
      auto& container = containers[prefix];
      // A plain module holding the parts under a prefix ("h" of "h.1").
      if (!container) {
        container = parent->register_module(name.substr(start, dot - start), std::make_shared<torch::nn::Module>());
      }
      parent = container.get();
      start = dot + 1;
    }
    TORCH_CHECK(!parent->named_children().contains(name.substr(start)), "pipeline: part '", name,
                "' is also a container of another part of the stage; give parts that do not nest");
    parent->register_module(name.substr(start), std::move(module));
  }

  std::vector<Part> parts;
  bool recompute;  // each part recomputed in backward ([Note: activation checkpointing inside a stage])
};
TORCH_MODULE(StageModule);

void check_options_compose(const FullyShardOptions& options) {
  TORCH_CHECK(!options.cpu_offload(), "pipeline: FullyShardOptions::cpu_offload does not compose with a "
              "sharded pipeline stage (not built: the stage holds its gathered parameters across micro-"
              "batches); turn it off");
  TORCH_CHECK(!options.reshard_after_forward() && !options.reshard_after_forward_of(),
              "pipeline: FullyShardOptions::reshard_after_forward does not compose with a sharded pipeline "
              "stage (it gathers its parameters once per step and keeps them for all its micro-batches); "
              "leave it unset, and use PipelineOptions::reshard_after_microbatch(true) to reshard after "
              "each micro-batch");
}

// A part held by an fsdp::Unit would be skipped (AnyModule calls its module's forward directly).
void check_no_units(const std::vector<Part>& parts) {
  for (const Part& part : parts) {
    for (const auto& item : part.module.ptr()->named_modules(part.name)) {
      TORCH_CHECK(!detail::find_unit(item.value().get()), "pipeline: module '", item.key(),
                  "' of the stage is held by an fsdp::Unit; a sharded stage is one FSDP unit, so hold its "
                  "modules as plain modules (e.g. Block, not fsdp::Unit<Block>)");
    }
  }
}

// [Note: a tie across sharded stages] (pp/tied_weights.cpp): a tied weight another stage of this
// rank has sharded already is one tensor, which a second FSDP unit cannot flatten again.
void check_ties_not_sharded_already(const Stage& stage) {
  for (const TiedParameter& tie : stage.tied_parameters()) {
    const at::Tensor& tensor = stage.named_parameters()[tie.name];
    TORCH_CHECK(detail::models_holding({tensor}).empty(), "pipeline: stage ", stage.index(), " holds '", tie.name,
                "', a weight tied across stages that another stage of this rank has sharded already "
                "(Stage::fully_shard): two sharded stages of one rank cannot both flatten the one tensor; use a "
                "schedule that puts them on different ranks (OneFOneB, GPipe, Interleaved1F1B), untie the weight, "
                "or leave the stages unsharded");
  }
}

}  // namespace

ShardedStage::ShardedStage(const std::vector<Part>& parts, ProcessGroup& dp, const FullyShardOptions& options)
    : model_(nullptr) {
  check_options_compose(options);
  check_no_units(parts);
  Unit<StageModule> root = fsdp::fully_shard(StageModule(parts, options.activation_checkpointing()), dp, options);
  model_ = root.sharded_model();
  recomputes_parts_ = options.activation_checkpointing();
  forward_ = [root](const at::Tensor& x) { return root(x); };
}

void Stage::fully_shard(ProcessGroup& dp, FullyShardOptions options) {
  TORCH_CHECK(!sharded_, "pipeline: stage ", index_, " is sharded already; call Stage::fully_shard once");
  check_ties_not_sharded_already(*this);
  sharded_ = std::make_shared<ShardedStage>(parts_, dp, options);
}

ShardedModel Stage::sharded_model() const {
  TORCH_CHECK(sharded_, "pipeline: stage ", index_, " is not sharded; call Stage::fully_shard(mesh.group(\"dp\")) "
              "first");
  return sharded_->model();
}

std::shared_ptr<StageSharding> Stage::sharding() const {
  if (sharded_) return sharded_;
  return std::make_shared<StageSharding>();
}

void ShardedStage::unshard() { detail::hold_unsharded(model_); }

void ShardedStage::reduce_scatter() { detail::reduce_held_gradients(model_); }

void ShardedStage::reshard() { detail::release_unsharded(model_); }

}  // namespace fsdp::pp
