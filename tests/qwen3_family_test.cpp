// The Qwen3 family (examples/gpt/qwen3/): its layers in the GPT's slots, its attention against the
// formula written here op by op (transformers' Qwen3Attention), its tensor-parallel plan, and its
// description to the planner: the built model's parameters in order, the per-head norms'
// activations against a measured block, their gradients' all-reduces under --tp.
#include "gpt.h"
#include "gpt_plan.h"
#include "llama/llama.h"
#include "model_family.h"
#include "plan_counting.h"
#include "qwen3/qwen3.h"
#include "tensor_parallel_plan.h"

#include <fsdp/memory.h>
#include <fsdp/plan.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace {

// 4 heads over 2 key/value heads of 16 channels: head_dim apart from dim / heads (8).
gpt::GPTConfig small_qwen3(int64_t layers = 2, int64_t dim = 32, int64_t seq = 16) {
  gpt::GPTConfig config = gpt::GPTConfig::sized(layers, dim, 4, seq, "qwen3");
  config.kv_heads = 2;
  config.head_dim = 16;
  config.ffn_dim = 48;
  config.norm_eps = 1e-6;
  return config;
}

TEST(Qwen3Family, HasTheLlamasLayersAndANormPerQueryAndKeyHead) {
  const gpt::GPTConfig config = small_qwen3();
  auto model = gpt::make_gpt(config, 1);
  auto params = model->named_parameters();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> block = {
      {"ln_1.weight", {32}},          {"attn.q_proj.weight", {64, 32}},   {"attn.k_proj.weight", {32, 32}},
      {"attn.v_proj.weight", {32, 32}}, {"attn.o_proj.weight", {32, 64}}, {"attn.ln_q.weight", {16}},
      {"attn.ln_k.weight", {16}},     {"ln_2.weight", {32}},              {"mlp.gate_proj.weight", {48, 32}},
      {"mlp.up_proj.weight", {48, 32}}, {"mlp.down_proj.weight", {32, 48}}};
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  std::vector<std::string> expected = {"wte.weight"};
  for (const char* h : {"h.0.", "h.1."}) {
    for (const auto& [name, shape] : block) {
      expected.push_back(h + name);
      EXPECT_EQ(params[h + name].sizes(), torch::IntArrayRef(shape)) << h << name;
    }
  }
  expected.insert(expected.end(), {"ln_f.weight", "lm_head.weight"});
  EXPECT_EQ(names, expected);  // transformers' order: q, k, v, o, q_norm, k_norm
  // Norms: ones at the start and out of weight decay, as the recipe treats every ln_*.
  EXPECT_TRUE(torch::equal(params["h.1.attn.ln_k.weight"], torch::ones({16})));
  auto optimizer = gpt::make_optimizer(model, 1e-3, 0.1);
  const auto& no_decay = optimizer->param_groups().at(1).params();
  for (const char* norm : {"h.0.attn.ln_q.weight", "h.0.attn.ln_k.weight"}) {
    const bool found = std::any_of(no_decay.begin(), no_decay.end(),
                                   [&](const at::Tensor& p) { return p.is_same(params[norm]); });
    EXPECT_TRUE(found) << norm << " is weight-decayed";
  }
  gpt::GPTConfig tied = config;
  tied.tied_head = true;
  EXPECT_EQ(gpt::make_gpt(tied, 1)->named_parameters().find("lm_head.weight"), nullptr);
}

