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

// --model's help: each family's, then where --init-from-hf takes it from.
std::string model_help() {
  std::string help;
  for (const ModelFamily* family : model_families()) {
    help += (help.empty() ? "" : "; ") + family->name() + ": " + family->help();
  }
  return help + ". --init-from-hf takes config.json's";
}

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const ModelFamily* family : model_families()) names.push_back(family->name());
  return names;
}

// The model, its optimizer and the run's length.
void add_model_options(CLI::App& app, CommandLine& cl) {
  TrainOptions& o = cl.train;
  app.add_option("--model", cl.model, model_help())
      ->check(CLI::IsMember(family_names()))
      ->capture_default_str();
  app.add_option("--layers", o.model.layers, "transformer blocks (one FSDP unit each)")
      ->check(integer_in(1, kMaxLayers));
  app.add_option("--dim", o.model.dim, "model width")->check(integer_in(1, kMaxDim));
  app.add_option("--heads", o.model.heads, "attention heads")->check(integer_in(1, kMaxHeads));
  app.add_option("--seq", o.model.max_seq, "sequence length")->check(integer_in(2, kMaxSeq));
  add_family_flags(app, o.model);
  app.add_option("--batch", o.batch, "sequences per rank per step")
      ->check(integer_in(1, kMaxBatch, "sequences per rank per step"));
  app.add_option("--steps", o.steps, "optimizer steps (0: none, e.g. --save-full of the initial model)")
      ->check(integer_in(0, kMaxCount));
  app.add_option("--lr", o.lr,
                 "AdamW's peak learning rate (--optimizer muon: of the parameters AdamW steps)")
      ->check(real_at_least(0));
  app.add_option("--warmup-steps", o.warmup_steps,
                 "linear warm-up steps, then cosine decay to lr/10 (0: constant lr)")
      ->check(integer_in(0, kMaxCount));
  app.add_option("--weight-decay", o.weight_decay,
                 "decoupled weight decay on matrices and embeddings (AdamW's; with --optimizer "
                 "muon Muon's too)")
      ->check(real_at_least(0));
  app.add_option("--optimizer", cl.optimizer,
                 "fused: AdamW in ATen's fused kernel (fsdp::optim::AdamW); torch: LibTorch's "
                 "torch::optim::AdamW (a loop of kernels per parameter); checkpoints of either "
                 "resume with the other. muon: fsdp::optim::Muon for the blocks' matrices (each "
                 "orthogonalized whole on one rank), the fused AdamW for embeddings, the head, "
                 "norms and biases")
      ->check(CLI::IsMember({"fused", "torch", "muon"}))
      ->capture_default_str();
  app.add_option("--muon-lr", o.muon_lr,
                 "--optimizer muon: Muon's peak learning rate (--lr stays AdamW's; the schedule "
                 "scales both)")
      ->check(real_at_least(0))
      ->capture_default_str();
  app.add_option("--adjust-lr", o.muon_adjust_lr,
                 "--optimizer muon: torch.optim.Muon's adjust_lr_fn; original: lr x sqrt(max(1, "
                 "rows/cols)) (Keller Jordan's); match_rms_adamw: lr x 0.2 sqrt(max(rows, cols)) "
                 "(Moonshot's, an update of AdamW's RMS)")
      ->check(CLI::IsMember({"original", "match_rms_adamw"}))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the initial weights and of the batches")
      ->check(integer_in(0, std::numeric_limits<int64_t>::max()));
}

