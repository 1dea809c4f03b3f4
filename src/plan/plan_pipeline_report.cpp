// A pipeline plan as text and JSON, and the search over pp sizes, schedules and micro-batch
// counts (include/fsdp/plan_pipeline.h).

#include <fsdp/plan_pipeline.h>

#include "plan/bytes_text.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace fsdp {

namespace {

using planning::bytes_text;

std::string milliseconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f ms", seconds * 1000);
  return text;
}

std::string percent(double share) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f%%", share * 100);
  return text;
}

std::string stages_text(const std::vector<int>& stages) {
  std::string out;
  for (int s : stages) out += (out.empty() ? "" : ",") + std::to_string(s);
  return out;
}

void rank_text(std::ostringstream& s, const PipelineRankPlan& r) {
  const MemoryBreakdown& m = r.peak;
  s << "  pp rank " << r.pp_rank << " (stage " << stages_text(r.stages) << ": " << r.units.size() << " units, "
    << r.parameters << " parameters): peak " << bytes_text(static_cast<double>(m.total())) << " ("
    << r.peak_at << ")\n";
  s << "    parameters " << bytes_text(static_cast<double>(m.sharded_params)) << ", gradients "
    << bytes_text(static_cast<double>(m.sharded_grads)) << ", optimizer state "
    << bytes_text(static_cast<double>(m.optimizer_state)) << ", held unsharded parameters "
    << bytes_text(static_cast<double>(m.unsharded_params)) << " and gradients "
    << bytes_text(static_cast<double>(m.unsharded_grads)) << "\n";
  s << "    activations " << bytes_text(static_cast<double>(m.activations)) << " (" << r.in_flight
    << (r.stages.size() > 1 ? " (stage, micro-batch)" : " micro-batch") << (r.in_flight == 1 || r.stages.size() > 1 ? "" : "es")
    << " in flight; one micro-batch " << bytes_text(static_cast<double>(r.microbatch_activations))
    << (r.stages.size() > 1 ? " over its stages" : "") << "), backward's transient "
    << bytes_text(static_cast<double>(m.workspace)) << ", program " << bytes_text(static_cast<double>(m.program))
    << "\n";
  s << "    bytes per step: pp send " << r.pp_send_bytes << ", all-gather " << r.all_gather << ", reduce-scatter "
    << r.reduce_scatter << ", all-reduce " << r.all_reduce << "\n";
}

}  // namespace

std::string pipeline_plan_text(const PipelinePlan& plan) {
  std::ostringstream s;
  const PlanSetup& setup = plan.setup;
  s << "pipeline plan: " << setup.model.name << ", W = " << setup.world.world_size << " ("
    << setup.world.ranks_per_host << " per host): " << plan.label() << "\n";
  s << "  mesh: pp " << plan.pipeline.pp_size << " x dp " << plan.dp_size << " x tp "
    << std::max(1, setup.policy.tp_size) << ", " << plan.pipeline.pp_size * plan.pipeline.stages_per_rank
    << " stages; bubble " << percent(plan.bubble) << (plan.pp_crosses_hosts ? "; stage boundaries across hosts" : "")
    << "\n";
  s << "  peak memory per rank: " << bytes_text(static_cast<double>(plan.peak_bytes)) << " (pp rank "
    << plan.peak_rank << ")";
  if (setup.device.memory_bytes > 0) {
    s << " of " << bytes_text(setup.device.memory_bytes) << ": "
      << (plan.fits ? (plan.at_risk ? "fits, AT RISK" : "fits") : "DOES NOT FIT") << ", headroom "
      << percent(plan.headroom);
  }
  s << "\n";
  for (const PipelineRankPlan& r : plan.ranks) rank_text(s, r);
  s << "  step time: " << milliseconds(plan.time.step) << " (compute with the bubble "
    << milliseconds(plan.time.compute) << ", communication not hidden " << milliseconds(plan.time.exposed_communication)
    << "), " << static_cast<int64_t>(plan.time.tokens_per_s) << " tokens/s over the world, "
    << static_cast<int64_t>(plan.time.tokens_per_s / setup.world.world_size) << " per rank\n";
  return s.str();
}

