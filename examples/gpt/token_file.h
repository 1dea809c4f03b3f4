#pragma once
// Pre-tokenized training data: a .bin file of uint16 token ids, as nanoGPT's prepare.py writes
// (train.bin: a raw array of little-endian uint16 ids, no header) or as llm.c writes (a header of
// 256 int32, magic 20240520, version 1, the token count; then the uint16 ids). A file whose first
// int32 is llm.c's magic is read as llm.c's; a nanoGPT file cannot start so with a GPT-2
// vocabulary (the magic's low half, 55224, is no GPT-2 id).

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace gpt {

/// The first `max_tokens` token ids of `path` (1-D, uint16). Throws naming `flag` (the flag that
/// named the file), the file and the cause:
/// an odd byte count, a truncated llm.c file, an id >= `vocab_size` (with its position), fewer
/// than `min_tokens` ids.
torch::Tensor read_token_file(const std::string& path, const std::string& flag, int64_t vocab_size,
                              int64_t max_tokens, int64_t min_tokens);

/// Whether --data names a token file (by its .bin ending) rather than text.
bool is_token_file(const std::string& path);

}  // namespace gpt