// What the run reads and writes.
void add_input_output_options(CLI::App& app, CommandLine& cl) {
  TrainOptions& o = cl.train;
  app.add_option("--data", o.data,
                 "a text file or a folder of text files (bytes), or a .bin file of token ids");
  app.add_option("--data-tokens", cl.data_tokens,
                 "pre-tokenized data: token ids, nanoGPT's .bin (uint16, no header) or llm.c's "
                 "(256-int32 header, magic 20240520; version 1: uint16 ids, 2: uint32 ids)");
  app.add_option("--vocab", o.model.vocab_size,
                 "vocabulary size (default 256: bytes; --init-from-hf takes config.json's)")
      ->check(integer_in(2, kMaxVocab));
  app.add_option("--init-from-hf", o.init_from_hf,
                 "start from a transformers folder of a GPT-2, a Llama-family model (Llama, "
                 "Mistral, Qwen2) or a Qwen3 (config.json, model.safetensors or its index); the "
                 "architecture and sizes come from config.json; each rank reads only its shard");
  app.add_option("--export-hf", o.export_hf,
                 "after training, rank 0 writes a transformers folder of the model here "
                 "(config.json, model.safetensors) for from_pretrained (GPT2LMHeadModel, "
                 "LlamaForCausalLM, Qwen3ForCausalLM)");
  app.add_option("--eval-tokens", o.eval_tokens,
                 "a .bin token file: the loss and logits on its rows of --seq + 1 tokens, before "
                 "the first step and after the last");
  app.add_option("--eval-out", o.eval_out,
                 "rank 0 writes those here (torch.load: inputs, targets, loss_initial, "
                 "logits_initial, loss_final, logits_final)");
  app.add_option("--max-data-mb", cl.max_data_mb, "read at most this many MiB of text")
      ->check(integer_in(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--metrics", o.metrics_path, "JSON lines per step; {rank} becomes the rank");
  app.add_option("--log-every", o.log_every,
                 "print a progress line every N steps (rank 0; omit the flag for none)")
      ->check(integer_in(1, std::numeric_limits<int>::max(), "omit the flag for no progress lines"));
  app.add_option("--sample", o.sample_bytes, "generate N bytes after training")
      ->check(integer_in(0, 1 << 24));
  app.add_option("--prompt", o.sample_prompt, "prompt of the sample");
  app.add_option("--init-from", o.init_from,
                 "start from these full parameters (a torch.save dict of name -> tensor)");
  app.add_option("--save-full", o.save_full,
                 "rank 0 writes the full parameters here after training (--steps 0: the initial ones)");
  app.add_option("--dump-batches", o.dump_batches,
                 "rank 0 writes every global batch of the run here ({inputs, targets}, torch.load)");
  app.add_option("--trace", o.trace,
                 "Chrome trace (Perfetto) of one step per rank; {rank} becomes the rank");
}

// How FSDP shards the model and schedules its collectives.
void add_sharding_options(CLI::App& app, CommandLine& cl) {
  app.add_option("--strategy", cl.strategy, "full | grad_op | none | hybrid | hybrid_grad_op")
      ->check(CLI::IsMember({"full", "grad_op", "none", "hybrid", "hybrid_grad_op"}));
  app.add_option("--shard-group-size", cl.shard_group_size,
                 "hybrid strategies: ranks per shard group (default: LOCAL_WORLD_SIZE)")
      ->check(integer_in(0, 1 << 20));
  app.add_option("--tp", cl.train.tp,
                 "tensor parallelism: split each layer over N consecutive ranks (a host's) and "
                 "shard with FSDP over the world / N others (docs/tensor-parallel.md)")
      ->check(integer_in(1, 1 << 16));
  app.add_option("--backward-prefetch", cl.backward_prefetch, "pre | post | none")
      ->check(CLI::IsMember({"pre", "post", "none"}));
  app.add_flag("--forward-prefetch,!--no-forward-prefetch", cl.forward_prefetch,
               "all-gather the next unit before forward (default: on)");
  app.add_option("--limit-all-gathers", cl.limit_all_gathers,
                 "rate limiter: units holding unsharded memory at once (0: no limit)")
      ->check(integer_in(0, 1 << 20));
  app.add_flag("--no-reshard-after-forward", cl.keep_after_forward,
               "keep every unit's unsharded parameters from its forward to its backward (no "
               "second all-gather; more memory); default: the strategy's");
  app.add_flag("--check-order", cl.check_order,
               "debug: check in the first step that all ranks run units in the same order");
}

// How each rank computes: precision, set-up, frozen parameters, device.
void add_compute_options(CLI::App& app, CommandLine& cl) {
  TrainOptions& o = cl.train;
  const auto dtypes = CLI::IsMember({"fp32", "bf16", "fp16"});
  app.add_option("--param-dtype", cl.param_dtype,
                 "mixed precision: compute dtype of forward/backward and the all-gathers "
                 "(fp32 masters stay sharded; fp16 adds a sharded gradient scaler)")
      ->check(dtypes);
  app.add_option("--reduce-dtype", cl.reduce_dtype,
                 "mixed precision: dtype of the gradient reductions (default: --param-dtype)")
      ->check(dtypes);
  app.add_option("--loss-scale", o.loss_scale, "fp16: initial scale of the sharded gradient scaler")
      ->check(real_at_least(0, /*strictly_above=*/true));
  app.add_flag("--deferred-init", o.deferred_init,
               "build, initialise and shard one block at a time (set-up memory: sharded model + one "
               "block); initial values differ from the eager build's (other random order)");
  app.add_option("--freeze", o.freeze,
                 "parameters whose name contains this do not train (repeatable; with "
                 "--deferred-init a block's names lack the 'h.N.' prefix)");
  app.add_flag("--activation-checkpointing", cl.activation_checkpointing,
               "recompute each block's forward in backward instead of keeping its activations");
  app.add_option("--device", cl.device,
                 "where the model computes: cpu | cuda (cuda:LOCAL_RANK % GPUs; --reference: "
                 "cuda:0) | cuda:N")
      ->check(device_name())
      ->capture_default_str();
  app.add_flag("--step-in-backward", o.step_in_backward,
               "step each unit as soon as its reduced gradient lands, during the last micro-batch's "
               "backward (on by default with --cpu-offload; not with --clip or fp16)");
  app.add_flag("--cpu-offload", cl.cpu_offload,
               "keep shards, gradient shards and optimizer state in host memory (needs --device "
               "cuda; the optimizer steps on the CPU)");
}

// The reference, accumulation, clipping, checkpoints.
void add_run_options(CLI::App& app, CommandLine& cl) {
  TrainOptions& o = cl.train;
  app.add_flag("--reference", cl.reference, "train unsharded in this process on the global batch");
  app.add_option("--world-size", o.reference_world_size,
                 "with --reference: the world size whose global batch to train on")
      ->check(integer_in(1, 1 << 16));
  app.add_option("--grad-accum", o.grad_accum, "micro-batches per step (gradient accumulation)")
      ->check(integer_in(1, 1 << 20));
  app.add_flag("--no-sync", o.no_sync,
               "accumulate micro-batches without communication (one reduction per step)");
  app.add_option("--clip", o.clip, "clip the global gradient norm to this value (0: off)")
      ->check(real_at_least(0));
  app.add_option("--save-every", o.save_every, "save a sharded checkpoint every N steps and at the end")
      ->check(integer_in(1, kMaxCount, "omit the flag to save no checkpoints"));
  app.add_flag("--async-save", o.async_save,
               "with --save-every: write each checkpoint in the background while training goes on "
               "(the next save, and the end of the run, wait for it)");
  app.add_option("--staging-budget", o.staging_budget,
                 "with --async-save: bytes of host memory its staging arena takes per rank (0, the default: "
                 "one rank's shards; less stages in waves of whole shard files)")
      ->check(integer_in(0, kMaxCount));
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "folder of sharded checkpoints (step-N/ and latest)");
  app.add_option("--resume", cl.resume,
                 "continue from the newest checkpoint in --checkpoint-dir (an error if it holds "
                 "none); '--resume auto': start at step 0 when it holds none yet")
      ->expected(0, 1)
      ->default_str("always")
      ->check(CLI::IsMember({"always", "auto"}));
  app.add_flag("--reset-optimizer", o.reset_optimizer,
               "with --resume: load only the parameters (also of a checkpoint without AdamW "
               "state); AdamW starts afresh");
  app.add_option("--max-nonfinite-steps", o.max_nonfinite_steps,
                 "stop with an error after this many consecutive steps with a NaN/inf loss")
      ->capture_default_str()
      ->check(integer_in(1, kMaxCount));
  // A test flag, hidden from --help: stalls every save between its shard files and its metadata,
  // so that a test can kill the run half-way through a save.
  app.add_flag("--fault-tolerant", o.fault_tolerant,
               "--strategy hybrid: a replica (shard group) that loses a rank is replaced while "
               "the others train on (under fsdprun --fault-tolerant F; docs/fault-tolerance.md)");
  app.add_option("--replica-vote-timeout", o.replica_vote_timeout_s,
                 "--fault-tolerant: seconds a step waits for a silent replica before it goes on "
                 "without it")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--test-kill-rank", o.test_kill_ranks, "tests: ranks that SIGKILL themselves")
      ->group("");
  app.add_option("--test-kill-step", o.test_kill_step, "tests: the step at which it does")->group("");
  app.add_option("--test-pause-per-step", o.test_pause_per_step_ms,
                 "tests: milliseconds each step sleeps after its work (a slow step)")
      ->check(integer_in(0, kMaxCount))
      ->group("");
  app.add_option("--test-kill-in-transfer", o.test_kill_in_transfer_rank,
                 "tests: a rank whose first replacement dies while receiving the state")
      ->group("");
  app.add_option("--test-pause-after-shard-files", o.test_pause_after_shard_files_ms,
                 "milliseconds each writing rank sleeps before a save's metadata")
      ->check(integer_in(0, kMaxCount))
      ->group("");
}

// The flags whose text becomes options of another form.
void convert_flag_values(const CLI::App& app, CommandLine& cl) {
  TrainOptions& o = cl.train;
  o.model.family = cl.model;
  o.max_data_bytes = cl.max_data_mb << 20;
  o.fused_optimizer = cl.optimizer != "torch";  // muon's AdamW is the fused one
  o.muon = cl.optimizer == "muon";
  o.resume = app.count("--resume") > 0;
  o.resume_if_none = cl.resume == "auto";
  o.fsdp.strategy(fsdp::parse_sharding_strategy(cl.strategy))
      .shard_group_size(cl.shard_group_size)
      .backward_prefetch(fsdp::parse_backward_prefetch(cl.backward_prefetch))
      .forward_prefetch(cl.forward_prefetch)
      .limit_all_gathers(cl.limit_all_gathers)
      .check_execution_order(cl.check_order)
      .reshard_after_forward(cl.keep_after_forward ? std::optional<bool>(false) : std::nullopt)
      .activation_checkpointing(cl.activation_checkpointing)
      .cpu_offload(cl.cpu_offload);
  auto& precision = o.fsdp.mixed_precision();
  if (!cl.param_dtype.empty()) precision.param_dtype(fsdp::parse_dtype(cl.param_dtype));
  if (!cl.reduce_dtype.empty()) precision.reduce_dtype(fsdp::parse_dtype(cl.reduce_dtype));
}

}  // namespace

