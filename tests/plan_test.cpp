// The planner on its own: the paper's GPT-175B runs (Zhao et al., section 5.4), the search, the
// layout's padding, and bad setups. Its predictions against real runs: plan_grid_test.cpp.
#include "gpt_plan.h"
#include "model_family.h"

#include <fsdp/memory.h>
#include <fsdp/plan.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <map>

namespace {

using fsdp::Plan;

constexpr double kGiB = 1024.0 * 1024 * 1024;

// An A100-80GB as the plans below need it: its memory and a caching allocator's reserve (the
// share the paper's 128-GPU batch-2 run lost to cached blocks); rates only order the search.
fsdp::PlanDevice a100_80gb() {
  fsdp::PlanDevice d;
  d.memory_bytes = 80 * kGiB;
  d.allocator_reserve = 0.30;
  d.fp32 = {100e12, 60e12, 300e9, 1.7e12};
  d.low_precision = {200e12, 120e12, 170e9, 1.7e12};
  d.op_overhead_s = 5e-6;
  return d;
}

gpt::GPTConfig min_gpt_175b() {
  gpt::GPTConfig c;
  c.layers = 96;
  c.dim = 12288;
  c.heads = 96;
  c.max_seq = 2048;
  c.vocab_size = 50000;
  return c;
}

fsdp::PlanSetup paper_setup(int gpus, int64_t batch, fsdp::ShardingStrategy strategy) {
  fsdp::PlanSetup s;
  s.model = gpt::describe_gpt(min_gpt_175b(), at::kBFloat16, 0, gpt::GptCode::MinGpt);
  s.world = {gpus, 8};
  s.device = a100_80gb();
  s.links = {240e9, 25e9, 10e-6};
  s.policy.fsdp.strategy(strategy).activation_checkpointing(true).mixed_precision(
      fsdp::MixedPrecision().param_dtype(at::kBFloat16));
  s.policy.batch = batch;
  // The paper's runs predate PyTorch 2.0, whose zero_grad still zeroed gradients in place: they
  // held their gradient shards from one step to the next.
  s.policy.gradients_kept = true;
  return s;
}

TEST(Planner, PaperGpt175BFitsEveryConfigurationAndBatch2On128GpusIsAtRisk) {
  // Ψ of minGPT-175B counted here, not by the description: 96 blocks of 12C² + 13C, token and
  // position embeddings, the untied head, the final LayerNorm.
  const double C = 12288, V = 50000, T = 2048;
  const double psi = 96 * (12 * C * C + 13 * C) + 2 * V * C + T * C + 2 * C;
  const int units = 97;
  std::map<std::pair<int, int64_t>, fsdp::Plan> plans;
  std::printf("%5s %5s %12s %10s %8s\n", "GPUs", "batch", "peak GiB", "headroom", "at risk");
  for (int gpus : {128, 192, 256, 384, 512}) {
    for (int64_t batch : {1, 2}) {
      const fsdp::Plan p = fsdp::plan(paper_setup(gpus, batch, fsdp::ShardingStrategy::FullShard));
      std::printf("%5d %5lld %12.2f %9.1f%% %8s\n", gpus, (long long)batch, p.peak_bytes / kGiB,
                  100 * p.headroom, p.at_risk ? "yes" : "no");
      EXPECT_TRUE(p.fits) << gpus << " GPUs, batch " << batch;
      EXPECT_EQ(p.at_risk, gpus == 128 && batch == 2) << gpus << " GPUs, batch " << batch;
      // Model states: ZeRO's 16 bytes per parameter over W (bf16 compute, fp32 master, gradient
      // shard and Adam's two moments), plus at most one padding element per unit.
      for (const auto& rank : p.ranks) {
        EXPECT_GE(rank.model_states, static_cast<int64_t>(16 * psi / gpus) - 16);
        EXPECT_LE(rank.model_states, static_cast<int64_t>(16 * psi / gpus) + 16 * units);
      }
      plans.emplace(std::make_pair(gpus, batch), p);
    }
  }
  EXPECT_NEAR(static_cast<double>(plans.begin()->second.setup.model.numel()), psi, 0.5);
  // Peak memory falls as GPUs are added; batch 2 at 128 GPUs has the least headroom.
  for (int64_t batch : {1, 2}) {
    int previous = 0;
    for (int gpus : {128, 192, 256, 384, 512}) {
      if (previous) {
        EXPECT_LT(plans.at({gpus, batch}).peak_bytes, plans.at({previous, batch}).peak_bytes)
            << gpus << " GPUs, batch " << batch;
      }
      previous = gpus;
    }
  }
  for (const auto& [key, p] : plans) {
    if (key != std::make_pair(128, int64_t{2})) {
      EXPECT_GT(p.headroom, plans.at({128, 2}).headroom);
    }
  }
  // Unsharded (every GPU holds the whole model, as DDP) it does not fit at all.
  const fsdp::Plan unsharded = fsdp::plan(paper_setup(128, 1, fsdp::ShardingStrategy::NoShard));
  EXPECT_FALSE(unsharded.fits);
  EXPECT_GT(unsharded.peak_bytes, 16 * psi);
}

// A GPT of 3 blocks small enough to plan at W = 4, two ranks to a host.
fsdp::PlanSetup small_setup() {
  fsdp::PlanSetup s;
  gpt::GPTConfig c = gpt::GPTConfig::sized(3, 95, 5, 64);  // Ψ_u not multiples of 4: padding
  s.model = gpt::describe_gpt(c, at::kFloat, 0);
  s.world = {4, 2};
  s.device = a100_80gb();
  s.links = {50e9, 5e9, 20e-6};
  s.policy.batch = 4;
  return s;
}

TEST(Planner, ShardsArePaddedPerUnitAndTheRanksPiecesCoverEveryParameterOnce) {
  fsdp::PlanSetup s = small_setup();
  const fsdp::Plan p = fsdp::plan(s);
  // Ψ_u per unit from the shapes (blocks: 12C² + 13C; root: (V + T)·C + 2C), not the planner's.
  const int64_t C = 95, block = 12 * C * C + 13 * C, root = (256 + 64) * C + 2 * C;
  int64_t padded = 0;
  for (int64_t numel : {root, block, block, block}) padded += (numel + 3) / 4;  // ceil(Ψ_u / 4)
  int64_t moments = 0;
  for (const auto& rank : p.ranks) {
    // A padded fp32 shard and gradient shard per unit; the rest is AdamW's two moments of the
    // rank's pieces (8 bytes an element), padding excluded.
    const int64_t rank_moments = rank.model_states - 8 * padded;
    EXPECT_GE(rank_moments, 8 * (padded - 3 * 4));  // at most 3 padding elements per unit
    EXPECT_LE(rank_moments, 8 * padded);
    moments += rank_moments;
  }
  EXPECT_EQ(moments, 8 * (root + 3 * block)) << "the pieces of the 4 ranks are each parameter once";
  ASSERT_EQ(p.ranks.size(), 4u);
  EXPECT_LT(p.ranks[3].model_states, p.ranks[0].model_states) << "the last rank holds the padding";
}

// zero_grad frees the gradient shards ([Note: gradient shards live as long as the gradients]):
// a step starts without them and backward allocates them unit by unit, so the peak holds only
// those allocated by then; kept between steps (zero_grad in place) the peak holds them all.
TEST(Planner, GradientShardsFreedByZeroGradAreAllocatedAgainByBackward) {
  const int64_t C = 95, block = 12 * C * C + 13 * C, root = (256 + 64) * C + 2 * C;
  for (int w : {1, 4}) {
    SCOPED_TRACE("W = " + std::to_string(w));
    fsdp::PlanSetup s = small_setup();
    s.world = {w, std::min(w, 2)};
    int64_t grad_shards = 0;  // fp32, ceil(Ψ_u / W) per unit
    for (int64_t numel : {root, block, block, block}) grad_shards += 4 * ((numel + w - 1) / w);
    const fsdp::Plan freed = fsdp::plan(s);
    s.policy.gradients_kept = true;
    const fsdp::Plan kept = fsdp::plan(s);
    for (size_t r = 0; r < kept.ranks.size(); ++r) {
      EXPECT_EQ(kept.ranks[r].peak.sharded_grads, grad_shards);
      EXPECT_LT(freed.ranks[r].peak.sharded_grads, grad_shards) << "peak " << freed.ranks[r].peak_at;
      EXPECT_EQ(freed.ranks[r].model_states, kept.ranks[r].model_states);
      EXPECT_GT(kept.ranks[r].peak.total(), freed.ranks[r].peak.total());
      EXPECT_LE(kept.ranks[r].peak.total() - freed.ranks[r].peak.total(), grad_shards);
    }
  }
}

// Frozen parameters ([Note: a unit's flat parameters]): the engine flattens a unit's frozen
// parameters apart from its trainable ones, gathers both and reduces, keeps gradients and
// optimizer state for the trainable ones only. The reference sums the parameters' own numels by
// kind, each group padded to the shard group on its own.
TEST(Planner, FrozenParametersHaveNoGradientReductionOrOptimizerState) {
  fsdp::PlanSetup s = small_setup();  // W = F = 4
  const fsdp::Plan trained = fsdp::plan(s);
  auto frozen = [](const std::string& name) {
    return name.rfind("h.1.", 0) == 0 || name.find(".attn.") != std::string::npos;
  };
  for (auto* unit : {&s.model.root, &s.model.units[0], &s.model.units[1], &s.model.units[2]}) {
    for (auto& p : unit->params) p.requires_grad = !frozen(p.name);
  }
  const fsdp::Plan partly = fsdp::plan(s);
  const int f = 4;
  auto shard = [&](int64_t numel) { return (numel + f - 1) / f; };
  int64_t held = 0, gathered = 0, reduced = 0;
  for (const auto* unit : {&s.model.root, &s.model.units[0], &s.model.units[1], &s.model.units[2]}) {
    int64_t trainable = 0, fixed = 0;
    for (const auto& p : unit->params) (p.requires_grad ? trainable : fixed) += p.numel();
    held += shard(trainable) + shard(fixed);
    // FULL_SHARD gathers the blocks again for backward; the root stays gathered.
    gathered += (unit == &s.model.root ? 1 : 2) * (shard(trainable) + shard(fixed));
    reduced += shard(trainable);
  }
  EXPECT_EQ(partly.traffic.all_gather, 4 * (f - 1) * gathered);
  EXPECT_EQ(partly.traffic.reduce_scatter, 4 * (f - 1) * reduced);
  EXPECT_LT(partly.traffic.reduce_scatter, trained.traffic.reduce_scatter);
  EXPECT_LT(partly.peak_bytes, trained.peak_bytes);
  for (size_t r = 0; r < partly.ranks.size(); ++r) {
    EXPECT_EQ(partly.ranks[r].peak.sharded_params, 4 * held) << "frozen or not, every parameter keeps its shard";
    EXPECT_LT(partly.ranks[r].model_states, trained.ranks[r].model_states);
    EXPECT_LT(partly.ranks[r].peak.optimizer_state, trained.ranks[r].peak.optimizer_state);
  }
  // The kind is part of a model's description.
  const fsdp::PlanModel read = fsdp::plan_model_from_json(nlohmann::json::parse(fsdp::plan_model_json(s.model).dump()));
  EXPECT_FALSE(read.units[1].params[0].requires_grad);
  EXPECT_TRUE(read.units[0].params[0].requires_grad);
  s.model = read;
  EXPECT_EQ(fsdp::plan(s).peak_bytes, partly.peak_bytes);
}

// The step time replays the planned step's events on one communication lane: what compute
// waits for is exposed. Contracts, not the replay's arithmetic: with links that take no time
// nothing is exposed but the program's own all-reduce; one lane cannot beat its collectives back
// to back; without prefetch every gather of the forward is exposed (each unit waits for its own,
// issued as it starts), and prefetch hides some of them.
TEST(Planner, StepTimeExposesWhatTheStepWaitsForOnOneLane) {
  fsdp::PlanSetup s = small_setup();
  s.world = {4, 4};  // one host: every ring at the intra-host bandwidth
  s.links = {1e30, 1e30, 0};
  const fsdp::Plan free_links = fsdp::plan(s);
  EXPECT_NEAR(free_links.time.exposed_communication, 0, 1e-12);
  EXPECT_NEAR(free_links.time.step, free_links.time.compute, 1e-12);

  s.links = {1e6, 1e6, 1e-3};  // far slower than compute
  const fsdp::Plan slow = fsdp::plan(s);
  EXPECT_GE(slow.time.step, slow.time.communication) << "one lane: the collectives back to back";
  EXPECT_LE(slow.time.exposed_communication, slow.time.communication);

  s.links = {50e9, 50e9, 20e-6};
  const fsdp::Plan prefetched = fsdp::plan(s);
  s.policy.fsdp.forward_prefetch(false).backward_prefetch(fsdp::BackwardPrefetch::None);
  const fsdp::Plan unprefetched = fsdp::plan(s);
  // Forward gathers: the root's and each block's, 3 shards of ceil(Ψ_u / 4) fp32 elements each.
  const int64_t C = 95, block = 12 * C * C + 13 * C, root = (256 + 64) * C + 2 * C;
  double forward_gathers = 0;
  for (int64_t numel : {root, block, block, block}) forward_gathers += 3 * 4 * ((numel + 3) / 4) / 50e9 + 3 * 20e-6;
  EXPECT_GE(unprefetched.time.exposed_communication, forward_gathers * (1 - 1e-9));
  EXPECT_LT(prefetched.time.exposed_communication, unprefetched.time.exposed_communication);
  EXPECT_LT(prefetched.time.step, unprefetched.time.step);
  EXPECT_DOUBLE_EQ(prefetched.time.compute, unprefetched.time.compute);
}

TEST(Planner, SearchReturnsTheFastestConfigurationUnderTheCapAndWhyTheOthersLose) {
  const fsdp::PlanSetup s = small_setup();
  fsdp::SearchSpace space;
  space.batches = {1, 2, 4};
  // A cap between the smallest and the largest peak of the space.
  const fsdp::SearchResult all = fsdp::search_plans(s, space, 1e15);
  int64_t low = INT64_MAX, high = 0;
  for (const auto& p : all.fitting) {
    low = std::min(low, p.peak_bytes);
    high = std::max(high, p.peak_bytes);
  }
  ASSERT_LT(low, high);
  const double cap = (low + high) / 2.0;
  const fsdp::SearchResult r = fsdp::search_plans(s, space, cap);
  ASSERT_NE(r.best(), nullptr);
  ASSERT_GE(r.fitting.size(), 2u);
  EXPECT_FALSE(r.rejected.empty());
  EXPECT_EQ(r.fitting.size() + r.rejected.size(), all.fitting.size());
  for (size_t i = 0; i < r.fitting.size(); ++i) {
    EXPECT_LE(r.fitting[i].peak_bytes, cap);
    if (i > 0) {  // slower (0.5% is the model's resolution), or as fast with more memory
      const Plan &a = r.fitting[i - 1], &b = r.fitting[i];
      EXPECT_LE(b.time.tokens_per_s, a.time.tokens_per_s * 1.005);
      if (b.time.tokens_per_s == a.time.tokens_per_s) {
        EXPECT_GE(b.peak_bytes, a.peak_bytes);
      }
      EXPECT_TRUE(r.slower_because[i].find("fewer tokens/s") != std::string::npos ||
                  r.slower_because[i].find("as fast, more memory") != std::string::npos)
          << r.slower_because[i];
    }
  }
  for (const auto& [p, why] : r.rejected) {
    EXPECT_GT(p.peak_bytes, cap);
    EXPECT_NE(why.find("> cap"), std::string::npos) << why;
  }
  // Hybrid sharding takes the ranks of a host as its shard group.
  bool saw_hybrid = false;
  for (const auto& p : all.fitting) {
    if (p.setup.policy.fsdp.strategy() == fsdp::ShardingStrategy::HybridShard) {
      saw_hybrid = true;
      EXPECT_EQ(p.shard_group_size, 2);
      EXPECT_EQ(p.replicas, 2);
    }
  }
  EXPECT_TRUE(saw_hybrid);
  EXPECT_EQ(fsdp::search_plans(s, space, low / 2.0).best(), nullptr);
}

TEST(Planner, BadSetupsAreRefusedNamingTheCause) {
  auto message = [](fsdp::PlanSetup s) {
    try {
      fsdp::plan(s);
    } catch (const c10::Error& e) {
      return e.msg();
    }
    return std::string("no error");
  };
  fsdp::PlanSetup s = small_setup();
  s.policy.fsdp.strategy(fsdp::ShardingStrategy::HybridShard).shard_group_size(3);
  EXPECT_NE(message(s).find("does not divide"), std::string::npos) << message(s);
  s = small_setup();
  s.policy.batch = 0;
  EXPECT_NE(message(s).find("batch per rank must be >= 1"), std::string::npos) << message(s);
  s = small_setup();
  s.world.ranks_per_host = 3;
  EXPECT_NE(message(s).find("ranks per host (3) must divide"), std::string::npos) << message(s);
  s = small_setup();
  s.policy.fsdp.mixed_precision(fsdp::MixedPrecision().param_dtype(at::kBFloat16));
  EXPECT_NE(message(s).find("describe the model for the policy's param_dtype"), std::string::npos) << message(s);
}

}  // namespace

