#include "setup_memory.h"

#include "mib_text.h"

#include <fsdp/memory.h>
#include <fsdp/param_loader.h>

#include <c10/util/accumulate.h>

#include <algorithm>
#include <cstdio>

namespace gpt {

namespace {

struct ModelBytes {
  int64_t sharded = 0;  // this rank's shards (the whole model when unsharded)
  int64_t root = 0;     // the root unit's unsharded parameters
  int64_t largest = 0;  // the largest parameter, unsharded, in fp32 (the masters' dtype)
};

ModelBytes model_bytes(fsdp::Unit<GPT>& model) {
  ModelBytes bytes;
  for (const auto& unit : model.units()) {
    bytes.sharded += unit.shard_numel * unit.element_size;
    if (unit.is_root) bytes.root += unit.numel * unit.element_size;
  }
  if (!model.is_sharded()) {
    for (const auto& item : model->named_parameters()) bytes.sharded += item.value().nbytes();
  }
  for (const auto& [name, shape] : fsdp::param_shapes(model)) {
    bytes.largest = std::max<int64_t>(bytes.largest, c10::multiply_integers(shape) * 4);
  }
  return bytes;
}

}  // namespace

SetupMemory::SetupMemory(const c10::Device& device) : device_(device) {
  fsdp::reset_peak_memory(device_);
  before_bytes_ = fsdp::memory_stats(device_).current_bytes;
}

void SetupMemory::end_build() {
  build_peak_bytes_ = fsdp::memory_stats(device_).peak_bytes - before_bytes_;
  fsdp::reset_peak_memory(device_);
}

nlohmann::json SetupMemory::record(fsdp::Unit<GPT>& model) const {
  const ModelBytes bytes = model_bytes(model);
  const int64_t load_peak = fsdp::memory_stats(device_).peak_bytes - before_bytes_;
  return {{"setup", "init-from-hf"},
          {"build_peak_bytes", build_peak_bytes_},
          {"load_peak_bytes", load_peak},
          {"setup_peak_bytes", std::max(build_peak_bytes_, load_peak)},
          {"sharded_model_bytes", bytes.sharded},
          {"largest_param_bytes", bytes.largest},
          {"root_unit_bytes", bytes.root},
          {"setup_bound_bytes", bytes.sharded + bytes.largest}};
}

void print_setup_memory(const nlohmann::json& setup) {
  std::printf("set-up (--init-from-hf): peak %s per rank (build %s, load %s), bound %s (sharded "
              "model %s + largest parameter %s)\n",
              mib(setup["setup_peak_bytes"].get<int64_t>()).c_str(),
              mib(setup["build_peak_bytes"].get<int64_t>()).c_str(),
              mib(setup["load_peak_bytes"].get<int64_t>()).c_str(),
              mib(setup["setup_bound_bytes"].get<int64_t>()).c_str(),
              mib(setup["sharded_model_bytes"].get<int64_t>()).c_str(),
              mib(setup["largest_param_bytes"].get<int64_t>()).c_str());
  std::fflush(stdout);
}

}  // namespace gpt