void add_options(CLI::App& app, CommandLine& cl) {
  add_model_options(app, cl);
  add_input_output_options(app, cl);
  add_sharding_options(app, cl);
  add_compute_options(app, cl);
  add_run_options(app, cl);
  add_pipeline_options(app, cl);
}

void add_planner_options(CLI::App& app, CommandLine& cl, bool run_flags) {
  add_plan_flags(app, cl.planner);
  if (!run_flags) return;
  app.add_flag("--plan", cl.plan,
               "print the plan of this run (peak memory per rank broken down, bytes per step, step "
               "time; with --max-memory-gb the fastest configuration under it) and exit")
      ->group("Planner");
  app.add_flag("--auto", cl.autoplan,
               "train with the fastest configuration (strategy, activation checkpointing, batch per "
               "rank with gradient accumulation) whose planned peak fits --max-memory-gb")
      ->group("Planner");
}

std::string finish_plan_options(const CLI::App& app, CommandLine& cl) {
  convert_flag_values(app, cl);
  cl.train.data_is_tokens = !cl.data_tokens.empty();
  if (!cl.data_tokens.empty()) cl.train.data = cl.data_tokens;
  if (std::string error = apply_hf_sizes(app, cl.train); !error.empty()) return error;
  if (std::string error = check_model_flags(app, cl.train.model); !error.empty()) return error;
  if (std::string error = check_search_flags(app, cl, /*planning=*/true); !error.empty()) return error;
  if (std::string error = check_planned_grad_accum(cl.train); !error.empty()) return error;
  if (std::string error = check_pipeline_shape(app, cl.train); !error.empty()) return error;
  if (cl.device != "cpu") cl.train.fsdp.device(c10::Device(cl.device == "cuda" ? "cuda:0" : cl.device));
  return "";
}