// transformers' Qwen3Attention op by op: q and k normed per head (weight · x / sqrt(mean(x²) +
// eps) over head_dim), then rotated, attended with each key/value head shared by a group of query
// heads, through o_proj.
at::Tensor attention_by_formula(gpt::Qwen3AttentionImpl& a, const gpt::GPTConfig& config, const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), d = config.head_size();
  const auto norm = [&](const at::Tensor& t, const at::Tensor& w) {
    return w * (t * torch::rsqrt(t.pow(2).mean(-1, true) + config.norm_eps));
  };
  const auto angles = torch::outer(torch::arange(T).to(torch::kFloat), gpt::rope_inverse_frequencies(config));
  const at::Tensor cos = torch::cat({angles, angles}, -1).cos(), sin = torch::cat({angles, angles}, -1).sin();
  const auto rotate = [&](const at::Tensor& t) {
    const at::Tensor halves = torch::cat({-t.narrow(-1, d / 2, d / 2), t.narrow(-1, 0, d / 2)}, -1);
    return t * cos + halves * sin;
  };
  const auto heads = [&](const at::Tensor& t) { return t.view({B, T, -1, d}); };
  const at::Tensor q = rotate(norm(heads(a.q_proj->forward(x)), a.ln_q->weight).transpose(1, 2));
  const int64_t group = config.heads / config.key_value_heads();
  const at::Tensor k = rotate(norm(heads(a.k_proj->forward(x)), a.ln_k->weight).transpose(1, 2))
                           .repeat_interleave(group, 1);
  const at::Tensor v = heads(a.v_proj->forward(x)).transpose(1, 2).repeat_interleave(group, 1);
  const at::Tensor scores = torch::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(d));
  const at::Tensor causal = torch::ones({T, T}, torch::kBool).triu(1);
  const at::Tensor y = torch::matmul(torch::softmax(scores.masked_fill(causal, -INFINITY), -1), v);
  return a.o_proj->forward(y.transpose(1, 2).reshape({B, T, -1}));
}

TEST(Qwen3Family, AttentionNormsEachHeadBeforeTheRotation) {
  gpt::GPTConfig config = small_qwen3();
  config.rope_theta = 1e6;
  torch::manual_seed(3);
  gpt::Qwen3Attention attention(config);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : attention->parameters()) p.copy_(p.dim() == 1 ? torch::rand_like(p) + 0.5 : torch::randn_like(p) * 0.2);
  }
  const at::Tensor x = torch::randn({2, config.max_seq, config.dim});
  const at::Tensor ours = attention(x), want = attention_by_formula(*attention, config, x);
  EXPECT_TRUE(torch::allclose(ours, want, 1e-5, 1e-5)) << (ours - want).abs().max().item<double>();
  // A Llama's attention with the same projections is another function: the norms count.
  gpt::LlamaAttention llama(config);
  {
    torch::NoGradGuard no_grad;
    for (const char* name : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      llama->named_parameters()[std::string(name) + ".weight"].copy_(
          attention->named_parameters()[std::string(name) + ".weight"]);
    }
  }
  EXPECT_FALSE(torch::allclose(llama(x), ours, 1e-3, 1e-3));
}

// torchtitan's Qwen3 plan: q/k/v and gate/up column-wise, o/down row-wise, q_norm and k_norm
// (ln_q, ln_k) replicated with their gradients summed (SequenceParallel's parameters).
TEST(Qwen3Family, TensorParallelPlanReplicatesThePerHeadNorms) {
  std::map<std::string, std::string> styles;
  for (const auto& [path, style] : gpt::tensor_parallel_plan(small_qwen3())) {
    styles[path] = std::visit([](const auto& s) -> std::string {
      using S = std::decay_t<decltype(s)>;
      if constexpr (std::is_same_v<S, fsdp::tp::ColwiseParallel>) return "colwise";
      if constexpr (std::is_same_v<S, fsdp::tp::RowwiseParallel>) return "rowwise";
      if constexpr (std::is_same_v<S, fsdp::tp::SequenceParallel>) return "replicated, gradient summed";
      return "prepared input";
    }, style);
  }
  const std::map<std::string, std::string> block = {
      {"h.*.ln_1", "replicated, gradient summed"}, {"h.*.attn", "prepared input"},
      {"h.*.attn.q_proj", "colwise"}, {"h.*.attn.k_proj", "colwise"}, {"h.*.attn.v_proj", "colwise"},
      {"h.*.attn.ln_q", "replicated, gradient summed"}, {"h.*.attn.ln_k", "replicated, gradient summed"},
      {"h.*.attn.o_proj", "rowwise"}, {"h.*.ln_2", "replicated, gradient summed"}, {"h.*.mlp", "prepared input"},
      {"h.*.mlp.gate_proj", "colwise"}, {"h.*.mlp.up_proj", "colwise"}, {"h.*.mlp.down_proj", "rowwise"}};
  for (const auto& [path, style] : block) EXPECT_EQ(styles[path], style) << path;
}

