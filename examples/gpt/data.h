#pragma once
// gpt_train's training data: the bytes of a text file or of a folder of text files, or the ids of
// a pre-tokenized .bin file (nanoGPT's or llm.c's), the global batch of each step as a pure
// function of (corpus, seed, step, global batch size), and --dump-batches, those batches written
// for a peer implementation.

#include "options.h"

#include <cstdint>
#include <string>
#include <torch/torch.h>

namespace gpt {

// Pre-tokenized training data: a .bin file of token ids, as nanoGPT's prepare.py writes
// (train.bin: a raw array of little-endian uint16 ids, no header) or as llm.c writes (a header of
// 256 int32, magic 20240520, version 1 for uint16 ids (GPT-2) or 2 for uint32 ids (Llama 3), the
// token count; then the ids). A file whose first
// int32 is llm.c's magic is read as llm.c's; a nanoGPT file cannot start so with a GPT-2
// vocabulary (the magic's low half, 55224, is no GPT-2 id).
/// The token ids in the first `max_bytes` of ids of `path` (1-D, uint16 or uint32). Throws naming `flag` (the flag that
/// named the file), the file and the cause:
/// an odd byte count, a truncated llm.c file, an id >= `vocab_size` (with its position), fewer
/// than `min_tokens` ids.
torch::Tensor read_token_file(const std::string& path, const std::string& flag, int64_t vocab_size,
                              int64_t max_bytes, int64_t min_tokens);

/// Whether --data names a token file (by its .bin ending) rather than text.
bool is_token_file(const std::string& path);

// Training data: the bytes of a text file or of a folder of text files, or the ids of a
// pre-tokenized .bin file (token_file.h), and the global batch of each step as a pure function of
// (corpus, seed, step, global batch size), so that any world size that splits the same global
// batch trains on the very same rows.
class Corpus {
 public:
  /// Reads `path` (a file, or every text file below a folder in sorted path order, skipping
  /// binaries and entries that are not regular files) up to `max_bytes`. Throws naming the path
  /// if it holds too little text, and naming the file or folder below it that cannot be read (a
  /// folder is read whole or not at all: never silently less of it).
  static Corpus load(const std::string& path, int64_t max_bytes, int64_t min_bytes);
  /// The token ids of a .bin file (read_token_file), up to `max_bytes` of it; every id is checked
  /// to be below `vocab_size`.
  /// `flag` names the flag of `path` in messages.
  static Corpus load_tokens(const std::string& path, const std::string& flag, int64_t vocab_size,
                            int64_t max_bytes, int64_t min_tokens);

  int64_t size() const { return tokens_.numel(); }
  const torch::Tensor& tokens() const { return tokens_; }  // 1-D: uint8 bytes, uint16/uint32 ids

  /// Rows [first_row, first_row + rows) of the global batch of `step`: inputs and next-byte
  /// targets, each [rows, seq] int64. Row i starts at an offset drawn from (seed, step, i) only.
  std::pair<torch::Tensor, torch::Tensor> batch(uint64_t seed, int64_t step, int64_t first_row,
                                                int64_t rows, int64_t seq) const;

 private:
  explicit Corpus(torch::Tensor tokens) : tokens_(std::move(tokens)) {}
  torch::Tensor tokens_;
};

using ByteCorpus = Corpus;  // its name from before token files

// gpt_train --dump-batches FILE: the global batches of the whole run, for a peer implementation
// to train on the same data.
/// Writes {"inputs": [steps, global_rows, seq], "targets": [steps, global_rows, seq]} as int64
/// to o.dump_batches, where global_rows = grad_accum × world × batch (micro-batch m: rows
/// [m·W·B, (m+1)·W·B)).
void dump_batches(const TrainOptions& o, const Corpus& corpus, int world);

}  // namespace gpt
