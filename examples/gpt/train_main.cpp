// gpt_train: trains the byte-level GPT with FSDP over the ranks that fsdprun or torchrun started,
// or (--reference) unsharded in one process on the same global batches.
#include "checkpointing.h"
#include "hf_gpt2.h"
#include "run_paths.h"
#include "token_file.h"
#include "trainer.h"

#include <fsdp/peer_errors.h>

#include <ATen/detail/CUDAHooksInterface.h>
#include <CLI/CLI.hpp>
#include <torch/cuda.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <sstream>

namespace {

// Every numeric flag is checked as text before CLI11 converts it, so that a negative count, a
// NaN or an infinity is refused before any work with a message that names the flag (CLI11
// prefixes the flag's name: "--lr: must be a finite number >= 0, got 'inf'").
CLI::Validator integer_in(int64_t lo, int64_t hi, std::string hint = "") {
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
        return "must be a whole number " + range + ", got '" + text + "'" +
               (hint.empty() ? "" : " (" + hint + ")");
      },
      "INT", "integer_in");
}

CLI::Validator real_at_least(double lo, bool strictly_above = false, std::string hint = "") {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        const bool number = !text.empty() && end == text.c_str() + text.size();
        if (number && std::isfinite(value) && (strictly_above ? value > lo : value >= lo)) return "";
        std::ostringstream bound;
        bound << lo;
        return "must be a finite number " + std::string(strictly_above ? "> " : ">= ") +
               bound.str() + ", got '" + text + "'" + (hint.empty() ? "" : " (" + hint + ")");
      },
      "REAL", "real_at_least");
}

// --device: "cpu", "cuda" or "cuda:N".
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

constexpr int64_t kMaxCount = int64_t(1) << 40;  // steps and the like: far beyond any real run

// Checks between flags, before any work; a violation is a usage error naming the flags.
std::string check_flag_combinations(const CLI::App& app, const gpt::TrainOptions& o, bool reference) {
  const auto given = [&](const char* flag) { return app.count(flag) > 0; };
  if (o.model.dim % o.model.heads != 0) {
    return "--dim " + std::to_string(o.model.dim) + " is not a multiple of --heads " +
           std::to_string(o.model.heads) + " (each head gets dim/heads channels)";
  }
  // Sizes whose tensors cannot fit this machine fail here, not in the kernel's OOM killer: the
  // parameters (each rank builds them; fp32; wpe has context() rows) and one block's
  // activations, both underestimates.
  const double ram = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
  const double d = static_cast<double>(o.model.dim), seq = static_cast<double>(o.model.max_seq);
  const double params = o.model.layers * 12.0 * d * d +
                        (static_cast<double>(o.model.vocab_size) + o.model.context()) * d;
  const double rows = static_cast<double>(o.batch) * (reference ? o.reference_world_size : 1);
  const double activations = rows * (seq * d * 16.0 + o.model.heads * seq * seq) * 4.0;
  if (ram > 0 && (params * 4.0 > ram || activations > ram)) {
    char text[256];
    std::snprintf(text, sizeof text, "%.0f GiB of parameters and %.0f GiB of activations per block",
                  params * 4.0 / (1 << 30), activations / (1 << 30));
    const std::string sizes =
        o.init_from_hf.empty()
            ? std::string("--layers/--dim/--seq/--batch ask")
            : "the sizes of --init-from-hf " + o.init_from_hf + "/config.json (n_layer " +
                  std::to_string(o.model.layers) + ", n_embd " + std::to_string(o.model.dim) +
                  ", n_positions " + std::to_string(o.model.context()) + ", vocab_size " +
                  std::to_string(o.model.vocab_size) + ") with --seq " +
                  std::to_string(o.model.max_seq) + " and --batch " + std::to_string(o.batch) + " ask";
    return sizes + " for at least " + text + ", more than this machine's " +
           std::to_string(static_cast<int64_t>(ram / (1 << 30))) +
           " GiB of memory; choose a smaller model or batch";
  }
  if (given("--world-size") && !reference) {
    return "--world-size only applies with --reference (a sharded run takes WORLD_SIZE from its "
           "launcher)";
  }
  if (reference && (o.save_every > 0 || o.resume || !o.checkpoint_dir.empty())) {
    return "--save-every, --checkpoint-dir and --resume need the sharded run, not --reference";
  }
  if (o.save_every > 0 && o.checkpoint_dir.empty()) {
    return "--save-every needs --checkpoint-dir DIR (where to write the checkpoints)";
  }
  if (o.resume && o.checkpoint_dir.empty()) {
    return "--resume needs --checkpoint-dir DIR (the folder of the run to continue)";
  }
  if (!o.checkpoint_dir.empty() && o.save_every == 0 && !o.resume) {
    return "--checkpoint-dir does nothing without --save-every N (to save) or --resume (to load)";
  }
  if (o.no_sync && o.grad_accum == 1) {
    return "--no-sync needs --grad-accum N with N >= 2 (it skips the reduction of all but the "
           "last micro-batch)";
  }
  const auto strategy = o.fsdp.strategy();
  if (o.fsdp.shard_group_size() > 0 && strategy != fsdp::ShardingStrategy::HybridShard &&
      strategy != fsdp::ShardingStrategy::HybridShardGradOp) {
    return "--shard-group-size only applies with --strategy hybrid or hybrid_grad_op";
  }
  if (given("--loss-scale") && o.fsdp.mixed_precision().param_dtype() != torch::kHalf) {
    return "--loss-scale only applies with --param-dtype fp16";
  }
  return "";
}