namespace {

// The planner's parameters are the model's: describe_gpt's units, in order, name and shape every
// parameter of a GPT built by gpt.cpp as named_parameters() lists it (the blocks' under "h.N.",
// the root's the rest); minGPT's description adds only its untied head to the root.
using NamedShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

NamedShapes described_params(const fsdp::PlanUnit& unit) {
  NamedShapes out;
  for (const auto& p : unit.params) out.emplace_back(p.name, p.shape);
  return out;
}

// The built model's parameters (blocks: those under "h."; the root: the rest) and the
// description's (its units', in order; its root's), each in order.
struct BuiltAndDescribed {
  NamedShapes blocks, root, described_blocks, described_root;
};

BuiltAndDescribed built_and_described(const gpt::GPTConfig& config) {
  BuiltAndDescribed out;
  gpt::GPT model(config);
  for (const auto& item : model->named_parameters()) {
    const bool in_block = item.key().rfind("h.", 0) == 0;
    (in_block ? out.blocks : out.root).emplace_back(item.key(), item.value().sizes().vec());
  }
  const fsdp::PlanModel described = gpt::describe_gpt(config, at::kFloat, 0);
  for (const fsdp::PlanUnit& unit : described.units) {
    for (auto& p : described_params(unit)) out.described_blocks.push_back(p);
  }
  out.described_root = described_params(described.root);
  return out;
}

TEST(Planner, DescribedGptParametersAreTheBuiltModelsInOrder) {
  gpt::GPTConfig wide_context = gpt::GPTConfig::sized(3, 24, 3, 16);
  wide_context.vocab_size = 300;
  wide_context.positions = 40;
  for (const gpt::GPTConfig& config : {gpt::GPTConfig::sized(2, 32, 2, 8), wide_context}) {
    auto [blocks, root, described_blocks, described_root] = built_and_described(config);
    EXPECT_EQ(described_blocks, blocks);
    EXPECT_EQ(described_root, root);
    const fsdp::PlanModel described = gpt::describe_gpt(config, at::kFloat, 0);

    const fsdp::PlanModel min_gpt = gpt::describe_gpt(config, at::kFloat, 0, gpt::GptCode::MinGpt);
    root.push_back({"lm_head.weight", {config.vocab_size, config.dim}});
    EXPECT_EQ(described_params(min_gpt.root), root);
    ASSERT_EQ(min_gpt.units.size(), described.units.size());
    for (size_t i = 0; i < described.units.size(); ++i) {
      EXPECT_EQ(described_params(min_gpt.units[i]), described_params(described.units[i]));
    }
  }
}

// A Llama's too (tied and untied heads, grouped-query attention): no wpe, lm_head in the root
// when untied.
TEST(Planner, DescribedLlamaParametersAreTheBuiltModelsInOrder) {
  for (const bool tied : {false, true}) {
    gpt::GPTConfig config = gpt::GPTConfig::sized(2, 32, 4, 8, "llama");
    config.kv_heads = 2;
    config.ffn_dim = 40;
    config.tied_head = tied;
    const BuiltAndDescribed b = built_and_described(config);
    EXPECT_EQ(b.described_blocks, b.blocks) << "tied " << tied;
    EXPECT_EQ(b.described_root, b.root) << "tied " << tied;
    EXPECT_EQ(b.root.size(), tied ? 2u : 3u);  // wte, ln_f (, lm_head)
  }
}

// The analytic activation counts (gpt2/gpt2_plan.cpp's [Note: GPT activations] and
// llama/llama_plan.cpp's [Note: Llama activations]) against a measurement of one block on one sequence: what forward leaves for
// backward and the block's output, exact in fp32, within 5% in bf16.
gpt::GPTConfig llama_block_config() {
  gpt::GPTConfig config = gpt::GPTConfig::sized(1, 128, 4, 64, "llama");
  config.kv_heads = 2;
  config.ffn_dim = 344;
  return config;
}

TEST(Planner, AnalyticBlockActivationsMatchAMeasuredBlock) {
  fsdp::install_memory_counter();
  for (const gpt::GPTConfig& config : {gpt::GPTConfig::sized(1, 128, 4, 64), llama_block_config()}) {
   for (auto dtype : {at::kFloat, at::kBFloat16}) {
    gpt::Block block(config);
    block->to(dtype);
    const at::Tensor x = at::randn({1, config.max_seq, config.dim}).to(dtype);
    const fsdp::PlanActivations measured =
        fsdp::measure_activations([&](const at::Tensor& in) { return block(in); }, x);
    const fsdp::PlanActivations counted = gpt::describe_gpt(config, dtype, 0).units.at(0).activations;
    std::printf("%s %s: saved %lld measured / %lld counted; backward transient %lld / %lld\n",
                gpt::family_of(config).plan_kind().c_str(), c10::toString(dtype), (long long)measured.saved,
                (long long)counted.saved,
                (long long)measured.backward_transient, (long long)counted.backward_transient);
    const std::string what = gpt::family_of(config).plan_kind() + " " + c10::toString(dtype);
    if (dtype == at::kFloat) {
      EXPECT_EQ(measured.saved, counted.saved) << what;  // exact in fp32
    } else {
      EXPECT_NEAR(static_cast<double>(measured.saved) / counted.saved, 1.0, 0.05) << what;
    }
    EXPECT_EQ(measured.checkpointed, counted.checkpointed) << what;
   }
  }
}

}  // namespace