nlohmann::json pipeline_plan_json(const PipelinePlan& plan) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const PipelineRankPlan& r : plan.ranks) {
    const MemoryBreakdown& m = r.peak;
    ranks.push_back({{"pp_rank", r.pp_rank},
                     {"stages", r.stages},
                     {"units", r.units},
                     {"parameters", r.parameters},
                     {"peak_bytes", m.total()},
                     {"peak_at", r.peak_at},
                     {"in_flight", r.in_flight},
                     {"microbatch_activation_bytes", r.microbatch_activations},
                     {"breakdown",
                      {{"parameters", m.sharded_params},
                       {"gradients", m.sharded_grads},
                       {"optimizer_state", m.optimizer_state},
                       {"unsharded_parameters", m.unsharded_params},
                       {"unsharded_gradients", m.unsharded_grads},
                       {"activations", m.activations},
                       {"workspace", m.workspace},
                       {"program", m.program}}},
                     {"pp_send_bytes", r.pp_send_bytes},
                     {"all_gather_bytes", r.all_gather},
                     {"reduce_scatter_bytes", r.reduce_scatter},
                     {"all_reduce_bytes", r.all_reduce}});
  }
  return {{"label", plan.label()},
          {"pp_size", plan.pipeline.pp_size},
          {"stages_per_rank", plan.pipeline.stages_per_rank},
          {"microbatches", plan.pipeline.microbatches},
          {"dp_size", plan.dp_size},
          {"peak_bytes", plan.peak_bytes},
          {"peak_rank", plan.peak_rank},
          {"bubble", plan.bubble},
          {"fits", plan.fits},
          {"at_risk", plan.at_risk},
          {"step_s", plan.time.step},
          {"tokens_per_s", plan.time.tokens_per_s},
          {"ranks", ranks}};
}

PipelineSearchResult search_pipeline_plans(const PlanSetup& setup, const PlanPipeline& base,
                                           const PipelineSearchSpace& space, double max_memory_bytes) {
  TORCH_CHECK(!space.pp_and_microbatches.empty(), "pipeline search: give the (pp size, micro-batches) pairs to try");
  PipelineSearchResult result;
  const double accepted = (1 - space.peak_margin) * max_memory_bytes;
  for (const auto& [P, M] : space.pp_and_microbatches) {
    for (pp::Schedule schedule : space.schedules) {
      {
        PlanPipeline pipeline = base;
        pipeline.pp_size = P;
        pipeline.schedule = schedule;
        pipeline.microbatches = M;
        pipeline.stages_per_rank = schedule == pp::Schedule::Interleaved1F1B ? space.interleaved_stages_per_rank
                                   : schedule == pp::Schedule::ZBV          ? 2
                                                                            : 1;
        try {
          PipelinePlan plan = plan_pipeline(setup, pipeline);
          if (static_cast<double>(plan.peak_bytes) <= accepted) {
            result.fitting.push_back(std::move(plan));
          } else {
            std::string why = "peak " + bytes_text(static_cast<double>(plan.peak_bytes)) + " > " +
                              (space.peak_margin > 0 ? "the cap less the margin " : "cap ") + bytes_text(accepted);
            result.rejected.emplace_back(std::move(plan), std::move(why));
          }
        } catch (const c10::Error& e) {
          result.not_planned.push_back("pp " + std::to_string(P) + " " + pp::to_string(schedule) + " M=" +
                                       std::to_string(M) + ": " + e.msg());
        }
      }
    }
  }
  // Speeds within 0.5% of each other are one (the model is not finer than that): the smaller peak first.
  auto speed_class = [](const PipelinePlan& p) {
    return static_cast<int64_t>(std::floor(std::log(std::max(p.time.tokens_per_s, 1e-9)) / std::log(1.005)));
  };
  std::stable_sort(result.fitting.begin(), result.fitting.end(), [&](const PipelinePlan& a, const PipelinePlan& b) {
    if (speed_class(a) != speed_class(b)) return speed_class(a) > speed_class(b);
    return a.peak_bytes < b.peak_bytes;
  });
  std::stable_sort(result.rejected.begin(), result.rejected.end(),
                   [](const auto& a, const auto& b) { return a.first.peak_bytes < b.first.peak_bytes; });
  return result;
}

std::string pipeline_search_text(const PipelineSearchResult& result, double max_memory_bytes) {
  std::ostringstream s;
  s << "pipeline search under " << bytes_text(max_memory_bytes) << " per rank: " << result.fitting.size()
    << " configuration(s) fit, " << result.rejected.size() << " do not, " << result.not_planned.size()
    << " not planned\n";
  for (size_t i = 0; i < result.fitting.size(); ++i) {
    const PipelinePlan& p = result.fitting[i];
    s << (i == 0 ? "  best:   " : "          ") << p.label() << ": peak " << bytes_text(static_cast<double>(p.peak_bytes))
      << " (pp rank " << p.peak_rank << "), bubble " << percent(p.bubble) << ", step "
      << milliseconds(p.time.step) << ", " << static_cast<int64_t>(p.time.tokens_per_s) << " tokens/s\n";
  }
  for (const auto& [p, why] : result.rejected) s << "  no fit: " << p.label() << ": " << why << "\n";
  for (const std::string& why : result.not_planned) s << "  not planned: " << why << "\n";
  return s.str();
}

}  // namespace fsdp
