#pragma once
// Training data: the bytes of a text file or of a folder of text files, or the ids of a
// pre-tokenized .bin file (token_file.h), and the global batch of each step as a pure function of
// (corpus, seed, step, global batch size), so that any world size that splits the same global
// batch trains on the very same rows.

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace gpt {

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
  const torch::Tensor& tokens() const { return tokens_; }  // 1-D: uint8 bytes or uint16 ids

  /// Rows [first_row, first_row + rows) of the global batch of `step`: inputs and next-byte
  /// targets, each [rows, seq] int64. Row i starts at an offset drawn from (seed, step, i) only.
  std::pair<torch::Tensor, torch::Tensor> batch(uint64_t seed, int64_t step, int64_t first_row,
                                                int64_t rows, int64_t seq) const;

 private:
  explicit Corpus(torch::Tensor tokens) : tokens_(std::move(tokens)) {}
  torch::Tensor tokens_;
};

using ByteCorpus = Corpus;  // its name from before token files

}  // namespace gpt
