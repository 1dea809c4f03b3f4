#pragma once
// The training run of gpt_train, shared with the tests: the model set up (sharded or as the
// unsharded reference, its set-up memory bounded), the steps from the first to --steps, each
// logged, and what is measured on the trained model (--eval-tokens, --sample).

#include "gpt.h"
#include "options.h"
#include "step.h"
#include "step_summary.h"

#include <fsdp/device_mesh.h>
#include <fsdp/comm_stats.h>
#include <fsdp/distributed.h>
#include <fsdp/fully_shard.h>
#include <fsdp/memory.h>
#include <fsdp/muon.h>
#include <fsdp/replica_quorum.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpt {

// gpt_train's model before the first step: checked --freeze patterns, the GPT built (sharded
// unless this is the reference; --deferred-init: block by block) and its initial weights
// (--init-from, --init-from-hf).
/// Every --freeze pattern must match a parameter name (with --deferred-init, names relative to a
/// block): a typo would otherwise train the whole model silently. Throws naming the pattern.
void check_freeze_patterns(const TrainOptions& o);

/// Whether --freeze keeps the parameter `name` (a full name, or one relative to a block) frozen.
bool is_frozen(const TrainOptions& o, const std::string& name);

/// Sets requires_grad false on the parameters of `model` (a whole GPT) that --freeze names.
void freeze_parameters(const TrainOptions& o, torch::nn::Module& model);

/// The GPT of `o` with its --freeze parameters frozen, sharded over `dist` (moved to
/// fsdp.device()), or unsharded on the compute device when `dist` is null. Deferred: built and
/// sharded block by block, each block initialised (and frozen) by its own parameter names just
/// before it is sharded.
fsdp::Unit<GPT> build_model(const TrainOptions& o, fsdp::Distributed* dist,
                            fsdp::DeviceMesh* mesh = nullptr);
/// --tp N: the world as a mesh dp x tp (dp = world / N), tensor parallelism over consecutive
/// ranks; nullptr without --tp (or for the reference). FSDP's strategy applies over dp (hybrid:
/// replicate x shard inside it, 3-D).
std::shared_ptr<fsdp::DeviceMesh> make_mesh(const TrainOptions& o, fsdp::Distributed* dist);

/// Loads --init-from or --init-from-hf into the model (each rank its shard); no-op without them.
void load_initial_weights(const TrainOptions& o, fsdp::Unit<GPT>& model);

// Tensor memory of gpt_train's set-up: building and sharding the model (deferred: block by
// block, then the root unit, whose own parameters exist whole until it is sharded), then loading
// its shards. Loading is bounded by the sharded model plus its largest parameter; building by the
// sharded model plus the root unit's parameters (fsdp::fully_shard_deferred's guarantee).
class SetupMemory {
 public:
  /// Before the model is built: what is live already (the corpus, ...) and a fresh peak.
  explicit SetupMemory(const c10::Device& device);

  /// After the build: its peak, and a fresh peak for the load.
  void end_build();

  /// After the load: the metrics line of the set-up ("setup": "init-from-hf") with the build's
  /// and the load's peaks and the bound they are measured against.
  nlohmann::json record(fsdp::Unit<GPT>& model) const;

 private:
  c10::Device device_;
  int64_t before_bytes_ = 0;      // live before the model is built
  int64_t build_peak_bytes_ = 0;  // above before_bytes_
};

/// Rank 0's line of the set-up's memory against its bound.
void print_setup_memory(const nlohmann::json& setup);

// What gpt_train reports of each step: a JSON line in --metrics (per rank), and every --log-every
// steps a progress line on rank 0 with every rank's memory.
struct StepRecord {
  int64_t step = 0;
  double loss = 0, step_ms = 0, tokens_per_s = 0;
  fsdp::MemoryStats memory;
  fsdp::CommStats comm;  // bytes of this step
  double loss_scale = 0;  // fp16: the gradient scaler's scale after the step (0: no scaler)
  bool skipped = false;   // fp16: the step was skipped because some rank's gradients overflowed
  double optimizer_ms = 0;  // the optimizer's step within step_ms
  std::optional<double> grad_norm;  // --clip: the global gradient norm before clipping
  std::optional<fsdp::optim::MuonWork> muon;  // --optimizer muon: this rank's Newton-Schulz work
  std::optional<fsdp::ReplicaStep> replicas;  // --fault-tolerant: replicas alive, batch share
};