// --device and --cpu-offload, before any rendezvous: a GPU run needs a CUDA LibTorch and a GPU.
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

// The GPU of --device cuda[:N]. "cuda": this rank's, cuda:(LOCAL_RANK % GPUs) (several ranks on
// one GPU need FSDP_CUDA_COLLECTIVES=staged); the reference, one process, takes cuda:0.
c10::Device gpu(const std::string& device, const fsdp::Distributed* dist) {
  if (device != "cuda") return c10::Device(device);
  const int local_rank = dist ? dist->env.local_rank : 0;
  return c10::Device(c10::kCUDA,
                     static_cast<c10::DeviceIndex>(local_rank % torch::cuda::device_count()));
}

// --data/--data-tokens, and --init-from-hf's sizes from config.json (before any check of sizes).
std::string apply_data_and_hf_flags(const CLI::App& app, const std::string& data_tokens,
                                    gpt::TrainOptions& o) {
  if (!data_tokens.empty() && !o.data.empty()) {
    return "--data and --data-tokens both name training data; pass one";
  }
  if (data_tokens.empty() && o.data.empty()) {
    return "--data is required: a text file or a folder of text files (or --data-tokens FILE)";
  }
  o.data_is_tokens = !data_tokens.empty() || gpt::is_token_file(o.data);
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
  try {
    const gpt::GivenSizes given{app.count("--layers") > 0, app.count("--dim") > 0,
                                app.count("--heads") > 0, app.count("--seq") > 0,
                                app.count("--vocab") > 0};
    gpt::apply_hf_config(gpt::HfGpt2Config::read(o.init_from_hf), o.init_from_hf, given, o.model);
  } catch (const c10::Error& e) {
    return e.msg();
  }
  // Built block by block and filled from the files shard by shard: never the whole model at once.
  o.deferred_init = true;
  return "";
}

