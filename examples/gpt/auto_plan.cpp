#include "auto_plan.h"

#include "gpt_plan.h"
#include "mib_text.h"

#include <algorithm>
#include <cstdio>
#include <iostream>

namespace gpt {

namespace {


// The batches per rank that keep the global batch with gradient accumulation: divisors of --batch.
std::vector<int64_t> divisors(int64_t batch) {
  std::vector<int64_t> out;
  for (int64_t b = batch; b >= 1; --b) {
    if (batch % b == 0) out.push_back(b);
  }
  return out;
}

// Rank 0's device numbers on every rank (a probe differs a little from rank to rank).
fsdp::PlanDevice shared_device(fsdp::PlanDevice device, fsdp::Distributed& dist) {
  std::vector<double*> fields = {&device.memory_bytes, &device.op_overhead_s};
  for (fsdp::KernelRates* r : {&device.fp32, &device.low_precision}) {
    for (double* x : {&r->matmul_flops, &r->attention_flops, &r->transcendentals, &r->memory_bandwidth}) {
      fields.push_back(x);
    }
  }
  auto numbers = torch::zeros({static_cast<int64_t>(fields.size())}, torch::kFloat64);
  if (dist.rank() == 0) {
    for (size_t i = 0; i < fields.size(); ++i) numbers[i] = *fields[i];
  }
  fsdp::all_reduce_sum(*dist.world, numbers);
  for (size_t i = 0; i < fields.size(); ++i) *fields[i] = numbers[i].item<double>();
  return device;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

fsdp::PlanSetup setup_of_flags(const TrainOptions& o, const PlanFlags& flags) {
  const fsdp::PlanWorld world = plan_world(flags);
  const fsdp::PlanDevice device = plan_device(flags, o, world);
  fsdp::PlanSetup setup = plan_setup(o, world.world_size, world.ranks_per_host, device, plan_links(flags, device));
  setup.policy.gradients_kept = flags.zero_grad_in_place;
  // A GPU preset plans a GPU run (offload is one of its options) without --device cuda here.
  if (!flags.gpu.empty() && !setup.policy.fsdp.device()) setup.policy.fsdp.device(c10::Device(c10::kCUDA, 0));
  return setup;
}

void print_plan(const fsdp::PlanSetup& setup, const PlanFlags& flags) {
  if (flags.max_memory_gb <= 0) {
    const fsdp::Plan plan = fsdp::plan(setup);
    std::cout << (flags.json ? fsdp::plan_json(plan).dump(2) + "\n" : fsdp::plan_text(plan));
    return;
  }
  fsdp::SearchSpace space;
  space.batches = search_batches(flags, setup.policy.batch);
  space.cpu_offload = {false, true};  // searched where it applies (a GPU, its host's bandwidths)
  const double cap = flags.max_memory_gb * kGiB;
  const fsdp::SearchResult result = fsdp::search_plans(setup, space, cap);
  std::cout << (flags.json ? fsdp::search_json(result, cap).dump(2) + "\n" : fsdp::search_text(result, cap));
}

fsdp::Plan choose_configuration(TrainOptions& o, const PlanFlags& flags, fsdp::Distributed& dist,
                                const std::vector<std::string>& replaced_flags) {
  TORCH_CHECK(flags.max_memory_gb > 0, "--auto needs --max-memory-gb X: the memory each rank may use");
  TORCH_CHECK(flags.ranks == 0 || flags.ranks == dist.world_size(), "--ranks ", flags.ranks,
              " differs from the world size ", dist.world_size(), " this run was launched with: "
              "--auto plans the run it is in; omit --ranks (or launch ", flags.ranks, " ranks)");
  fsdp::PlanWorld world = plan_world(flags);
  world.world_size = dist.world_size();
  const fsdp::PlanDevice device = shared_device(plan_device(flags, o, world), dist);
  const fsdp::PlanSetup setup = plan_setup(o, world.world_size, world.ranks_per_host, device, plan_links(flags, device));
  fsdp::SearchSpace space;
  space.batches = divisors(o.batch);
  space.keep_global_batch = true;
  space.peak_margin = fsdp::kPlanPeakMargin;
  space.cpu_offload = {false, true};  // searched where it applies (a GPU, its host's bandwidths)
  const double cap = flags.max_memory_gb * kGiB;
  const fsdp::SearchResult result = fsdp::search_plans(setup, space, cap);
  if (dist.rank() == 0) std::cout << fsdp::search_text(result, cap) << std::flush;
  if (!result.best()) {
    int64_t smallest = -1;
    for (const auto& [p, why] : result.rejected) {
      if (smallest < 0 || p.peak_bytes < smallest) smallest = p.peak_bytes;
    }
    TORCH_CHECK(false, "--auto: no configuration fits --max-memory-gb ", flags.max_memory_gb,
                " per rank with the planner's ", 100 * fsdp::kPlanPeakMargin, "% margin (the smallest "
                "planned peak is ", smallest / kGiB, " GiB); raise the cap, use more ranks, or a smaller "
                "model or --seq");
  }
  const fsdp::Plan& best = *result.best();
  o.grad_accum = best.setup.policy.micro_batches;
  o.batch = best.setup.policy.batch;
  o.fsdp = best.setup.policy.fsdp;
  if (dist.rank() == 0) {
    std::string replaced;
    for (const std::string& flag : replaced_flags) replaced += (replaced.empty() ? "" : ", ") + flag;
    std::cout << "--auto: training with " << best.label()
              << (replaced.empty() ? "" : " instead of the given " + replaced) << "\n" << std::flush;
  }
  return best;
}

void check_plan_against_run(const fsdp::Plan& plan, const TrainOptions& o, const TrainResult& result,
                            const PlanFlags& flags, fsdp::Distributed& dist) {
  int64_t peak = 0;
  std::vector<double> step_ms;
  const size_t first = result.steps.size() > 1 ? 1 : 0;  // the first step creates the optimizer state
  for (size_t s = first; s < result.steps.size(); ++s) {
    peak = std::max(peak, result.steps[s].memory.peak_bytes);
    step_ms.push_back(result.steps[s].step_ms);
  }
  auto peaks = torch::zeros({dist.world_size()}, torch::kFloat64);
  peaks[dist.rank()] = static_cast<double>(peak);
  fsdp::all_reduce_sum(*dist.world, peaks);
  const double measured_peak = peaks.max().item<double>();
  const int64_t peak_rank = peaks.argmax().item<int64_t>();
  if (dist.rank() == 0) {
    const double measured_ms = median(step_ms);
    const double predicted_ms = plan.time.step * 1000 * o.grad_accum;  // the plan is a micro-batch's
    std::printf("plan vs run: peak per rank predicted %.2f MiB, measured %.2f MiB (max over ranks, "
                "%.3fx); step (%lld micro-batch%s) predicted %.1f ms, measured %.1f ms (median of rank "
                "0, %.3fx)\n",
                plan.peak_bytes / 1048576.0, measured_peak / 1048576.0, measured_peak / plan.peak_bytes,
                static_cast<long long>(o.grad_accum), o.grad_accum == 1 ? "" : "es", predicted_ms,
                measured_ms, measured_ms / predicted_ms);
    std::fflush(stdout);
  }
  // The promise --auto made: every rank under the cap (the same verdict on every rank).
  const double cap = flags.max_memory_gb * kGiB;
  TORCH_CHECK(measured_peak <= cap, "--auto: rank ", peak_rank, "'s measured peak ", measured_peak / 1048576.0,
              " MiB exceeded --max-memory-gb ", flags.max_memory_gb, " (", cap / 1048576.0, " MiB; planned ",
              plan.peak_bytes / 1048576.0, " MiB for ", plan.label(), "): the planner was wrong for this run; "
              "lower --max-memory-gb or choose the configuration by hand, and report the plan");
}

}  // namespace gpt
