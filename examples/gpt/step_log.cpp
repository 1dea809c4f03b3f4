// What a run reports: its setup's memory, one metrics line per step and the progress line.
#include "trainer.h"

#include "checkpointing.h"
#include "data.h"
#include "hf_folder.h"
#include "options.h"
#include "step.h"
#include "tensor_parallel_plan.h"

#include <fsdp/memory.h>
#include <fsdp/param_loader.h>
#include <fsdp/state_dict.h>
#include <fsdp/tensor_file.h>
#include <fsdp/trace.h>

#include <algorithm>
#include <c10/core/DeviceGuard.h>
#include <c10/util/accumulate.h>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <torch/cuda.h>
#include <vector>

#include <fstream>

namespace gpt {

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

namespace {

nlohmann::json to_json(const StepRecord& r) {
  return {{"step", r.step},
          {"loss", r.loss},
          {"step_ms", r.step_ms},
          {"tokens_per_s", r.tokens_per_s},
          {"mem_current_bytes", r.memory.current_bytes},
          {"mem_peak_bytes", r.memory.peak_bytes},
          {"mem_reserved_bytes", r.memory.reserved_bytes},
          {"bytes_all_gather", r.comm.all_gather_bytes},
          {"bytes_reduce_scatter", r.comm.reduce_scatter_bytes},
          {"bytes_all_reduce", r.comm.all_reduce_bytes},
          {"bytes_all_to_all", r.comm.all_to_all_bytes},  // Muon's exchanges
          {"bytes_tp_all_gather", r.comm.tp_all_gather_bytes},  // tensor parallelism's (--tp)
          {"bytes_tp_reduce_scatter", r.comm.tp_reduce_scatter_bytes},
          {"bytes_tp_all_reduce", r.comm.tp_all_reduce_bytes},
          {"bytes_pp_send", r.comm.pp_send_bytes},  // pipeline parallelism's (--pp)
          {"loss_scale", r.loss_scale},
          {"skipped", r.skipped}};
}

// The optimizer's share of the step; with Muon, this rank's Newton-Schulz work (bench/ compares
// the ranks' shares of the orthogonalization).
void add_optimizer_work(nlohmann::json& line, const StepRecord& r) {
  line["optimizer_ms"] = r.optimizer_ms;
  if (r.replicas) {
    line["replicas_alive"] = r.replicas->replicas_alive;
    line["batch_share"] = r.replicas->batch_share;  // this replica's share of the global batch
  }
  if (r.grad_norm) line["grad_norm"] = *r.grad_norm;
  if (!r.muon) return;
  line["muon_ns_matrices"] = r.muon->matrices;
  line["muon_ns_flops"] = r.muon->flops;
}

// Rank 0 prints one line with every rank's memory (a small all-reduce gathers it).
void print_progress(const StepRecord& r, int64_t steps, fsdp::Distributed* dist) {
  const int world = dist ? dist->world_size() : 1;
  auto memory = torch::zeros({world, 2}, torch::kFloat64);
  memory[dist ? dist->rank() : 0][0] = static_cast<double>(r.memory.current_bytes);
  memory[dist ? dist->rank() : 0][1] = static_cast<double>(r.memory.peak_bytes);
  if (dist) fsdp::all_reduce_sum(*dist->world, memory);
  if (dist && dist->rank() != 0) return;
  std::printf("step %5lld/%lld | loss %.4f | %8.0f tok/s | %6.1f ms/step | mem", (long long)r.step + 1,
              (long long)steps, r.loss, r.tokens_per_s, r.step_ms);
  for (int i = 0; i < world; ++i) {
    std::printf(" r%d %s (peak %s)", i, mib(memory[i][0].item<int64_t>()).c_str(),
                mib(memory[i][1].item<int64_t>()).c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

StepLog::StepLog(const TrainOptions& o, fsdp::Distributed* dist, int rank)
    : options_(o), dist_(dist) {
  if (o.metrics_path.empty()) return;
  metrics_path_ = for_rank(o.metrics_path, rank);
  metrics_.open(metrics_path_);
  TORCH_CHECK(metrics_, "--metrics: cannot write ", metrics_path_);
}

void StepLog::write_setup(const nlohmann::json& setup) { write_line(setup); }

void StepLog::write(const StepRecord& record) {
  nlohmann::json line = to_json(record);
  add_optimizer_work(line, record);
  write_line(line);
  const int64_t done = record.step + 1;
  if (options_.log_every > 0 && (done % options_.log_every == 0 || done == options_.steps)) {
    print_progress(record, options_.steps, dist_);
  }
}

void StepLog::write_line(const nlohmann::json& line) {
  if (!metrics_.is_open()) return;
  errno = 0;
  metrics_ << line.dump() << "\n" << std::flush;
  // A full disk or an I/O error fails the flush: the line (and the run's record) would be lost.
  TORCH_CHECK(metrics_.good(), output_failed("--metrics", metrics_path_,
                                             errno ? std::strerror(errno) : "the write failed"));
}

}  // namespace gpt
