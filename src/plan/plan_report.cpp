#include <fsdp/plan.h>

#include "plan/bytes_text.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace fsdp {

namespace {

using planning::bytes_text;

nlohmann::json breakdown_json(const MemoryBreakdown& m) {
  return {{"sharded_params", m.sharded_params}, {"sharded_grads", m.sharded_grads},
          {"optimizer_state", m.optimizer_state}, {"unsharded_params", m.unsharded_params},
          {"unsharded_grads", m.unsharded_grads}, {"activations", m.activations},
          {"workspace", m.workspace}, {"program", m.program},
          {"staging", m.staging}, {"total", m.total()}};
}

const RankMemory& peak_rank(const Plan& plan) {
  return *std::max_element(plan.ranks.begin(), plan.ranks.end(), [](const RankMemory& a, const RankMemory& b) {
    return a.peak.total() < b.peak.total();
  });
}

void breakdown_lines(std::ostringstream& s, const MemoryBreakdown& m) {
  const std::pair<const char*, int64_t> rows[] = {
      {"sharded parameters", m.sharded_params}, {"gradient shards", m.sharded_grads},
      {"optimizer state", m.optimizer_state}, {"unsharded parameters", m.unsharded_params},
      {"unsharded gradients", m.unsharded_grads}, {"activations", m.activations},
      {"workspace", m.workspace}, {"program (data, batch)", m.program},
      {"async save's staging arena", m.staging}};
  for (const auto& [what, bytes] : rows) {
    if (bytes == 0 && what == rows[8].first) continue;  // no asynchronous save planned
    s << "    " << what << ": " << bytes_text(static_cast<double>(bytes)) << "\n";
  }
}

nlohmann::json muon_json(const PlanMuon& m) {
  return {{"matrices", m.matrices}, {"matrix_elements", m.matrix_elements}, {"momentum_bytes", m.momentum_bytes},
          {"workspace_bytes", m.workspace}, {"workspace_rank", m.workspace_rank}, {"workspace_at", m.workspace_at},
          {"newton_schulz_flops", m.total_flops},
          {"busiest_rank_flops", m.busiest_flops}, {"newton_schulz_s", m.newton_schulz_s},
          {"all_to_all_busiest_bytes", m.all_to_all_busiest}, {"all_to_all_busiest_rank", m.all_to_all_busiest_rank},
          {"all_to_all_mean_bytes", m.all_to_all_mean}, {"all_to_all_bytes_by_rank", m.all_to_all_by_rank},
          {"all_to_all_s", m.all_to_all_s}};
}

// Muon's lines ([Note: Muon in the plan]): what it keeps, what its owners hold, compute and send.
void muon_lines(std::ostringstream& s, const Plan& plan) {
  const PlanMuon& m = plan.muon;
  const int f = plan.shard_group_size;
  char text[320];
  std::snprintf(text, sizeof(text), "  optimizer: Muon on %lld matrices (%lld elements), AdamW on the rest; "
                "Muon's momentum: %s on rank 0 (in optimizer state)\n", static_cast<long long>(m.matrices),
                static_cast<long long>(m.matrix_elements), bytes_text(static_cast<double>(m.momentum_bytes)).c_str());
  s << text;
  if (m.matrices == 0) return;
  s << "    workspace at the optimizer step (pieces, owned matrices whole, results, iteration): "
    << bytes_text(static_cast<double>(m.workspace)) << " (rank " << m.workspace_rank << ", " << m.workspace_at << ")\n";
  std::snprintf(text, sizeof(text), "    Newton-Schulz per step: %.3g GFLOP on the busiest of %d rank(s) (balanced "
                "share %.3g), %.1f ms in compute\n", m.busiest_flops / 1e9, f, m.total_flops / f / 1e9,
                m.newton_schulz_s * 1000);
  s << text;
  if (m.all_to_all_busiest > 0) {
    std::snprintf(text, sizeof(text), "    all-to-all per step (updates to owners, results back, in bf16%s): "
                  "%lld bytes sent by the busiest rank (%d), %.0f on average; %.1f ms, not hidden; the "
                  "reduce-scatter sends %lld\n", plan.setup.policy.tp_size > 1 ? "; split matrices over the tp group too" : "",
                  static_cast<long long>(m.all_to_all_busiest), m.all_to_all_busiest_rank, m.all_to_all_mean,
                  m.all_to_all_s * 1000, static_cast<long long>(plan.traffic.reduce_scatter));
    s << text;
  }
}

// TP's part of the bytes line ([Note: tensor parallelism in the plan]): its own collectives, the
// link they run on, their time (exposed: compute waits for each).
void tp_lines(std::ostringstream& s, const Plan& plan) {
  const PlanTraffic& t = plan.traffic;
  char text[200];
  std::snprintf(text, sizeof(text), " (FSDP's, over the data-parallel ranks);\n    tensor parallel (TP=%d): "
                "all-gather %lld, reduce-scatter %lld, all-reduce %lld", plan.setup.policy.tp_size,
                static_cast<long long>(t.tp_all_gather), static_cast<long long>(t.tp_reduce_scatter),
                static_cast<long long>(t.tp_all_reduce));
  s << text;
  std::snprintf(text, sizeof(text), ", %.1f ms, not hidden, %s\n    FSDP's and TP's", plan.time.tensor_parallel * 1000,
                plan.tp_spans_hosts ? "ACROSS HOSTS (a TP group is wider than a host)" : "within a host");
  s << text;
}

}  // namespace