class StepLog {
 public:
  /// Opens this rank's --metrics file (none without the flag); throws if it cannot be written.
  StepLog(const TrainOptions& o, fsdp::Distributed* dist, int rank);

  /// The set-up's memory record, the line before the steps'.
  void write_setup(const nlohmann::json& setup);
  /// Any other line (--fault-tolerant: a replacement's join, the final state's hashes).
  void write_extra(const nlohmann::json& line) { write_line(line); }
  /// The step's JSON line, and the progress line when one is due (a collective: every rank
  /// calls it for every step).
  void write(const StepRecord& record);

 private:
  void write_line(const nlohmann::json& line);

  const TrainOptions& options_;
  fsdp::Distributed* dist_;
  std::string metrics_path_;  // this rank's --metrics file
  std::ofstream metrics_;
};

// gpt_train --eval-tokens FILE: a fixed batch (the rows of seq + 1 tokens of a .bin token file)
// on which the model's loss and logits are measured before the first step and after the last, so
// that another implementation (transformers) can be compared with gpt_train on the same input.
struct EvalBatch {
  torch::Tensor inputs, targets;  // [rows, seq] int64: consecutive rows of seq + 1 tokens

  /// As many whole rows of seq + 1 tokens as `path` holds (at least one).
  static EvalBatch load(const std::string& path, int64_t vocab_size, int64_t seq);
};

struct EvalResult {
  double loss = 0;       // mean next-token cross-entropy over the batch
  torch::Tensor logits;  // [rows, seq, vocab] float, on the CPU
};

/// The model's loss and logits on `batch` (every rank runs the same forward: a collective when
/// sharded).
EvalResult evaluate(fsdp::Unit<GPT>& model, const EvalBatch& batch, const c10::Device& device);

/// Prints both losses and, unless `path` is empty (no --eval-out), writes the batch and both
/// results there (torch.load: inputs, targets, loss_initial, logits_initial, loss_final,
/// logits_final).
void write_eval(const std::string& path, const EvalBatch& batch, const EvalResult& initial,
                const EvalResult& final);

// gpt_train --sample N --prompt TEXT: bytes generated by the trained model.
/// The prompt followed by `n` bytes sampled at temperature 0.8 from a fixed `seed`, each from
/// the last `max_seq` bytes. Every rank runs the same forwards, which the sharded model needs
/// (each forward all-gathers on all ranks).
std::string generate(fsdp::Unit<GPT>& model, const c10::Device& device, const std::string& prompt,
                     int64_t n, int64_t max_seq, uint64_t seed);

// The steps of a gpt_train run, from the first (0, or the resumed checkpoint's) to --steps: each
// timed and measured, logged, checked for a non-finite loss, and checkpointed when one is due.
/// The bytes of each collective counted between `before` and `after` (fsdp::comm_stats()).
fsdp::CommStats comm_difference(const fsdp::CommStats& after, const fsdp::CommStats& before);

/// Trains steps [first_step, ctx.options.steps), adding each one's record (loss over the global
/// batch, time, this rank's memory and collective bytes) to `summary`, and to `records` when
/// the options keep them. Throws when the losses stop being finite (nonfinite_guard.h), or when the model is not
/// finite at the end.
void run_steps(const StepContext& ctx, int64_t first_step, StepLog& log, StepSummary& summary,
               std::vector<StepRecord>& records);

// The training loop of gpt_train, shared with the tests: the same code trains sharded (FSDP over
// the world process group) or as the unsharded single-process reference on the global batch.
struct TrainResult {
  std::vector<double> losses;  // mean over the global batch, per step
  std::vector<std::pair<std::string, torch::Tensor>> final_params;  // full, original names
  std::string sample;
  std::vector<StepRecord> steps;  // this rank's measurements of each step
  StepSummary summary;             // the same in bounded memory (losses and steps may be off)
};

/// Sharded training when `dist` is set (--pp: pipeline_run.h), otherwise the unsharded reference.
/// --fault-tolerant: `replicas` set, `dist` is this replica's ranks (include/fsdp/replica_quorum.h).
TrainResult train(const TrainOptions& options, fsdp::Distributed* dist,
                  fsdp::ReplicaQuorum* replicas = nullptr);

}  // namespace gpt
