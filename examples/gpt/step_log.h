#pragma once
// What gpt_train reports of each step: a JSON line in --metrics (per rank), and every --log-every
// steps a progress line on rank 0 with every rank's memory.

#include "train_options.h"

#include <fsdp/comm_stats.h>
#include <fsdp/distributed.h>
#include <fsdp/memory.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <string>

namespace gpt {

struct StepRecord {
  int64_t step = 0;
  double loss = 0, step_ms = 0, tokens_per_s = 0;
  fsdp::MemoryStats memory;
  fsdp::CommStats comm;  // bytes of this step
  double loss_scale = 0;  // fp16: the gradient scaler's scale after the step (0: no scaler)
  bool skipped = false;   // fp16: the step was skipped because some rank's gradients overflowed
};

class StepLog {
 public:
  /// Opens this rank's --metrics file (none without the flag); throws if it cannot be written.
  StepLog(const TrainOptions& o, fsdp::Distributed* dist, int rank);

  /// The set-up's memory record, the line before the steps'.
  void write_setup(const nlohmann::json& setup);
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

}  // namespace gpt
