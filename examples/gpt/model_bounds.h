#pragma once
// The largest sizes gpt_train builds, whether they come from its flags (--layers, --dim, ...) or
// from --init-from-hf's config.json: one bound for each, so that training and planning refuse
// the same model, and every product of them fits int64 (the planner counts bytes in int64).

#include <cstdint>

namespace gpt {

constexpr int64_t kMaxLayers = 1024;            // --layers, n_layer
constexpr int64_t kMaxDim = int64_t{1} << 16;    // --dim, n_embd
constexpr int64_t kMaxHeads = int64_t{1} << 16;  // --heads, n_head
constexpr int64_t kMaxSeq = int64_t{1} << 20;    // --seq, n_positions
// config.json's n_positions (wpe's rows) may exceed the run's --seq; bounded so that wpe's
// elements (n_positions x n_embd) stay far within int64, where the planner refuses them by size.
constexpr int64_t kMaxPositions = int64_t{1} << 40;
constexpr int64_t kMaxVocab = int64_t{1} << 16;  // --vocab, vocab_size (token ids are uint16)
constexpr int64_t kMaxBatch = int64_t{1} << 20;  // --batch, each of --batches

}  // namespace gpt
