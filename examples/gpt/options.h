#pragma once
// What gpt_train runs (TrainOptions: the model, the data, the sharding and every output, as the
// command line or a test sets them), and how it names what it prints and writes: byte counts in
// MiB, and an output that cannot be written as one line naming the flag.

#include "gpt.h"

#include <fsdp/error_text.h>
#include <fsdp/options.h>

#include <c10/util/Exception.h>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace gpt {

// What gpt_train runs: the model, the data, the sharding and every output, as the command line
// (command_line.h) or a test sets them.
struct TrainOptions {
  GPTConfig model;
  // Sharding strategy, prefetch, rate limiter; fsdp.device() is where the model computes, the
  // reference's too (unset: the CPU), and the batches go there.
  fsdp::FullyShardOptions fsdp;
  int64_t batch = 8;  // sequences per data-parallel rank; the global batch is (world_size / tp) × batch
  // --tp: tensor-parallel ranks (consecutive ranks: one host's), the model split over them
  // (tensor_parallel_plan.h); FSDP shards over the world_size / tp data-parallel ranks.
  int tp = 1;
  // --pp P: pipeline parallelism over P ranks (the mesh pp x dp, dp = world / P), the model split
  // into P x stages_per_rank stages (pipeline_run.h); 0: no pipeline.
  int pp = 0;
  std::string pp_schedule = "1f1b";  // gpipe | 1f1b | interleaved-1f1b | zbv
  int stages_per_rank = 1;           // V: interleaved 1F1B (any), ZBV (2)
  int microbatches = 1;              // --microbatches M: each of --batch rows per dp rank
  int64_t steps = 100;
  double lr = 1e-3;          // AdamW's peak learning rate
  int64_t warmup_steps = 0;  // linear warm-up, then cosine decay to a tenth (0: constant lr)
  double weight_decay = 0.1;  // decoupled, on matrices and embeddings (AdamW's; Muon's too)
  bool fused_optimizer = true;  // fsdp::optim::AdamW (ATen's fused kernel), else LibTorch's AdamW
  // --optimizer muon: fsdp::optim::Muon steps the blocks' matrices (fsdp::optim::split_for_muon),
  // the fused AdamW (lr, weight_decay) the rest: embeddings, the head, norms, biases.
  bool muon = false;
  double muon_lr = 0.02;  // Muon's peak learning rate (Keller Jordan's recipe); lr stays AdamW's
  std::string muon_adjust_lr = "original";  // torch.optim.Muon's adjust_lr_fn: or match_rms_adamw
  // Step each unit as its gradient lands, during the last micro-batch's backward
  // (fsdp::optim::StepInBackward); on by default with --cpu-offload (train_step.cpp says when it
  // applies).
  bool step_in_backward = false;
  uint64_t seed = 1234;
  std::string data;
  std::string data_flag = "--data";  // the flag that named `data` (--data or --data-tokens)
  bool data_is_tokens = false;  // data is a .bin file of uint16 token ids (token_file.h)
  int64_t max_data_bytes = 8 << 20;
  std::string metrics_path;  // JSON lines; "{rank}" is replaced by the rank
  int log_every = 0;         // progress line every N steps on rank 0 (0: none)
  int64_t sample_bytes = 0;  // generate this many bytes after training (0: none)
  std::string sample_prompt = "def ";
  int reference_world_size = 1;  // reference only: the world size whose global batch to train on
  std::string init_from;     // full parameters to start from (torch.save dict of name -> tensor)
  std::string save_full;     // rank 0 writes the full parameters here after training
  std::string dump_batches;  // rank 0 writes every global batch here before training
  std::string trace;         // Chrome trace of one step (the third, or the last if fewer)
  int64_t grad_accum = 1;    // micro-batches per step (each world_size × batch rows)
  bool no_sync = false;      // accumulate without communication (one reduction per step)
  double clip = 0;           // clip the global gradient norm to this (0: off)
  double loss_scale = 65536;  // fp16: the gradient scaler's initial scale
  bool deferred_init = false;  // build and shard block by block (fsdp::fully_shard_deferred)
  std::vector<std::string> freeze;  // parameters whose name contains one of these do not train
  std::string checkpoint_dir;  // sharded checkpoints: DIR/step-NNNNNNNN, DIR/latest
  int64_t save_every = 0;      // save every N steps and after the last (0: never)
  bool async_save = false;     // save with fsdp::save_checkpoint_async (written while training goes on)
  int64_t staging_budget = 0;  // its staging arena's bytes per rank (0: one rank's shards)
  bool resume = false;         // continue from the newest checkpoint in checkpoint_dir
  bool resume_if_none = false;  // with resume: start at step 0 when checkpoint_dir holds none yet
  bool reset_optimizer = false;  // with resume: load the parameters only; AdamW starts afresh
  // --fault-tolerant (docs/fault-tolerance.md): replicas of --shard-group-size ranks that survive
  // a lost peer; a replica's silence longer than the vote timeout counts as its loss.
  bool fault_tolerant = false;
  double replica_vote_timeout_s = 10;
  std::vector<int> test_kill_ranks;      // tests: these global ranks SIGKILL themselves ...
  int64_t test_kill_step = -1;           // ... at the start of this step (the first start only)
  int test_kill_in_transfer_rank = -1;   // tests: this rank's first replacement dies receiving
  int64_t test_pause_per_step_ms = 0;    // tests: each step ends with this long a sleep
  int64_t test_pause_after_shard_files_ms = 0;  // tests: each save sleeps this long before its metadata
  int64_t max_nonfinite_steps = 3;  // stop (an error) after this many consecutive NaN/inf losses
  std::string init_from_hf;  // a transformers GPT-2 or Llama folder to start from (hf_folder.h)
  std::string export_hf;     // rank 0 writes a transformers folder of the model here after training
  std::string eval_tokens;   // a .bin token file: loss and logits on it before and after training
  std::string eval_out;      // rank 0 writes those here (torch.load: inputs, loss_*, logits_*)
  // TrainResult::final_params: every rank gathers a full copy of the trained model (the tests
  // compare it). gpt_train turns it off: it never reads them, and at 1.3 B parameters the copy is
  // 5 GB and ~5 s of every run.
  bool gather_final_params = true;
  // TrainResult::steps and ::losses: a record per step (the tests read them). gpt_train turns it
  // off: its summary reads TrainResult::summary, whose memory is bounded however long the run.
  bool keep_step_records = true;
};

/// Where the model computes and the batches go: fsdp.device(), else the CPU.
inline c10::Device compute_device(const TrainOptions& o) {
  return o.fsdp.device().value_or(c10::Device(c10::kCPU));
}

// Byte counts as gpt_train prints them: "12.3 MiB"; a GiB for flags given in GiB.
inline constexpr double kGiB = 1024.0 * 1024 * 1024;

inline std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", bytes / 1048576.0);
  return text;
}

// A file gpt_train writes (--metrics, --trace, --save-full, --dump-batches, --eval-out,
// --export-hf) that cannot be written (a full disk, an I/O error) ends the run with one line
// naming the flag, the path, the cause and the fix: never a C++ backtrace, never an exit 0 with
// the output lost.
/// The one-line error of an output that could not be written.
inline std::string output_failed(const std::string& flag, const std::string& path,
                                 const std::string& cause) {
  return flag + " " + path + ": cannot write it (" + cause + "); free space there or pass " +
         "another " + flag;
}

/// Runs `write` (which writes `path`); any error it throws becomes output_failed's line.
template <class Write>
void write_output(const std::string& flag, const std::string& path, Write&& write) {
  try {
    write();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, output_failed(flag, path, fsdp::message_of(e)));
  }
}

}  // namespace gpt
