#include "step_log.h"

#include "mib_text.h"
#include "run_paths.h"

#include "output_errors.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace gpt {

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
          {"loss_scale", r.loss_scale},
          {"skipped", r.skipped}};
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
  write_line(to_json(record));
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