nlohmann::json plan_json(const Plan& plan) {
  const PlanSetup& setup = plan.setup;
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : plan.ranks) {
    ranks.push_back({{"rank", r.rank}, {"peak_bytes", r.peak.total()}, {"peak_at", r.peak_at},
                     {"breakdown", breakdown_json(r.peak)}, {"model_states_bytes", r.model_states},
                     {"offloaded_bytes", r.offloaded_bytes}, {"staging_bytes", r.staging_bytes}});
  }
  const FullyShardOptions& o = setup.policy.fsdp;
  nlohmann::json json = {{"model", setup.model.name}, {"parameters", setup.model.numel()},
          {"world_size", setup.world.world_size}, {"ranks_per_host", setup.world.ranks_per_host},
          {"strategy", to_string(o.strategy())}, {"shard_group_size", plan.shard_group_size},
          {"replicas", plan.replicas}, {"batch_per_rank", setup.policy.batch},
          {"micro_batches", setup.policy.micro_batches}, {"no_sync", setup.policy.no_sync},
          {"compute_dtype", c10::toString(setup.model.compute_dtype)},
          {"activation_checkpointing", o.activation_checkpointing()}, {"cpu_offload", o.cpu_offload()},
          {"limit_all_gathers", o.limit_all_gathers()}, {"label", plan.label()},
          {"peak_bytes", plan.peak_bytes}, {"device_memory_bytes", setup.device.memory_bytes},
          {"fits", plan.fits}, {"host_fits", plan.host_fits}, {"at_risk", plan.at_risk}, {"headroom", plan.headroom},
          {"ranks", ranks},
          {"optimizer", setup.policy.optimizer.name},
          {"traffic", {{"all_gather_bytes", plan.traffic.all_gather}, {"reduce_scatter_bytes", plan.traffic.reduce_scatter},
                       {"all_reduce_bytes", plan.traffic.all_reduce}, {"all_to_all_bytes", plan.traffic.all_to_all},
                       {"intra_host_bytes", plan.traffic.intra_host},
                       {"cross_host_bytes", plan.traffic.cross_host}, {"collectives", plan.traffic.collectives}}},
          {"time", {{"compute_s", plan.time.compute}, {"communication_s", plan.time.communication},
                    {"exposed_communication_s", plan.time.exposed_communication},
                    {"step_s", plan.time.step}, {"tokens_per_s", plan.time.tokens_per_s}}}};
  if (setup.policy.optimizer.name == "Muon") json["muon"] = muon_json(plan.muon);
  if (setup.policy.tp_size > 1) {  // absent at T = 1: the JSON of a plan without TP as before
    json["tp_size"] = setup.policy.tp_size;
    json["tp_spans_hosts"] = plan.tp_spans_hosts;
    json["traffic"]["tp_all_gather_bytes"] = plan.traffic.tp_all_gather;
    json["traffic"]["tp_reduce_scatter_bytes"] = plan.traffic.tp_reduce_scatter;
    json["traffic"]["tp_all_reduce_bytes"] = plan.traffic.tp_all_reduce;
    json["time"]["tensor_parallel_s"] = plan.time.tensor_parallel;
  }
  return json;
}