namespace {

// A description written as JSON and read back plans the same run; a malformed one is named.
TEST(Planner, ModelDescriptionsRoundTripThroughJsonAndBadOnesAreNamed) {
  fsdp::PlanSetup s = small_setup();
  const fsdp::Plan direct = fsdp::plan(s);
  const nlohmann::json json = fsdp::plan_model_json(s.model);
  s.model = fsdp::plan_model_from_json(nlohmann::json::parse(json.dump()));
  const fsdp::Plan read_back = fsdp::plan(s);
  EXPECT_EQ(read_back.peak_bytes, direct.peak_bytes);
  EXPECT_EQ(read_back.traffic.all_gather, direct.traffic.all_gather);
  EXPECT_EQ(read_back.setup.model.numel(), direct.setup.model.numel());
  auto message = [](const nlohmann::json& j) {
    try {
      fsdp::plan_model_from_json(j);
    } catch (const c10::Error& e) {
      return e.msg();
    }
    return std::string("no error");
  };
  nlohmann::json bad = json;
  bad.erase("sequence_tokens");
  EXPECT_NE(message(bad).find("has no \"sequence_tokens\""), std::string::npos) << message(bad);
  bad = json;
  bad["units"][1]["params"][0]["shape"] = {128, -1};
  EXPECT_NE(message(bad).find("units[1].params[0].shape[1] is -1, not a whole number"), std::string::npos)
      << message(bad);
  bad = json;
  bad["units"][0]["activations"]["saved"] = "lots";
  EXPECT_NE(message(bad).find("units[0].activations.saved is \"lots\", not a whole number"), std::string::npos)
      << message(bad);
}

}  // namespace