using Qwen3NamedShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// The planner's parameters are the built model's, in order (the blocks' under "h.N.", the root's).
TEST(Qwen3Family, PlannedParametersAreTheBuiltModelsInOrder) {
  for (const bool tied : {false, true}) {
    gpt::GPTConfig config = small_qwen3();
    config.tied_head = tied;
    Qwen3NamedShapes blocks, root, described_blocks, described_root;
    for (const auto& item : gpt::GPT(config)->named_parameters()) {
      const bool in_block = item.key().rfind("h.", 0) == 0;
      (in_block ? blocks : root).emplace_back(item.key(), item.value().sizes().vec());
    }
    const fsdp::PlanModel plan = gpt::describe_gpt(config, at::kFloat, 0);
    for (const auto& p : plan.root.params) described_root.emplace_back(p.name, p.shape);
    for (const auto& unit : plan.units) {
      for (const auto& p : unit.params) described_blocks.emplace_back(p.name, p.shape);
    }
    EXPECT_EQ(described_blocks, blocks) << "tied " << tied;
    EXPECT_EQ(described_root, root) << "tied " << tied;
    EXPECT_EQ(plan.units.at(0).params.size(), 11u);
  }
}

// [Note: Qwen3 activations] against a measured block on one sequence: exact in fp32, within 5% in
// bf16 (as the Llama's, tests/plan_test.cpp).
TEST(Qwen3Family, PlannedBlockActivationsMatchAMeasuredBlock) {
  fsdp::install_memory_counter();
  gpt::GPTConfig config = small_qwen3(1, 128, 64);
  config.head_dim = 64;  // 4 heads of 64 at width 128
  config.ffn_dim = 344;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    gpt::Block block(config);
    block->to(dtype);
    const at::Tensor x = at::randn({1, config.max_seq, config.dim}).to(dtype);
    const fsdp::PlanActivations measured =
        fsdp::measure_activations([&](const at::Tensor& in) { return block(in); }, x);
    const fsdp::PlanActivations counted = gpt::describe_gpt(config, dtype, 0).units.at(0).activations;
    const std::string what = c10::toString(dtype);
    std::printf("Qwen3 %s: saved %lld measured / %lld counted\n", what.c_str(), static_cast<long long>(measured.saved),
                static_cast<long long>(counted.saved));
    if (dtype == at::kFloat) {
      EXPECT_EQ(measured.saved, counted.saved) << what;
    } else {
      EXPECT_NEAR(static_cast<double>(measured.saved) / counted.saved, 1.0, 0.05) << what;
    }
    EXPECT_EQ(measured.checkpointed, counted.checkpointed) << what;
  }
}

// Under --tp 2 each rank holds half the heads of q/k/v and the norms whole, and sums the norms'
// gradients (head_dim elements each) over the tp ranks, as the Llama's ln_1 and ln_2.
TEST(Qwen3Family, PlannedTensorParallelismSumsThePerHeadNormsGradients) {
  const gpt::GPTConfig config = small_qwen3();
  const fsdp::PlanUnit unit = gpt::describe_gpt(config, at::kFloat, 0, gpt::GptCode::ThisProject, 2).units.at(0);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : unit.params) shapes[p.name] = p.shape;
  EXPECT_EQ(shapes["h.0.attn.q_proj.weight"], (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(shapes["h.0.attn.ln_q.weight"], (std::vector<int64_t>{16}));
  std::map<std::string, int64_t> summed;
  for (const auto& c : unit.tp_collectives) {
    if (!c.parameter.empty()) summed[c.parameter] = c.bytes;
  }
  const int64_t norm = gpt::tp_all_reduce_bytes(16, 4, 2), width = gpt::tp_all_reduce_bytes(32, 4, 2);
  EXPECT_EQ(summed, (std::map<std::string, int64_t>{{"h.0.ln_1.weight", width}, {"h.0.ln_2.weight", width},
                                                     {"h.0.attn.ln_q.weight", norm},
                                                     {"h.0.attn.ln_k.weight", norm}}));
  // The activations the norms add are this rank's heads': half of tp 1's addition.
  gpt::GPTConfig llama = config;
  llama.family = "llama";
  const auto added = [&](int64_t tp) {
    return gpt::describe_gpt(config, at::kFloat, 0, gpt::GptCode::ThisProject, tp).units.at(0).activations.saved -
           gpt::describe_gpt(llama, at::kFloat, 0, gpt::GptCode::ThisProject, tp).units.at(0).activations.saved;
  };
  EXPECT_EQ(added(1), 16 * (4 + 2) * (16 * 4 + 4));  // T (heads + kv heads) (d·e + 4)
  EXPECT_EQ(added(2), added(1) / 2);
}

}  // namespace