std::string plan_text(const Plan& plan) {
  const PlanSetup& setup = plan.setup;
  std::ostringstream s;
  s << "plan: " << setup.model.name << ", " << setup.model.numel() << " parameters"
    << (setup.policy.tp_size > 1 ? " per TP rank" : "") << ", W = "
    << setup.world.world_size << " (" << setup.world.ranks_per_host << " per host): " << plan.label()
    << ", " << plan.replicas << " replica group(s)\n";
  if (setup.policy.tp_size > 1) {
    s << "  mesh: dp " << setup.world.world_size / setup.policy.tp_size << " x tp " << setup.policy.tp_size
      << " (TP groups: consecutive ranks" << (plan.tp_spans_hosts ? ", WIDER THAN A HOST" : ", inside a host")
      << "; FSDP over the data-parallel ranks of each TP index)\n";
  }
  const RankMemory& top = peak_rank(plan);
  s << "  peak memory per rank: " << bytes_text(static_cast<double>(plan.peak_bytes)) << " (rank " << top.rank
    << ", during " << top.peak_at << ")";
  if (setup.device.memory_bytes > 0) {
    char text[160];
    std::snprintf(text, sizeof(text), " of %s: %s, headroom %.1f%% (at risk below %.0f%%)",
                  bytes_text(setup.device.memory_bytes).c_str(),
                  !plan.fits ? "DOES NOT FIT" : plan.at_risk ? "fits, AT RISK" : "fits", 100 * plan.headroom,
                  100 * setup.device.allocator_reserve);
    s << text;
  }
  s << "\n";
  breakdown_lines(s, top.peak);
  s << "    model states (parameters, gradients, optimizer): " << bytes_text(static_cast<double>(top.model_states));
  if (top.offloaded_bytes > 0) {
    s << " in host memory (CPU offload)";
    if (setup.device.host_memory_bytes > 0) {
      s << " of " << bytes_text(setup.device.host_memory_bytes) << (plan.host_fits ? "" : ": DOES NOT FIT");
    }
  }
  s << "\n";
  if (plan.ranks.size() > 1) {
    int64_t low = plan.peak_bytes;
    for (const auto& r : plan.ranks) low = std::min(low, r.peak.total());
    s << "  other ranks: " << bytes_text(static_cast<double>(low)) << " to " << bytes_text(static_cast<double>(plan.peak_bytes)) << "\n";
  }
  const PlanTraffic& t = plan.traffic;
  if (setup.policy.optimizer.name == "Muon") muon_lines(s, plan);
  s << "  bytes sent per step per rank: all-gather " << t.all_gather << ", reduce-scatter " << t.reduce_scatter
    << ", all-reduce " << t.all_reduce;
  if (t.all_to_all > 0) s << ", all-to-all " << t.all_to_all << " (mean over the ranks)";
  if (setup.policy.tp_size > 1) tp_lines(s, plan);
  s << "; on links within a host " << t.intra_host << ", across hosts "
    << t.cross_host << " (mean over the ranks); " << t.collectives << " collectives\n";
  char text[256];
  std::snprintf(text, sizeof(text), "  step time: %.1f ms (compute %.1f ms, communication %.1f ms of which %.1f ms "
                "not hidden by prefetch), %.0f tokens/s over the world\n", plan.time.step * 1000,
                plan.time.compute * 1000, plan.time.communication * 1000,
                plan.time.exposed_communication * 1000, plan.time.tokens_per_s);
  s << text;
  if (setup.policy.micro_batches > 1) {
    std::snprintf(text, sizeof(text), "  (the step time is one micro-batch's: a step of %lld takes %.1f ms)\n",
                  static_cast<long long>(setup.policy.micro_batches),
                  plan.time.step * 1000 * static_cast<double>(setup.policy.micro_batches));
    s << text;
  }
  return s.str();
}

nlohmann::json search_json(const SearchResult& result, double max_memory_bytes) {
  nlohmann::json fitting = nlohmann::json::array(), rejected = nlohmann::json::array();
  for (size_t i = 0; i < result.fitting.size(); ++i) {
    auto j = plan_json(result.fitting[i]);
    j["slower_because"] = result.slower_because[i];
    fitting.push_back(j);
  }
  for (const auto& [p, why] : result.rejected) {
    rejected.push_back({{"label", p.label()}, {"peak_bytes", p.peak_bytes}, {"why", why}});
  }
  return {{"max_memory_bytes", max_memory_bytes}, {"fitting", fitting}, {"rejected", rejected}};
}

std::string search_text(const SearchResult& result, double max_memory_bytes) {
  std::ostringstream s;
  s << "search under " << bytes_text(max_memory_bytes) << " per rank: " << result.fitting.size() << " configuration(s) fit, "
    << result.rejected.size() << " do not\n";
  for (size_t i = 0; i < result.fitting.size(); ++i) {
    const Plan& p = result.fitting[i];
    char text[160];
    std::snprintf(text, sizeof(text), "  %s %-42s peak %s, step %.1f ms, %.0f tokens/s", i == 0 ? "best:     " : i == 1 ? "runner-up:" : "          ",
                  p.label().c_str(), bytes_text(static_cast<double>(p.peak_bytes)).c_str(), p.time.step * 1000, p.time.tokens_per_s);
    s << text;
    if (i > 0) s << ": " << result.slower_because[i];
    s << "\n";
  }
  for (const auto& [p, why] : result.rejected) s << "  no fit:     " << p.label() << ": " << why << "\n";
  if (!result.fitting.empty()) s << "\n" << plan_text(result.fitting.front());
  return s.str();
}

}  // namespace fsdp
