#pragma once
// gpt_train --eval-tokens FILE: a fixed batch (the rows of seq + 1 tokens of a .bin token file)
// on which the model's loss and logits are measured before the first step and after the last, so
// that another implementation (transformers) can be compared with gpt_train on the same input.

#include "gpt.h"

#include <fsdp/fully_shard.h>

#include <string>

namespace gpt {

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

}  // namespace gpt
