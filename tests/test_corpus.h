#pragma once
// The GPT's tests' corpus: dist_env.h's corpus_dir() loaded once (its first MiB) as the GPT
// example's ByteCorpus, for tests that draw batches from it directly.

#include "data.h"
#include "dist_env.h"

namespace fsdp_test {

inline const gpt::ByteCorpus& test_corpus() {
  static const auto instance = gpt::ByteCorpus::load(corpus_dir(), 1 << 20, 64);
  return instance;
}

}  // namespace fsdp_test
