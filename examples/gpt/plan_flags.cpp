// The planner's flags (the group "Planner" of gpt_train and fsdp_plan): what they mean, their
// bounds, and the world, device and links they describe (gpt_plan.h declares them).
#include "gpt_plan.h"

#include "options.h"
#include "trainer.h"

#include <fsdp/plan.h>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <unistd.h>

namespace gpt {

namespace {

// The bounds of the planner's device flags: beyond any device (an exaflop or a petabyte per rank)
// or below any (a kilobyte, a GFLOP/s), where a plan's times and sizes stop being numbers one
// can read.
constexpr double kMinGiB = 1.0 / (1 << 20), kMaxGiB = 1 << 20;
constexpr double kMinRate = 1e-3, kMaxTflops = 1e6, kMaxGbps = 1e6, kMaxLatencyUs = 1e6;
// The batches one search tries: each is planned for every strategy and option.
constexpr size_t kMaxSearchBatches = 32;


// Achieved, not datasheet, rates: large bf16 GEMMs reach ~55-80% of peak (an H200: ~790 of 989
// TFLOP/s measured), a copy ~85% of the memory's bandwidth. Links per GPU: NVLink within a host;
// across hosts one 200 Gb/s NIC per GPU (A100, the paper's cluster) or 400 Gb/s (H100, H200);
// PCIe 4 (A100) or 5 x16 to the host; a host's memory and its bandwidth shared by its 8 GPUs'
// ranks (a DGX A100's 1 TB, a DGX H100's 2 TB).
struct GpuPreset {
  double memory_gib, tflops_fp32, tflops_bf16, memory_gbps, nvlink_gbps, network_gbps, pcie_gbps,
      host_gbps, host_gib;
};
const std::map<std::string, GpuPreset>& gpu_presets() {
  static const std::map<std::string, GpuPreset> presets = {
      {"a100-40gb", {40, 100, 200, 1300, 240, 25, 24, 30, 128}},
      {"a100-80gb", {80, 100, 200, 1700, 240, 25, 24, 30, 128}},
      {"h100-80gb", {80, 300, 600, 2800, 360, 50, 48, 40, 256}},
      {"h200", {139, 300, 790, 4300, 360, 50, 48, 40, 256}},
  };
  return presets;
}

int env_int(const char* name, int fallback) {
  const char* text = std::getenv(name);
  return text && *text ? std::atoi(text) : fallback;
}

// --batches' list: each a batch size within --batch's bound, a few of them; throws
// std::invalid_argument naming the bad item.
std::vector<int64_t> parse_batches(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) {
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || value < 1 || value > kMaxBatch) {
      throw std::invalid_argument("'" + item.substr(0, 40) + "' is not a batch size in [1, " +
                                  std::to_string(kMaxBatch) + "] (--batch's bound; e.g. --batches 1,2,4)");
    }
    if (out.size() == kMaxSearchBatches) {
      throw std::invalid_argument("more than " + std::to_string(kMaxSearchBatches) + " batch sizes; "
                                  "the search plans each for every configuration: list fewer");
    }
    out.push_back(value);
  }
  return out;
}

// --tp-sizes' list ("all": empty, every size the model allows); throws std::invalid_argument
// naming the bad item.
std::vector<int> parse_tp_sizes(const std::string& text) {
  if (text == "all") return {};
  std::vector<int> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) {
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || value < 1 || value > 1024) {
      throw std::invalid_argument("'" + item.substr(0, 40) + "' is not a TP size in [1, 1024] (e.g. --tp-sizes "
                                  "1,2,4,8, or --tp-sizes all)");
    }
    out.push_back(static_cast<int>(value));
  }
  return out;
}

double host_memory_bytes() {
  return static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
}

}  // namespace

