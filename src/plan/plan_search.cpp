#include <fsdp/plan.h>

#include "plan/bytes_text.h"
#include "plan/plan_tensor_parallel.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace fsdp {

namespace {

std::string ms(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f ms", seconds * 1000);
  return text;
}

// The shard group size a hybrid strategy takes in a search: the data-parallel ranks of one host
// (with TP, a host's ranks / T: [Note: tensor parallelism in the plan]).
std::optional<FullyShardOptions> options_for(const PlanSetup& setup, ShardingStrategy strategy) {
  const PlanWorld dp = planning::data_parallel_setup(setup).world;
  FullyShardOptions o = setup.policy.fsdp;
  o.strategy(strategy).shard_group_size(0);
  if (is_hybrid(strategy)) o.shard_group_size(dp.ranks_per_host);
  try {
    o.validate(dp.world_size, dp.ranks_per_host);
  } catch (const c10::Error&) {
    return std::nullopt;  // e.g. hybrid on one host
  }
  return o;
}

// Speeds within 0.5% of each other are one: the model is not finer than that.
int64_t speed_class(const Plan& p) {
  return static_cast<int64_t>(std::floor(std::log(std::max(p.time.tokens_per_s, 1e-9)) / std::log(1.005)));
}

// Why `loser` loses to `best`, from the terms of their plans.
std::string why_slower(const Plan& loser, const Plan& best) {
  const PlanTime &l = loser.time, &b = best.time;
  if (speed_class(loser) == speed_class(best)) {
    return "as fast, more memory: peak " + planning::bytes_text(static_cast<double>(loser.peak_bytes)) +
           " vs " + planning::bytes_text(static_cast<double>(best.peak_bytes));
  }
  char text[200];
  std::snprintf(text, sizeof(text), "%.0f%% fewer tokens/s: compute %s vs %s, exposed communication %s vs %s",
                100.0 * (1.0 - l.tokens_per_s / b.tokens_per_s), ms(l.compute).c_str(),
                ms(b.compute).c_str(), ms(l.exposed_communication).c_str(),
                ms(b.exposed_communication).c_str());
  std::string why = text;
  if (loser.setup.policy.batch < best.setup.policy.batch) why += " (a smaller batch per rank)";
  if (loser.setup.policy.fsdp.activation_checkpointing() && !best.setup.policy.fsdp.activation_checkpointing()) {
    why += " (recomputes every unit's forward)";
  }
  return why;
}

void search_tp_size(const PlanSetup& setup, const SearchSpace& space, double max_memory_bytes,
                    const std::vector<int64_t>& batches, SearchResult& result);
void sort_and_explain(SearchResult& result, const SearchSpace& space, double max_memory_bytes);

// The setup at each TP size the space tries, its model described for it; sizes whose groups the
// world or its hosts cannot lay out are left out.
std::vector<PlanSetup> tp_setups(const PlanSetup& setup, const SearchSpace& space) {
  if (space.tp_sizes.empty()) return {setup};
  std::vector<PlanSetup> out;
  const int w = setup.world.world_size, rph = setup.world.ranks_per_host;
  for (int t : space.tp_sizes) {
    TORCH_CHECK(t >= 1, "search: a TP size must be >= 1, got ", t);
    if (w % t != 0 || (rph % t != 0 && t % rph != 0)) continue;
    PlanSetup candidate = setup;
    candidate.policy.tp_size = t;
    if (t != setup.model.tp_size) {
      TORCH_CHECK(space.model_for_tp, "search: TP size ", t, " needs SearchSpace::model_for_tp, the model "
                  "described for it");
      candidate.model = space.model_for_tp(t);
    }
    out.push_back(std::move(candidate));
  }
  return out;
}

}  // namespace

