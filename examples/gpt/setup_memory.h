#pragma once
// Tensor memory of gpt_train's set-up: building and sharding the model (deferred: block by
// block, then the root unit, whose own parameters exist whole until it is sharded), then loading
// its shards. Loading is bounded by the sharded model plus its largest parameter; building by the
// sharded model plus the root unit's parameters (fsdp::fully_shard_deferred's guarantee).

#include "gpt.h"

#include <fsdp/fully_shard.h>

#include <nlohmann/json.hpp>

#include <cstdint>

namespace gpt {

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

}  // namespace gpt
