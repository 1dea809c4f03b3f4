// The CPU collectives measured the way nccl-tests measures NCCL's: for all-gather, reduce-scatter
// and all-reduce over a range of sizes, the time per call (the slowest rank's average), algorithm
// bandwidth (size / time) and bus bandwidth (algbw * (W-1)/W for all-gather and reduce-scatter,
// * 2(W-1)/W for all-reduce), for the ring over Gloo's send/recv, the shared-memory collectives and
// Gloo's own collectives on the same process group; against a single-thread memcpy of the same
// sizes, measured by rank 0 in the same run while the other ranks wait. "size" is nccl-tests': the
// full buffer (all-gather's output, reduce-scatter's input, the all-reduced tensor), fp32.
// All-gather runs in place (the shard is the full buffer's own chunk), as FSDP calls it.
//
//   fsdprun --nproc-per-node W collectives_bench --out results.jsonl   (one JSON object a line)
#include "collectives.h"
#include "shm_collectives.h"

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

// The slowest rank's seconds per call.
double time_per_call(fsdp::ProcessGroup& world, const Call& call, int iterations) {
  call();  // warm-up: first touches, connections, the segment's pages
  world.backend().barrier()->wait();
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) call();
  at::Tensor seconds = at::full({1}, std::chrono::duration<double>(Clock::now() - start).count() /
                                         iterations, at::kDouble);
  std::vector<at::Tensor> tensors{seconds};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  world.backend().allreduce(tensors, max)->wait();
  return seconds.item<double>();
}

// Rank 0 copies `bytes` between two buffers of its own, one thread, while the others wait.
double memcpy_seconds(fsdp::ProcessGroup& world, int64_t bytes, int iterations) {
  double seconds = 0;
  if (world.rank() == 0) {
    std::vector<char> from(bytes, 1), to(bytes, 0);
    std::memcpy(to.data(), from.data(), bytes);
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) {
      std::memcpy(to.data(), from.data(), bytes);
      asm volatile("" : : "r"(to.data()) : "memory");
    }
    seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
  }
  world.backend().barrier()->wait();
  return seconds;
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
  app.add_option("--impls", o.impls, "shm, ring, gloo")->delimiter(',');
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
    std::ofstream out;
    if (world.rank() == 0 && !o.out.empty()) out.open(o.out);
    auto emit = [&](const nlohmann::json& row) {
      if (world.rank() != 0) return;
      std::cout << row.dump() << std::endl;
      if (out) out << row.dump() << "\n" << std::flush;
    };
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
      const int iterations = iterations_for(o, bytes);
      const double copy = memcpy_seconds(world, bytes, iterations);
      emit({{"impl", "memcpy"}, {"world", w}, {"bytes", bytes}, {"time_us", copy * 1e6},
            {"algbw_GBps", bytes / copy / 1e9}});
      Buffers b = buffers_for(bytes, w, world.rank());
      for (const std::string& op : o.ops) {
        for (const std::string& impl : o.impls) {
          if (impl != "gloo" && !ours[impl]) continue;
          const double t = time_per_call(world, collective_call(impl, op, ours[impl].get(),
                                                                world.backend(), b), iterations);
          const double algbw = b.full.nbytes() / t / 1e9;
          emit({{"impl", impl}, {"op", op}, {"world", w}, {"bytes", b.full.nbytes()},
                {"time_us", t * 1e6}, {"algbw_GBps", algbw}, {"busbw_GBps", algbw * bus_factor(op, w)},
                {"iterations", iterations}});
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