// This process's rank and the world size, from the launcher's variables (the rendezvous reads
// them again; a missing or malformed one is named here already).
std::pair<int, int> launch_rank() {
  const fsdp::LaunchEnv env = fsdp::LaunchEnv::from_environment();
  return {env.rank, env.world_size};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a byte-level GPT with fully sharded data parallelism (FSDP)."};
  gpt::TrainOptions o;
  bool reference = false;
  app.add_option("--layers", o.model.layers, "transformer blocks (one FSDP unit each)")
      ->check(integer_in(1, 1024));
  app.add_option("--dim", o.model.dim, "model width")->check(integer_in(1, 1 << 16));
  app.add_option("--heads", o.model.heads, "attention heads")->check(integer_in(1, 1 << 16));
  app.add_option("--seq", o.model.max_seq, "sequence length")->check(integer_in(2, 1 << 20));
  app.add_option("--batch", o.batch, "sequences per rank per step")
      ->check(integer_in(1, 1 << 20, "sequences per rank per step"));
  app.add_option("--steps", o.steps, "optimizer steps (0: none, e.g. --save-full of the initial model)")
      ->check(integer_in(0, kMaxCount));
  app.add_option("--lr", o.lr, "AdamW peak learning rate")->check(real_at_least(0));
  app.add_option("--warmup-steps", o.warmup_steps,
                 "linear warm-up steps, then cosine decay to lr/10 (0: constant lr)")
      ->check(integer_in(0, kMaxCount));
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay on matrices")
      ->check(real_at_least(0));
  std::string optimizer = "fused";
  app.add_option("--optimizer", optimizer,
                 "fused: AdamW in ATen's fused kernel (fsdp::optim::AdamW); torch: LibTorch's "
                 "torch::optim::AdamW (a loop of kernels per parameter); checkpoints of either "
                 "resume with the other")
      ->check(CLI::IsMember({"fused", "torch"}))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the initial weights and of the batches")
      ->check(integer_in(0, std::numeric_limits<int64_t>::max()));
  std::string data_tokens;
  app.add_option("--data", o.data,
                 "a text file or a folder of text files (bytes), or a .bin file of token ids");
  app.add_option("--data-tokens", data_tokens,
                 "pre-tokenized data: uint16 token ids, nanoGPT's .bin (no header) or llm.c's "
                 "(256-int32 header, magic 20240520)");
  app.add_option("--vocab", o.model.vocab_size,
                 "vocabulary size (default 256: bytes; --init-from-hf takes config.json's)")
      ->check(integer_in(2, 1 << 16));
  app.add_option("--init-from-hf", o.init_from_hf,
                 "start from a transformers GPT-2 folder (config.json, model.safetensors or its "
                 "index); sizes come from config.json; each rank reads only its shard");
  app.add_option("--export-hf", o.export_hf,
                 "after training, rank 0 writes a transformers GPT-2 folder here (config.json, "
                 "model.safetensors) for GPT2LMHeadModel.from_pretrained");
  app.add_option("--eval-tokens", o.eval_tokens,
                 "a .bin token file: the loss and logits on its rows of --seq + 1 tokens, before "
                 "the first step and after the last");
  app.add_option("--eval-out", o.eval_out,
                 "rank 0 writes those here (torch.load: inputs, targets, loss_initial, "
                 "logits_initial, loss_final, logits_final)");
  int64_t max_data_mb = o.max_data_bytes >> 20;
  app.add_option("--max-data-mb", max_data_mb, "read at most this many MiB of text")
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
  std::string strategy = "full";
  int shard_group_size = 0;
  app.add_option("--strategy", strategy, "full | grad_op | none | hybrid | hybrid_grad_op")
      ->check(CLI::IsMember({"full", "grad_op", "none", "hybrid", "hybrid_grad_op"}));
  app.add_option("--shard-group-size", shard_group_size,
                 "hybrid strategies: ranks per shard group (default: LOCAL_WORLD_SIZE)")
      ->check(integer_in(0, 1 << 20));
  std::string backward_prefetch = "pre";
  int limit_all_gathers = o.fsdp.limit_all_gathers();
  bool forward_prefetch = true, check_order = false;
  app.add_option("--backward-prefetch", backward_prefetch, "pre | post | none")
      ->check(CLI::IsMember({"pre", "post", "none"}));
  app.add_flag("--forward-prefetch,!--no-forward-prefetch", forward_prefetch,
               "all-gather the next unit before forward (default: on)");
  app.add_option("--limit-all-gathers", limit_all_gathers,
                 "rate limiter: units holding unsharded memory at once (0: no limit)")
      ->check(integer_in(0, 1 << 20));
  bool keep_after_forward = false;
  app.add_flag("--no-reshard-after-forward", keep_after_forward,
               "keep every unit's unsharded parameters from its forward to its backward (no "
               "second all-gather; more memory); default: the strategy's");
  app.add_flag("--check-order", check_order,
               "debug: check in the first step that all ranks run units in the same order");
  std::string param_dtype, reduce_dtype;
  bool activation_checkpointing = false;
  const auto dtypes = CLI::IsMember({"fp32", "bf16", "fp16"});
  app.add_option("--param-dtype", param_dtype,
                 "mixed precision: compute dtype of forward/backward and the all-gathers "
                 "(fp32 masters stay sharded; fp16 adds a sharded gradient scaler)")
      ->check(dtypes);
  app.add_option("--reduce-dtype", reduce_dtype,
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
  app.add_flag("--activation-checkpointing", activation_checkpointing,
               "recompute each block's forward in backward instead of keeping its activations");
  std::string device = "cpu";
  bool cpu_offload = false;
  app.add_option("--device", device,
                 "where the model computes: cpu | cuda (cuda:LOCAL_RANK % GPUs; --reference: "
                 "cuda:0) | cuda:N")
      ->check(device_name())
      ->capture_default_str();
  app.add_flag("--cpu-offload", cpu_offload,
               "keep shards, gradient shards and optimizer state in host memory (needs --device "
               "cuda; the optimizer steps on the CPU)");
  app.add_flag("--reference", reference, "train unsharded in this process on the global batch");
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
  std::string resume;
  app.add_option("--resume", resume,
                 "continue from the newest checkpoint in --checkpoint-dir (an error if it holds "
                 "none); '--resume auto': start at step 0 when it holds none yet")
      ->expected(0, 1)
      ->default_str("always")
      ->check(CLI::IsMember({"always", "auto"}));
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
  CLI11_PARSE(app, argc, argv);
  o.max_data_bytes = max_data_mb << 20;
  o.fused_optimizer = optimizer == "fused";
  o.resume = app.count("--resume") > 0;
  o.resume_if_none = resume == "auto";
  o.fsdp.strategy(fsdp::parse_sharding_strategy(strategy))
      .shard_group_size(shard_group_size)
      .backward_prefetch(fsdp::parse_backward_prefetch(backward_prefetch))
      .forward_prefetch(forward_prefetch)
      .limit_all_gathers(limit_all_gathers)
      .check_execution_order(check_order)
      .reshard_after_forward(keep_after_forward ? std::optional<bool>(false) : std::nullopt)
      .activation_checkpointing(activation_checkpointing)
      .cpu_offload(cpu_offload);
  auto& precision = o.fsdp.mixed_precision();
  if (!param_dtype.empty()) precision.param_dtype(fsdp::parse_dtype(param_dtype));
  if (!reduce_dtype.empty()) precision.reduce_dtype(fsdp::parse_dtype(reduce_dtype));

  std::string error = apply_data_and_hf_flags(app, data_tokens, o);
  if (error.empty()) error = check_flag_combinations(app, o, reference);
  if (error.empty()) error = check_device_flags(device, cpu_offload, reference);
  if (!error.empty()) {
    std::cerr << "gpt_train: error: " << error << std::endl;
    return 2;
  }

  try {
    // Files and folders, before the rendezvous and any work; rank 0 holds --checkpoint-dir.
    const auto [rank, world_size] = reference ? std::pair{0, 1} : launch_rank();
    gpt::check_paths(o, rank, world_size);
    const auto checkpoint_dir_lock = gpt::lock_checkpoint_dir(o, rank);
    if (rank == 0) gpt::check_checkpoint_dir(o);
    std::shared_ptr<fsdp::Distributed> dist;
    if (!reference) dist = fsdp::init_distributed();
    // --device cpu leaves it unset: the CPU, the parameters' device (the reference reads it too).
    if (device != "cpu") o.fsdp.device(gpu(device, dist.get()));
    auto result = gpt::train(o, dist.get());
    if (!result.sample.empty() && (!dist || dist->rank() == 0)) {
      std::cout << "--- sample ---\n" << result.sample << "\n--------------\n";
    }
    if (!result.losses.empty() && (!dist || dist->rank() == 0)) {
      std::printf("loss: first %.4f last %.4f\n", result.losses.front(), result.losses.back());
    }
  } catch (const c10::Error& e) {
    std::cerr << "gpt_train: error: " << fsdp::name_peer_ranks(e.what_without_backtrace())
              << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "gpt_train: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