namespace {

// CPU offload: the model states leave the device's peak for host memory, and the step pays the
// host link and the host's AdamW; the search takes offload only when nothing else fits, and not
// at all where the host's bandwidths are unknown.
TEST(Planner, OffloadMovesModelStatesToTheHostAndCostsTime) {
  fsdp::PlanSetup s = small_setup();
  s.policy.fsdp.device(c10::Device(c10::kCUDA, 0));
  s.device.host_memory_bandwidth = 30e9;
  s.device.host_link_bandwidth = 24e9;
  s.device.host_memory_bytes = 64 * kGiB;
  const fsdp::Plan on_device = fsdp::plan(s);
  s.policy.fsdp.cpu_offload(true);
  const fsdp::Plan offloaded = fsdp::plan(s);
  for (size_t r = 0; r < on_device.ranks.size(); ++r) {
    EXPECT_EQ(offloaded.ranks[r].offloaded_bytes, on_device.ranks[r].model_states);
    EXPECT_EQ(offloaded.ranks[r].peak.sharded_params + offloaded.ranks[r].peak.sharded_grads +
                  offloaded.ranks[r].peak.optimizer_state, 0);
  }
  EXPECT_LT(offloaded.peak_bytes, on_device.peak_bytes);
  EXPECT_GT(offloaded.time.step, on_device.time.step);
  EXPECT_GT(offloaded.time.communication, on_device.time.communication);

  s.policy.fsdp.cpu_offload(false);
  fsdp::SearchSpace space;
  space.strategies = {fsdp::ShardingStrategy::FullShard};
  space.activation_checkpointing = {false};
  space.cpu_offload = {false, true};
  const auto roomy = fsdp::search_plans(s, space, 1e15);
  ASSERT_EQ(roomy.fitting.size(), 2u);
  EXPECT_FALSE(roomy.best()->setup.policy.fsdp.cpu_offload()) << "offload is slower: not first when both fit";
  const auto tight = fsdp::search_plans(s, space, (offloaded.peak_bytes + on_device.peak_bytes) / 2.0);
  ASSERT_NE(tight.best(), nullptr);
  EXPECT_TRUE(tight.best()->setup.policy.fsdp.cpu_offload()) << "only offload fits";
  s.device.host_memory_bytes = static_cast<double>(offloaded.ranks.front().offloaded_bytes) / 2;
  const auto no_room = fsdp::search_plans(s, space, 1e15);
  ASSERT_EQ(no_room.rejected.size(), 1u);
  EXPECT_NE(no_room.rejected.front().second.find("> host memory"), std::string::npos) << no_room.rejected.front().second;
  s.device.host_memory_bytes = 64 * kGiB;
  s.device.host_link_bandwidth = 0;
  EXPECT_EQ(fsdp::search_plans(s, space, 1e15).fitting.size(), 1u) << "offload's time unknown: not searched";
}

}  // namespace
