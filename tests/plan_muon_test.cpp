// The planner's Muon ([Note: Muon in the plan], src/plan/plan_muon.h): a plan with optimizer
// "Muon" keeps Muon's momentum for the blocks' matrices and AdamW's moments for the rest, holds
// the exchange's buffers, the owners' whole matrices and the iteration at the optimizer step, and
// adds the Newton-Schulz flops and the two all-to-alls to the step. The references are the
// formulas, counted here from the shapes.
#include "error_of.h"
#include "gpt.h"
#include "gpt_plan.h"

#include <fsdp/muon.h>
#include <fsdp/plan.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <cmath>
#include <string>
#include <vector>

namespace {

fsdp::PlanUnit unit_of(const std::string& name, const std::vector<fsdp::PlanParam>& params) {
  fsdp::PlanUnit u;
  u.name = name;
  u.params = params;
  u.forward_flops = 1e6;
  u.forward_memory_bytes = 1e5;
  return u;
}

fsdp::PlanSetup setup_of(fsdp::PlanModel model, int world) {
  fsdp::PlanSetup s;
  s.model = std::move(model);
  s.model.sequence_tokens = 16;
  s.world = {world, world};
  s.device.fp32 = {1e12, 1e12, 1e11, 1e10};
  s.device.low_precision = {4e12, 4e12, 1e11, 1e10};
  s.links = {1e10, 1e9, 1e-5};
  return s;
}

fsdp::PlanSetup with_optimizer(fsdp::PlanSetup s, const std::string& name) {
  s.policy.optimizer.name = name;
  return s;
}

// A root of the GPT's kind (an embedding, the final norm, the head) and three blocks, each with a
// matrix per Linear and a bias, a norm; block 0 also holds a positional embedding table and a
// unit of its own holds a classifier head: 2-D, but AdamW's by their names.
fsdp::PlanModel mixed_model() {
  fsdp::PlanModel m;
  m.name = "mixed";
  m.root = unit_of("", {{"wte.weight", {64, 16}}, {"ln_f.weight", {16}}, {"lm_head.weight", {64, 16}}});
  for (int i = 0; i < 3; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    std::vector<fsdp::PlanParam> params{{h + "ln_1.weight", {16}},
                                        {h + "attn.c_attn.weight", {48, 16}},
                                        {h + "attn.c_attn.bias", {48}},
                                        {h + "mlp.c_proj.weight", {16, 40}}};
    if (i == 0) params.push_back({h + "pos_embed", {8, 16}});
    m.units.push_back(unit_of("h." + std::to_string(i), params));
  }
  m.units.push_back(unit_of("classifier", {{"classifier.head.weight", {10, 16}}}));
  return m;
}

// Of mixed_model: the matrices Muon steps, and every other element (AdamW's).
constexpr int64_t kMixedMatrices = 3 * (48 * 16 + 16 * 40);
constexpr int64_t kMixedOthers = (64 * 16 + 16 + 64 * 16) + 3 * (16 + 48) + 8 * 16 + 10 * 16;

int64_t total_optimizer_state(const fsdp::Plan& p) {
  int64_t sum = 0;
  for (const auto& rank : p.ranks) sum += rank.peak.optimizer_state;
  return sum;
}

// The iteration's flops, as [Note: Muon in the plan] counts them.
double ns_flops(double rows, double cols, double steps = 5) {
  const double m = std::min(rows, cols), n = std::max(rows, cols);
  return steps * (2 * m * m * n + 2 * m * m * m + 2 * m * m * n);
}

// fp32 parameters: Muon keeps one momentum element (4 bytes) per matrix element, AdamW two
// moments (8 bytes) per other element; the ranks' pieces cover each parameter once, so over the
// ranks the state is exactly that, whatever the cut.
TEST(PlannerMuon, StateIsMomentumForTheMatricesAndAdamWMomentsForTheRest) {
  EXPECT_EQ(fsdp::plan(setup_of(mixed_model(), 1)).setup.model.numel(), kMixedMatrices + kMixedOthers);
  for (int w : {1, 2, 3}) {
    SCOPED_TRACE("W = " + std::to_string(w));
    const fsdp::Plan muon = fsdp::plan(with_optimizer(setup_of(mixed_model(), w), "Muon"));
    const fsdp::Plan adamw = fsdp::plan(with_optimizer(setup_of(mixed_model(), w), "AdamW"));
    EXPECT_EQ(total_optimizer_state(muon), 4 * kMixedMatrices + 8 * kMixedOthers);
    EXPECT_EQ(total_optimizer_state(adamw), 8 * (kMixedMatrices + kMixedOthers));
    EXPECT_EQ(muon.muon.matrices, 6);
    EXPECT_EQ(muon.muon.matrix_elements, kMixedMatrices);
    if (w == 1) {
      EXPECT_EQ(muon.muon.momentum_bytes, 4 * kMixedMatrices);
    }
    EXPECT_LE(muon.muon.momentum_bytes, muon.ranks[0].peak.optimizer_state);
    for (size_t r = 0; r < muon.ranks.size(); ++r) {
      EXPECT_EQ(adamw.ranks[r].model_states - muon.ranks[r].model_states,
                adamw.ranks[r].peak.optimizer_state - muon.ranks[r].peak.optimizer_state);
    }
    EXPECT_EQ(adamw.muon.matrices, 0) << "an AdamW plan has no Muon";
  }
}

// Two blocks of one matrix each, 96x32 (tall) and 48x64 (wide), at W = 2: one rank owns each.
// Muon::step exchanges every matrix at once, in bf16; beside its pieces of both (P = 1536 + 1536
// elements, 2P bytes) a rank holds in turn (O = 3072: the elements it owns):
// - the owner of 96x32: at the second all-to-all, the whole (2O), its result (2O), the result's
//   contiguous copy (a tall result is a transposed view: 2O), the send buffer (2O) and its pieces
//   back (2P): 2P + 8O + 2P = 36864 bytes, above the iteration's 2P + 2O + 2·2·3072 + 2·2·32² = 28672;
// - the owner of 48x64: while orthogonalizing it, the whole (2O), the iterate and the next one
//   (2·2·3072) and the gram A and B (2·2·48²): 2P + 2O + 12288 + 9216 = 33792 bytes, above its
//   second all-to-all's 2P + 6O + 2P = 30720.
// Computing in bf16 without prefetch, nothing else the step holds comes near (a block's unsharded
// parameters and gradient and the last one's in flight: 6 x 3072 = 18432), so that is each
// rank's peak.
TEST(PlannerMuon, TheExchangeAndTheOwnersIterationAreInThePeakAtTheOptimizerStep) {
  fsdp::PlanModel m;
  m.name = "two matrices";
  m.root = unit_of("", {{"wte.weight", {8, 32}}});
  m.units = {unit_of("h.0", {{"h.0.mlp.c_fc.weight", {96, 32}}}), unit_of("h.1", {{"h.1.attn.c_attn.weight", {48, 64}}})};
  m.compute_dtype = at::kBFloat16;
  fsdp::PlanSetup s = with_optimizer(setup_of(m, 2), "Muon");
  s.policy.fsdp.forward_prefetch(false).backward_prefetch(fsdp::BackwardPrefetch::None).mixed_precision(
      fsdp::MixedPrecision().param_dtype(at::kBFloat16));
  const fsdp::Plan p = fsdp::plan(s);
  ASSERT_EQ(p.ranks.size(), 2u);
  const int64_t P = 3072, O = 3072;
  const int64_t tall_owner = 2 * P + 8 * O + 2 * P, wide_owner = 2 * P + 2 * O + 2 * 2 * O + 2 * 2 * 48 * 48;
  EXPECT_EQ(tall_owner, 36864);
  EXPECT_EQ(wide_owner, 33792);
  std::set<std::pair<int64_t, std::string>> seen;
  for (const auto& rank : p.ranks) {
    const std::string prefix = "the optimizer step (Muon: ";
    ASSERT_EQ(rank.peak_at.rfind(prefix, 0), 0u) << rank.peak_at;
    seen.insert({rank.peak.workspace, rank.peak_at.substr(prefix.size(), rank.peak_at.size() - prefix.size() - 1)});
  }
  EXPECT_EQ(seen, (std::set<std::pair<int64_t, std::string>>{
                      {tall_owner, "the second all-to-all"}, {wide_owner, "orthogonalizing h.1.attn.c_attn.weight"}}));
  EXPECT_EQ(p.muon.workspace, tall_owner);
  EXPECT_EQ(p.muon.workspace_at, "the second all-to-all");
  // The same run with AdamW holds none of it (its peak: in backward, a bf16 reduction's output
  // held to the reduction's end, [Note: the plan's reduced gradients]).
  const fsdp::Plan adamw = fsdp::plan(with_optimizer(s, "AdamW"));
  EXPECT_EQ(adamw.muon.workspace, 0);
  for (const auto& rank : adamw.ranks) EXPECT_EQ(rank.peak_at.find("Muon"), std::string::npos) << rank.peak_at;
}

// A frozen matrix is neither optimizer's: no momentum, no iteration, nothing exchanged.
TEST(PlannerMuon, FrozenMatricesKeepNothingAndCostNothing) {
  const fsdp::Plan trained = fsdp::plan(with_optimizer(setup_of(mixed_model(), 2), "Muon"));
  fsdp::PlanSetup s = with_optimizer(setup_of(mixed_model(), 2), "Muon");
  s.model.units[1].params[1].requires_grad = false;  // h.1.attn.c_attn.weight
  const fsdp::Plan one_frozen = fsdp::plan(s);
  EXPECT_EQ(one_frozen.muon.matrices, trained.muon.matrices - 1);
  EXPECT_EQ(one_frozen.muon.matrix_elements, trained.muon.matrix_elements - 48 * 16);
  EXPECT_EQ(total_optimizer_state(trained) - total_optimizer_state(one_frozen), 4 * 48 * 16)
      << "its momentum, and no AdamW state instead";
  EXPECT_DOUBLE_EQ(trained.muon.total_flops - one_frozen.muon.total_flops, ns_flops(48, 16));

  for (auto& unit : s.model.units) {
    for (auto& p : unit.params) p.requires_grad = p.shape.size() != 2;
  }
  const fsdp::Plan all_frozen = fsdp::plan(s);
  EXPECT_EQ(all_frozen.muon.matrices, 0);
  EXPECT_EQ(all_frozen.muon.momentum_bytes, 0);
  EXPECT_EQ(all_frozen.muon.workspace, 0);
  EXPECT_EQ(all_frozen.muon.total_flops, 0);
  EXPECT_EQ(all_frozen.traffic.all_to_all, 0);
  EXPECT_EQ(all_frozen.muon.newton_schulz_s, 0);
}

// Four blocks of one 64x24 matrix each (their elements divisible by 2, 3 and 4: each rank holds
// an equal piece). The flops: ns_steps x (gram + A·A + B·X) per matrix. The exchange, in bf16: a
// rank sends its piece of each matrix it does not own and, of each it owns, the others' pieces. The step: the iteration of the busiest rank and both all-to-alls, besides a lighter
// element-wise step (Muon's one state tensor against AdamW's two).
TEST(PlannerMuon, NewtonSchulzFlopsTimeAndAllToAllBytesFollowTheFormulas) {
  constexpr int64_t R = 64, C = 24, N = 4 * R * C;
  fsdp::PlanModel m;
  m.name = "four matrices";
  m.root = unit_of("", {{"wte.weight", {32, 24}}});
  for (int i = 0; i < 4; ++i) {
    const std::string h = "h." + std::to_string(i);
    m.units.push_back(unit_of(h, {{h + ".mlp.c_fc.weight", {R, C}}}));
  }
  const double total = 4 * ns_flops(R, C);
  EXPECT_DOUBLE_EQ(ns_flops(R, C), 5 * (4.0 * C * C * R + 2.0 * C * C * C));

  for (int f : {2, 3, 4}) {
    SCOPED_TRACE("F = " + std::to_string(f));
    const fsdp::PlanSetup s = with_optimizer(setup_of(m, f), "Muon");
    const fsdp::Plan muon = fsdp::plan(s);
    const fsdp::Plan adamw = fsdp::plan(with_optimizer(s, "AdamW"));
    EXPECT_DOUBLE_EQ(muon.muon.total_flops, total);
    // Longest-processing-time over equal matrices: the busiest rank does ceil(4 / F) of them.
    const int busiest = (4 + f - 1) / f;
    EXPECT_DOUBLE_EQ(muon.muon.busiest_flops, busiest * ns_flops(R, C));
    EXPECT_LE(muon.muon.busiest_flops, total / f + ns_flops(R, C));
    EXPECT_DOUBLE_EQ(muon.muon.newton_schulz_s, muon.muon.busiest_flops / s.device.low_precision.matmul_flops);
    // Rank 0 owns `busiest` matrices (ties go to the lower rank): its pieces of the others out,
    // the other ranks' pieces of its own back.
    const int64_t piece = R * C / f;
    const int64_t expected = (4 - busiest) * piece * 2 + busiest * (R * C - piece) * 2;
    EXPECT_EQ(muon.muon.all_to_all_by_rank.at(0), expected);
    // The others: each owns the rest in turn; rank 0 is the busiest, the mean is the ranks'.
    ASSERT_EQ(muon.muon.all_to_all_by_rank.size(), static_cast<size_t>(f));
    int64_t sum = 0;
    for (int r = 0; r < f; ++r) {
      const int owns = 4 / f + (r < 4 % f ? 1 : 0);
      const int64_t sent = (4 - owns) * piece * 2 + owns * (R * C - piece) * 2;
      EXPECT_EQ(muon.muon.all_to_all_by_rank[r], sent) << "rank " << r;
      sum += sent;
    }
    EXPECT_EQ(muon.muon.all_to_all_busiest, expected);
    EXPECT_EQ(muon.muon.all_to_all_busiest_rank, 0);
    EXPECT_DOUBLE_EQ(muon.muon.all_to_all_mean, static_cast<double>(sum) / f);
    EXPECT_EQ(muon.traffic.all_to_all, std::llround(static_cast<double>(sum) / f));
    EXPECT_EQ(adamw.traffic.all_to_all, 0);
    if (f != 3) {  // balanced: (F-1)/F x N_muon/F elements each way, 2 + 2 bytes
      EXPECT_EQ(expected, (f - 1) * N / f / f * 4);
    }
    // Both all-to-alls, and the all-reduce checking that every rank steps the 4 matrices (int32 each).
    const int64_t check = 2 * (f - 1) * (4 * 4) / f;
    EXPECT_EQ(muon.traffic.all_reduce - adamw.traffic.all_reduce, check);
    const double exchange = static_cast<double>(expected + check) / s.links.intra_host_bandwidth +
                            4 * (f - 1) * s.links.latency_s;
    EXPECT_NEAR(muon.muon.all_to_all_s, exchange, 1e-12);
    // Compute: the iteration, and Muon's element-wise pass over rank 0's pieces (fp32: 5 elements'
    // worth) instead of AdamW's (7).
    const double lighter_pass = 8.0 * (N / f) / s.device.fp32.memory_bandwidth;
    EXPECT_NEAR(muon.time.compute - adamw.time.compute, muon.muon.newton_schulz_s - lighter_pass, 1e-12);
    EXPECT_NEAR(muon.time.exposed_communication - adamw.time.exposed_communication, exchange, 1e-12);
  }

  // HYBRID with shard groups of 2: each group exchanges within itself, as at F = 2.
  fsdp::PlanSetup hybrid = with_optimizer(setup_of(m, 4), "Muon");
  hybrid.world.ranks_per_host = 2;
  hybrid.policy.fsdp.strategy(fsdp::ShardingStrategy::HybridShard);
  const fsdp::Plan h = fsdp::plan(hybrid);
  EXPECT_EQ(h.shard_group_size, 2);
  EXPECT_EQ(h.muon.all_to_all_busiest, (2 - 1) * N / 2 / 2 * 4);
  EXPECT_DOUBLE_EQ(h.muon.busiest_flops, total / 2);
  // NO_SHARD: every rank orthogonalizes every matrix, nothing moves.
  fsdp::PlanSetup unsharded = with_optimizer(setup_of(m, 2), "Muon");
  unsharded.policy.fsdp.strategy(fsdp::ShardingStrategy::NoShard);
  const fsdp::Plan u = fsdp::plan(unsharded);
  EXPECT_EQ(u.muon.all_to_all_busiest, 0);
  EXPECT_EQ(u.traffic.all_to_all, 0);
  EXPECT_DOUBLE_EQ(u.muon.busiest_flops, total);
}

// The GPT and Llama descriptions: Muon steps each block's Linear weights, AdamW the embeddings,
// the head, the norms and the biases, as fsdp::optim::split_for_muon splits the built model; the
// report says so.
void expect_the_runs_split(const fsdp::Plan& plan, const gpt::GPTConfig& config) {
  gpt::GPT model(config);
  const fsdp::optim::MuonSplit split = fsdp::optim::split_for_muon(*model);
  int64_t elements = 0;
  for (const auto& m : split.matrices) elements += m.numel();
  EXPECT_EQ(plan.muon.matrices, static_cast<int64_t>(split.matrices.size()));
  EXPECT_EQ(plan.muon.matrix_elements, elements);
}

fsdp::Plan muon_plan_of(const gpt::GPTConfig& config) {
  fsdp::PlanSetup s;
  s.model = gpt::describe_gpt(config, at::kFloat, 0);
  s.world = {2, 2};
  s.device.fp32 = {1e12, 1e12, 1e11, 1e10};
  s.links = {1e10, 1e9, 1e-5};
  s.policy.optimizer.name = "Muon";
  return fsdp::plan(s);
}

TEST(PlannerMuon, GptAndLlamaDescriptionsPlanTheBlocksMatricesWithMuon) {
  const gpt::GPTConfig gpt2_config = gpt::GPTConfig::sized(3, 64, 4, 32);
  const fsdp::Plan gpt2 = muon_plan_of(gpt2_config);
  EXPECT_EQ(gpt2.muon.matrices, 3 * 4) << "c_attn, attn.c_proj, c_fc, mlp.c_proj";
  EXPECT_EQ(gpt2.muon.matrix_elements, 3 * 12 * 64 * 64);
  expect_the_runs_split(gpt2, gpt2_config);
  for (const bool tied : {false, true}) {
    gpt::GPTConfig config = gpt::GPTConfig::sized(2, 32, 4, 8, "llama");
    config.kv_heads = 2;  // k and v: 16 x 32
    config.ffn_dim = 40;
    config.tied_head = tied;
    const fsdp::Plan llama = muon_plan_of(config);
    EXPECT_EQ(llama.muon.matrices, 2 * 7) << "q, k, v, o, gate, up, down";
    EXPECT_EQ(llama.muon.matrix_elements, 2 * (2 * 32 * 32 + 2 * 16 * 32 + 3 * 40 * 32)) << "tied " << tied;
    expect_the_runs_split(llama, config);
  }
  const std::string text = fsdp::plan_text(gpt2);
  std::printf("%s", text.c_str());
  EXPECT_NE(text.find("optimizer: Muon on 12 matrices"), std::string::npos) << text;
  EXPECT_NE(text.find("workspace at the optimizer step"), std::string::npos) << text;
  EXPECT_NE(text.find("Newton-Schulz per step"), std::string::npos) << text;
  EXPECT_NE(text.find("all-to-all per step"), std::string::npos) << text;
  const nlohmann::json json = fsdp::plan_json(gpt2);
  EXPECT_EQ(json.at("muon").at("matrices"), 12);
  EXPECT_EQ(json.at("traffic").at("all_to_all_bytes"), gpt2.traffic.all_to_all);
}

TEST(PlannerMuon, MuonWithAnOptionItLacksOrNoIterationsIsRefused) {
  fsdp::PlanSetup s = with_optimizer(setup_of(mixed_model(), 2), "Muon");
  s.policy.optimizer.amsgrad = true;
  const std::string amsgrad = fsdp_test::error_of([&] { fsdp::plan(s); });
  EXPECT_NE(amsgrad.find("the optimizer Muon has no amsgrad option"), std::string::npos) << amsgrad;
  s.policy.optimizer.amsgrad = false;
  s.policy.optimizer.ns_steps = 0;
  const std::string no_steps = fsdp_test::error_of([&] { fsdp::plan(s); });
  EXPECT_NE(no_steps.find("Muon's ns_steps (PlanPolicy::optimizer.ns_steps) must be >= 1"), std::string::npos)
      << no_steps;
}

}  // namespace
