// The CPU collectives measured the way nccl-tests measures NCCL's: for all-gather, reduce-scatter
// and all-reduce over a range of sizes, the time per call (the slowest rank's average), algorithm
// bandwidth (size / time) and bus bandwidth (algbw * (W-1)/W for all-gather and reduce-scatter,
// * 2(W-1)/W for all-reduce), for the ring over Gloo's send/recv, the shared-memory collectives and
// Gloo's own collectives on the same process group; against a single-thread memcpy of the same
// sizes, measured by rank 0 in the same run while the other ranks wait. Also per CPU second (the
// busiest rank's process CPU time per call, Gloo's threads included): on a machine shared with
// other jobs, wall time also counts the time a rank waits for a core. "size" is nccl-tests': the
// full buffer (all-gather's output, reduce-scatter's input, the all-reduced tensor), fp32.
// All-gather runs in place (the shard is the full buffer's own chunk), as FSDP calls it.
// shm_thread: the shared-memory collective handed to a communication thread and waited for, as
// FSDP runs a collective it overlaps with compute: against shm, the cost of the hand-off.
//
//   fsdprun --nproc-per-node W collectives_bench --out results.jsonl   (one JSON object a line)
#include "comm/collectives.h"
#include "comm/comm_thread.h"
#include "comm/shm_collectives.h"

#include <fsdp/distributed.h>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 256 << 20;
  int factor = 4;
  double bytes_per_size = 1 << 30;  // how many bytes each measurement moves (iterations = this / size)
  double seconds_per_size = 1.0;    // at most about this long (estimated from the first call)
  std::vector<std::string> impls{"shm", "ring", "gloo"};
  std::vector<std::string> ops{"all_gather", "reduce_scatter", "all_reduce"};
  std::string out;
  int64_t shm_chunk_bytes = fsdp::kShmChunkBytes;
};

// One collective call on tensors allocated once per size.
using Call = std::function<void()>;

struct Buffers {
  at::Tensor full, shard;
  at::Tensor own;  // full's chunk of this rank
  std::vector<at::Tensor> chunks;
};

Buffers buffers_for(int64_t bytes, int world_size, int rank) {
  const int64_t s = std::max<int64_t>(1, bytes / 4 / world_size);
  Buffers b;
  b.full = at::ones({s * world_size});
  b.shard = at::ones({s});
  b.chunks = b.full.chunk(world_size);
  b.own = b.chunks[rank];
  return b;
}

Call collective_call(const std::string& impl, const std::string& op, fsdp::Collectives* ours,
                     c10d::Backend& gloo, Buffers& b) {
  if (impl == "shm_thread") {
    static fsdp::CommThread thread;
    Call direct = collective_call("shm", op, ours, gloo, b);
    return [direct] { thread.submit(direct).wait(); };
  }
  if (impl != "gloo") {
    if (op == "all_gather") return [=, &b] { ours->all_gather(b.full, b.own); };
    if (op == "reduce_scatter") return [=, &b] { ours->reduce_scatter_sum(b.shard, b.full); };
    return [=, &b] { ours->all_reduce_sum(b.full); };
  }
  if (op == "all_gather") {
    return [&] {
      std::vector<std::vector<at::Tensor>> outputs{b.chunks};
      std::vector<at::Tensor> inputs{b.own};
      gloo.allgather(outputs, inputs)->wait();
    };
  }
  if (op == "reduce_scatter") {
    return [&] {
      std::vector<at::Tensor> outputs{b.shard};
      std::vector<std::vector<at::Tensor>> inputs{b.chunks};
      gloo.reduce_scatter(outputs, inputs)->wait();
    };
  }
  return [&] {
    std::vector<at::Tensor> tensors{b.full};
    gloo.allreduce(tensors)->wait();
  };
}

int iterations_for(const Options& o, int64_t bytes) {
  return static_cast<int>(std::clamp<double>(o.bytes_per_size / bytes, 2, 500));
}

// CPU seconds of this process so far (every thread: Gloo's too).
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// The largest value over the ranks.
double max_over_ranks(fsdp::ProcessGroup& world, double value) {
  std::vector<at::Tensor> tensors{at::full({1}, value, at::kDouble)};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  world.backend().allreduce(tensors, max)->wait();
  return tensors[0].item<double>();
}

struct Timing {
  double seconds;      // wall time per call, the slowest rank's
  double cpu_seconds;  // CPU time per call, the busiest rank's: what a loaded machine does not hide
  int iterations;
};

Timing time_per_call(fsdp::ProcessGroup& world, const Call& call, int iterations,
                     double seconds_per_size) {
  const auto warm_up = Clock::now();
  call();  // first touches, connections, the segment's pages
  const double first = max_over_ranks(world, std::chrono::duration<double>(Clock::now() - warm_up).count());
  iterations = std::clamp(static_cast<int>(seconds_per_size / first), 2, iterations);
  world.backend().barrier()->wait();
  const double cpu_start = process_cpu_seconds();
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) call();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
  const double cpu = (process_cpu_seconds() - cpu_start) / iterations;
  return {max_over_ranks(world, seconds), max_over_ranks(world, cpu), iterations};
}

