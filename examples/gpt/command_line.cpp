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

std::string in_parentheses(const std::string& hint) {
  return hint.empty() ? "" : " (" + hint + ")";
}

}  // namespace

CLI::Validator integer_in(int64_t lo, int64_t hi, std::string hint) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long value = std::strtoll(text.c_str(), &end, 10);
        const bool whole = !text.empty() && end == text.c_str() + text.size() && errno == 0;
        if (whole && value >= lo && value <= hi) return "";
        std::string range = hi == std::numeric_limits<int64_t>::max()
                                ? ">= " + std::to_string(lo)
                                : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
        return "must be a whole number " + range + ", got '" + text + "'" + in_parentheses(hint);
      },
      "INT", "integer_in");
}

namespace {

// A finite number that `accepts`, else the message naming `range` (e.g. ">= 0").
CLI::Validator real_where(std::function<bool(double)> accepts, const std::string& range,
                          const std::string& hint, const char* name) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        const bool number = !text.empty() && end == text.c_str() + text.size();
        if (number && std::isfinite(value) && accepts(value)) return "";
        return "must be a finite number " + range + ", got '" + text.substr(0, 40) + "'" +
               in_parentheses(hint);
      },
      "REAL", name);
}

std::string number_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

}  // namespace

CLI::Validator real_at_least(double lo, bool strictly_above, std::string hint) {
  return real_where([=](double value) { return strictly_above ? value > lo : value >= lo; },
                    (strictly_above ? "> " : ">= ") + number_text(lo), hint, "real_at_least");
}

CLI::Validator real_in(double lo, double hi, std::string hint) {
  return real_where([=](double value) { return value >= lo && value <= hi; },
                    "in [" + number_text(lo) + ", " + number_text(hi) + "]", hint, "real_in");
}

CLI::Validator device_name() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text == "cpu" || text == "cuda") return "";
        const std::string index = text.rfind("cuda:", 0) == 0 ? text.substr(5) : "";
        const bool whole = !index.empty() && index.size() <= 4 &&
                           index.find_first_not_of("0123456789") == std::string::npos;
        return whole ? "" : "must be cpu, cuda or cuda:N (N: a GPU's index), got '" + text + "'";
      },
      "DEVICE", "device_name");
}

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
  if (error.empty()) error = check_flag_combinations(app, cl.train, cl.reference);
  if (error.empty()) error = check_device_flags(cl.device, cl.cpu_offload, cl.reference);
  return error;
}

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
  // (--tp: built whole, filled, then split: tensor_parallel_plan.h.)
  o.deferred_init = o.tp == 1;
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

std::string check_flag_combinations(const CLI::App& app, const TrainOptions& o, bool reference) {
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