void add_plan_flags(CLI::App& app, PlanFlags& f) {
  const std::string group = "Planner";
  std::string presets;
  for (const auto& [name, preset] : gpu_presets()) presets += (presets.empty() ? "" : " | ") + name;
  app.add_option("--ranks", f.ranks, "planner: ranks of the run (default: the launcher's WORLD_SIZE, else 1)")
      ->check(integer_in(1, 1 << 20))->group(group);
  app.add_option("--ranks-per-host", f.ranks_per_host,
                 "planner: ranks per host (default: the launcher's LOCAL_WORLD_SIZE, else min(ranks, 8))")
      ->check(integer_in(1, 1 << 20))->group(group);
  app.add_option("--gpu", f.gpu, "planner: a GPU preset (" + presets + "); default: probe this machine")
      ->check(CLI::IsMember([] {
        std::vector<std::string> names;
        for (const auto& [name, preset] : gpu_presets()) names.push_back(name);
        return names;
      }()))->group(group);
  app.add_option("--memory-gb", f.memory_gb, "planner: device memory per rank in GiB")
      ->check(real_in(kMinGiB, kMaxGiB))->group(group);
  app.add_option("--tflops-fp32", f.tflops_fp32, "planner: achieved fp32 matrix TFLOP/s per rank")
      ->check(real_in(kMinRate, kMaxTflops))->group(group);
  app.add_option("--tflops-bf16", f.tflops_bf16, "planner: achieved bf16 matrix TFLOP/s per rank")
      ->check(real_in(kMinRate, kMaxTflops))->group(group);
  app.add_option("--memory-gbps", f.memory_gbps, "planner: device memory bandwidth in GB/s")
      ->check(real_in(kMinRate, kMaxGbps))->group(group);
  app.add_option("--intra-host-gbps", f.intra_host_gbps, "planner: per-rank bandwidth to a rank on the same host, GB/s")
      ->check(real_in(kMinRate, kMaxGbps))->group(group);
  app.add_option("--cross-host-gbps", f.cross_host_gbps, "planner: per-rank bandwidth to another host, GB/s")
      ->check(real_in(kMinRate, kMaxGbps))->group(group);
  app.add_option("--latency-us", f.latency_us, "planner: latency of one step of a collective, microseconds")
      ->check(real_in(0, kMaxLatencyUs))->group(group);
  app.add_option("--max-memory-gb", f.max_memory_gb,
                 "planner: a memory cap per rank in GiB: search for the fastest configuration under it")
      ->check(real_in(kMinGiB, kMaxGiB))->group(group);
  app.add_option("--batches", f.batches, "planner: batches per rank the search tries, e.g. 1,2,4 (default: --batch)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              parse_batches(text);
            } catch (const std::invalid_argument& e) {
              return e.what();
            }
            return "";
          },
          "LIST", "batch_list"))
      ->group(group);
  app.add_option("--tp-sizes", f.tp_sizes,
                 "planner: tensor-parallel sizes a search tries, e.g. 1,2,4,8, or 'all' (those dividing the "
                 "ranks per host, the world, --heads, --kv-heads, --vocab, the MLP's width, --seq); default: --tp")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              parse_tp_sizes(text);
            } catch (const std::invalid_argument& e) {
              return e.what();
            }
            return "";
          },
          "LIST", "tp_list"))
      ->group(group);
  app.add_flag("--zero-grad-in-place", f.zero_grad_in_place,
               "planner: plan an optimizer whose zero_grad zeroes gradients in place (set_to_none = "
               "false, PyTorch 1.x's default): the gradient shards stay between steps (gpt_train frees them)")
      ->group(group);
  app.add_flag("--pp-stages-only", f.pp_stages_only,
               "planner, with --pp: plan a program whose ranks keep their stages only (fsdp::pp::Pipeline "
               "as a library user builds it); gpt_train builds the whole model on every rank")
      ->group(group);
  app.add_flag("--json", f.json, "planner: print JSON")->group(group);
}

fsdp::PlanWorld plan_world(const PlanFlags& f) {
  fsdp::PlanWorld world;
  world.world_size = f.ranks > 0 ? f.ranks : env_int("WORLD_SIZE", 1);
  const int local = env_int("LOCAL_WORLD_SIZE", 0);
  world.ranks_per_host = f.ranks_per_host > 0 ? f.ranks_per_host
                         : f.ranks == 0 && local > 0 ? local
                                                     : std::min(world.world_size, 8);
  return world;
}

// A GPU's rates from its matrix FLOP/s and memory bandwidth: fused attention at ~60% of the
// matrix rate (FlashAttention-2's share on A100/H100), GELU bound by its traffic (forward reads
// and writes an element, backward reads two and writes one: 5 elements moved).
fsdp::KernelRates gpu_rates(double tflops, double memory_gbps, int64_t element_bytes) {
  fsdp::KernelRates r;
  r.matmul_flops = tflops * 1e12;
  r.attention_flops = 0.6 * r.matmul_flops;
  r.memory_bandwidth = memory_gbps * 1e9;
  r.transcendentals = r.memory_bandwidth / (5.0 * element_bytes);
  return r;
}