// Rank 0 copies `bytes` between two buffers of its own, one thread, while the others wait.
Timing memcpy_time(fsdp::ProcessGroup& world, int64_t bytes, int iterations) {
  Timing t{0, 0, iterations};
  if (world.rank() == 0) {
    std::vector<char> from(bytes, 1), to(bytes, 0);
    std::memcpy(to.data(), from.data(), bytes);
    timespec cpu_start{}, cpu_end{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu_start);
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) {
      std::memcpy(to.data(), from.data(), bytes);
      asm volatile("" : : "r"(to.data()) : "memory");
    }
    t.seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu_end);
    t.cpu_seconds = (cpu_end.tv_sec - cpu_start.tv_sec + (cpu_end.tv_nsec - cpu_start.tv_nsec) * 1e-9) /
                    iterations;
  }
  world.backend().barrier()->wait();
  return t;
}

double bus_factor(const std::string& op, int w) {
  return op == "all_reduce" ? 2.0 * (w - 1) / w : static_cast<double>(w - 1) / w;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"CPU collectives benchmark (nccl-tests style); run under fsdprun"};
  app.add_option("--min-bytes", o.min_bytes, "smallest size")->check(CLI::Range(int64_t{4}, int64_t{1} << 34));
  app.add_option("--max-bytes", o.max_bytes, "largest size")->check(CLI::Range(int64_t{4}, int64_t{1} << 34));
  app.add_option("--factor", o.factor, "size step")->check(CLI::Range(2, 16));
  app.add_option("--bytes-per-size", o.bytes_per_size, "bytes moved per measurement")->check(CLI::PositiveNumber);
  app.add_option("--seconds-per-size", o.seconds_per_size, "time bound of one measurement")->check(CLI::PositiveNumber);
  app.add_option("--impls", o.impls, "shm, shm_thread, ring, gloo")->delimiter(',');
  app.add_option("--ops", o.ops, "all_gather, reduce_scatter, all_reduce")->delimiter(',');
  app.add_option("--out", o.out, "JSON lines (rank 0)");
  app.add_option("--shm-chunk-bytes", o.shm_chunk_bytes, "bytes per round of the shared-memory collectives")
      ->check(CLI::Range(int64_t{4096}, int64_t{1} << 30));
  CLI11_PARSE(app, argc, argv);

  try {
    auto dist = fsdp::init_distributed();
    fsdp::ProcessGroup& world = *dist->world;
    const int w = world.size();
    std::map<std::string, std::unique_ptr<fsdp::Collectives>> ours;
    ours["ring"] = fsdp::make_ring_collectives(world);
    if (w > 1) ours["shm"] = fsdp::make_shm_collectives(world, o.shm_chunk_bytes);
    if (w > 1) ours["shm_thread"] = fsdp::make_shm_collectives(world, o.shm_chunk_bytes);
    std::ofstream out;
    if (world.rank() == 0 && !o.out.empty()) out.open(o.out);
    auto emit = [&](const nlohmann::json& row) {
      if (world.rank() != 0) return;
      std::cout << row.dump() << std::endl;
      if (out) out << row.dump() << "\n" << std::flush;
    };
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
      const int iterations = iterations_for(o, bytes);
      // memcpy is cheap at small sizes: more calls, so that one preemption does not dominate.
      const Timing copy = memcpy_time(world, bytes, std::clamp<int>(o.bytes_per_size / bytes, 2, 100000));
      emit({{"impl", "memcpy"}, {"world", w}, {"bytes", bytes}, {"time_us", copy.seconds * 1e6},
            {"cpu_us", copy.cpu_seconds * 1e6}, {"algbw_GBps", bytes / copy.seconds / 1e9},
            {"cpu_algbw_GBps", bytes / copy.cpu_seconds / 1e9}});
      Buffers b = buffers_for(bytes, w, world.rank());
      for (const std::string& op : o.ops) {
        for (const std::string& impl : o.impls) {
          if (impl != "gloo" && !ours[impl]) continue;
          const Timing t = time_per_call(world, collective_call(impl, op, ours[impl].get(),
                                                                world.backend(), b), iterations,
                                         o.seconds_per_size);
          const double algbw = b.full.nbytes() / t.seconds / 1e9;
          const double cpu_algbw = b.full.nbytes() / t.cpu_seconds / 1e9;
          emit({{"impl", impl}, {"op", op}, {"world", w}, {"bytes", b.full.nbytes()},
                {"time_us", t.seconds * 1e6}, {"cpu_us", t.cpu_seconds * 1e6},
                {"algbw_GBps", algbw}, {"busbw_GBps", algbw * bus_factor(op, w)},
                {"cpu_busbw_GBps", cpu_algbw * bus_factor(op, w)}, {"iterations", t.iterations}});
        }
      }
    }
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  return 0;
}