SearchResult search_plans(const PlanSetup& setup, const SearchSpace& space, double max_memory_bytes) {
  TORCH_CHECK(max_memory_bytes > 0, "search: the memory cap must be > 0 bytes, got ", max_memory_bytes);
  TORCH_CHECK(space.peak_margin >= 0 && space.peak_margin < 1, "search: the peak margin must be in [0, 1), got ",
              space.peak_margin);
  const std::vector<int64_t> batches = space.batches.empty() ? std::vector<int64_t>{setup.policy.batch} : space.batches;
  SearchResult result;
  for (const PlanSetup& tp_setup : tp_setups(setup, space)) {
    search_tp_size(tp_setup, space, max_memory_bytes, batches, result);
  }
  sort_and_explain(result, space, max_memory_bytes);
  return result;
}

namespace {

// Every configuration of `space` at the TP size of `setup`, planned into `result`.
void search_tp_size(const PlanSetup& setup, const SearchSpace& space, double max_memory_bytes,
                    const std::vector<int64_t>& batches, SearchResult& result) {
  const double accepted_peak = (1 - space.peak_margin) * max_memory_bytes;
  for (ShardingStrategy strategy : space.strategies) {
    const auto options = options_for(setup, strategy);
    if (!options) continue;
    for (bool checkpointing : space.activation_checkpointing) {
      for (bool offload : space.cpu_offload) {
        // Offload needs a GPU, and its time the host's bandwidths.
        const bool offload_known = setup.policy.fsdp.device() && setup.policy.fsdp.device()->is_cuda() &&
                                   setup.device.host_memory_bandwidth > 0 && setup.device.host_link_bandwidth > 0 &&
                                   setup.device.host_memory_bytes > 0;
        if (offload && !offload_known) continue;
        for (int64_t batch : batches) {
          PlanSetup candidate = setup;
          candidate.policy.fsdp = *options;
          candidate.policy.fsdp.activation_checkpointing(checkpointing).cpu_offload(offload);
          candidate.policy.batch = batch;
          if (space.keep_global_batch) {
            TORCH_CHECK(setup.policy.batch % batch == 0, "search: batch ", batch, " does not divide the batch ",
                        setup.policy.batch, " it makes up by accumulation");
            candidate.policy.micro_batches = setup.policy.micro_batches * (setup.policy.batch / batch);
          }
          candidate.device.memory_bytes = max_memory_bytes;
          Plan p = plan(candidate);
          if (p.peak_bytes <= accepted_peak && p.host_fits) {
            result.fitting.push_back(std::move(p));
          } else {
            result.rejected.emplace_back(std::move(p), "");
          }
        }
      }
    }
  }
}

void sort_and_explain(SearchResult& result, const SearchSpace& space, double max_memory_bytes) {
  const double accepted_peak = (1 - space.peak_margin) * max_memory_bytes;
  // Fastest first; among equally fast ones, the least memory.
  std::stable_sort(result.fitting.begin(), result.fitting.end(), [](const Plan& a, const Plan& b) {
    const int64_t sa = speed_class(a), sb = speed_class(b);
    return sa != sb ? sa > sb : a.peak_bytes < b.peak_bytes;
  });
  for (const Plan& p : result.fitting) {
    result.slower_because.push_back(&p == &result.fitting.front() ? "" : why_slower(p, result.fitting.front()));
  }
  for (auto& [p, why] : result.rejected) {
    if (p.peak_bytes > max_memory_bytes) {
      why = "peak " + planning::bytes_text(static_cast<double>(p.peak_bytes)) + " > cap " +
            planning::bytes_text(max_memory_bytes);
    } else if (p.peak_bytes > accepted_peak) {
      char margin[64];
      std::snprintf(margin, sizeof(margin), "%.0f%% margin", 100 * space.peak_margin);
      why = "peak " + planning::bytes_text(static_cast<double>(p.peak_bytes)) + " > cap less the planner's " +
            margin + " " + planning::bytes_text(accepted_peak);
    } else {
      why = "offloaded " + planning::bytes_text(static_cast<double>(p.ranks.front().offloaded_bytes)) +
            " per rank > host memory " + planning::bytes_text(p.setup.device.host_memory_bytes);
    }
  }
}

}  // namespace

}  // namespace fsdp