fsdp::PlanDevice plan_device(const PlanFlags& f, const TrainOptions& o, const fsdp::PlanWorld& world) {
  fsdp::PlanDevice d;
  const bool given = f.tflops_fp32 > 0 && f.tflops_bf16 > 0 && f.memory_gbps > 0;
  if (!f.gpu.empty() || given) {
    const GpuPreset p = f.gpu.empty() ? GpuPreset{0, 0, 0, 0, 0, 0, 0, 0, 0} : gpu_presets().at(f.gpu);
    d.name = f.gpu.empty() ? "given" : f.gpu;
    d.memory_bytes = p.memory_gib * kGiB;
    const double fp32 = f.tflops_fp32 > 0 ? f.tflops_fp32 : p.tflops_fp32;
    const double bf16 = f.tflops_bf16 > 0 ? f.tflops_bf16 : p.tflops_bf16;
    const double gbps = f.memory_gbps > 0 ? f.memory_gbps : p.memory_gbps;
    d.fp32 = gpu_rates(fp32, gbps, 4);
    d.low_precision = gpu_rates(bf16, gbps, 2);
    d.host_memory_bandwidth = p.host_gbps * 1e9;
    d.host_link_bandwidth = p.pcie_gbps * 1e9;
    d.host_memory_bytes = p.host_gib * kGiB;
    d.op_overhead_s = 5e-6;  // a kernel launch
    // PyTorch's CUDA caching allocator: the paper's 175B run at 128 GPUs, batch 2, reserved all
    // 80 GB and slowed backward with allocator retries where this plan leaves 27% unallocated,
    // while its configurations with more than 35% left ran clean. A caching allocator's cached
    // blocks (split, or held per stream until the all-gather stream's buffers are released) take
    // up to that share.
    d.allocator_reserve = 0.30;
  } else {
    fsdp::ProbeShape shape;
    shape.tokens = o.batch * o.model.max_seq;
    shape.width = o.model.dim;
    shape.sequences = o.batch;
    shape.sequence = o.model.max_seq;
    shape.heads = o.model.heads;
    d = fsdp::probe_device(compute_device(o), shape);
    // A CPU's memory is its host's, shared by the host's ranks; so is a GPU host's bandwidth.
    if (compute_device(o).is_cpu()) d.memory_bytes = host_memory_bytes() / world.ranks_per_host;
    d.host_memory_bandwidth /= world.ranks_per_host;
    if (compute_device(o).is_cuda()) d.host_memory_bytes = host_memory_bytes() / world.ranks_per_host;
  }
  if (f.memory_gb > 0) d.memory_bytes = f.memory_gb * kGiB;
  return d;
}

fsdp::PlanLinks plan_links(const PlanFlags& f, const fsdp::PlanDevice& device) {
  fsdp::PlanLinks links;
  if (!f.gpu.empty()) {
    const GpuPreset& p = gpu_presets().at(f.gpu);
    links = {p.nvlink_gbps * 1e9, p.network_gbps * 1e9, 10e-6};
  } else {
    links = {device.fp32.memory_bandwidth / 2, 1.25e9, 20e-6};
  }
  if (f.intra_host_gbps > 0) links.intra_host_bandwidth = f.intra_host_gbps * 1e9;
  if (f.cross_host_gbps > 0) links.cross_host_bandwidth = f.cross_host_gbps * 1e9;
  if (f.latency_us > 0) links.latency_s = f.latency_us * 1e-6;
  return links;
}

std::vector<int64_t> search_batches(const PlanFlags& f, int64_t batch) {
  if (f.batches.empty()) return {batch};
  return parse_batches(f.batches);
}

void search_tp_sizes(const PlanFlags& flags, const TrainOptions& o, const fsdp::PlanSetup& setup,
                     fsdp::SearchSpace& space) {
  if (flags.tp_sizes.empty()) return;  // --tp's only
  std::vector<int> sizes = parse_tp_sizes(flags.tp_sizes);
  if (sizes.empty()) sizes = tp_sizes_for(o.model, setup.world.world_size, setup.world.ranks_per_host);
  for (int tp : sizes) check_tp_size(o.model, tp);  // a listed size the model cannot take: named
  space.tp_sizes = sizes;
  space.model_for_tp = [o](int tp) { return describe_run_model(o, tp); };
}

}  // namespace gpt