std::string check_model_flags(const CLI::App& app, const GPTConfig& model) {
  std::vector<std::string> own;  // the flags of the run's family
  for (const ModelFamily* family : model_families()) {
    if (family->name() == model.family) own = family->flags();
  }
  for (const ModelFamily* family : model_families()) {
    for (const std::string& flag : family->flags()) {
      if (app.count(flag) > 0 && std::find(own.begin(), own.end(), flag) == own.end()) {
        return flag + " applies to --model " + families_taking(flag) + " only";
      }
    }
  }
  if (model.dim % model.heads != 0) {
    return "--dim " + std::to_string(model.dim) + " is not a multiple of --heads " +
           std::to_string(model.heads) + " (each head gets dim/heads channels)";
  }
  try {
    model.validate();
  } catch (const c10::Error& e) {
    return e.msg();
  }
  return "";
}

// The flags given that --auto chooses itself: named when it trains with other values.
static std::vector<std::string> flags_auto_replaces(const CLI::App& app, const CommandLine& cl) {
  std::vector<std::string> given;
  if (app.count("--strategy") > 0) given.push_back("--strategy " + cl.strategy);
  if (app.count("--shard-group-size") > 0) given.push_back("--shard-group-size " + std::to_string(cl.shard_group_size));
  if (app.count("--activation-checkpointing") > 0) given.push_back("--activation-checkpointing");
  if (app.count("--tp") > 0 && !cl.planner.tp_sizes.empty()) given.push_back("--tp " + std::to_string(cl.train.tp));
  return given;
}

std::string finish_options(const CLI::App& app, CommandLine& cl) {
  convert_flag_values(app, cl);
  if (cl.autoplan && cl.planner.max_memory_gb <= 0) {
    return "--auto needs --max-memory-gb X: the memory each rank may use";
  }
  if (cl.autoplan && cl.reference) return "--auto plans the sharded run, not --reference";
  if (std::string error = check_search_flags(app, cl, /*planning=*/false); !error.empty()) return error;
  if (cl.autoplan) cl.replaced_by_auto = flags_auto_replaces(app, cl);
  std::string error = apply_data_and_hf_flags(app, cl.data_tokens, cl.train);
  if (error.empty()) error = check_pipeline_flags(app, cl);
  if (error.empty()) error = check_flag_combinations(app, cl.train, cl.reference);
  if (error.empty()) error = check_device_flags(cl.device, cl.cpu_offload, cl.reference);
  return error;
}

}  // namespace gpt
