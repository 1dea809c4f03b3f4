// The GPT example on its own (examples/gpt): data determinism, the model's names and
// initialisation, the finiteness check.
#include "data.h"
#include "gpt.h"
#include "gpt2/gpt2.h"
#include "step.h"
#include "step_summary.h"
#include "trainer.h"

#include <gtest/gtest.h>

#include "error_of.h"

#include <cmath>

namespace {

using fsdp_test::error_of;

TEST(Data, GlobalBatchDoesNotDependOnHowItIsSplit) {
  const auto corpus = gpt::ByteCorpus::load(FSDP_TEST_CORPUS_DIR, 1 << 20, 34);
  auto [all_x, all_y] = corpus.batch(7, 3, 0, 6, 32);
  auto [first_x, first_y] = corpus.batch(7, 3, 0, 2, 32);
  auto [rest_x, rest_y] = corpus.batch(7, 3, 2, 4, 32);
  EXPECT_TRUE(torch::equal(all_x, torch::cat({first_x, rest_x})));
  EXPECT_TRUE(torch::equal(all_y.narrow(1, 0, 31), all_x.narrow(1, 1, 31)));  // next-byte targets
  auto [other_x, other_y] = corpus.batch(7, 4, 0, 6, 32);
  EXPECT_FALSE(torch::equal(all_x, other_x));  // another step, other rows
}

TEST(Data, MissingOrTinyDataIsAClearError) {
  std::string message = error_of([] { gpt::ByteCorpus::load("/no/such/path", 1 << 20, 34); });
  EXPECT_NE(message.find("/no/such/path"), std::string::npos) << message;
  message = error_of([] { gpt::ByteCorpus::load(FSDP_TEST_CORPUS_DIR, 10, 34); });
  EXPECT_NE(message.find("fewer than"), std::string::npos) << message;
}

TEST(Gpt, HasGpt2ParameterNamesAndInitialisation) {
  auto model = gpt::make_gpt(gpt::GPTConfig::sized(/*layers=*/2, /*dim=*/32, /*heads=*/4, /*max_seq=*/16), 1);
  auto params = model->named_parameters();
  for (const char* name : {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight",
                           "h.0.attn.c_attn.bias", "h.1.attn.c_proj.weight", "h.1.ln_2.bias",
                           "h.1.mlp.c_fc.weight", "h.1.mlp.c_proj.weight", "ln_f.weight"}) {
    EXPECT_NE(params.find(name), nullptr) << name;
  }
  EXPECT_EQ(params["h.0.attn.c_attn.weight"].sizes(), torch::IntArrayRef({96, 32}));
  EXPECT_EQ(params["h.0.mlp.c_fc.weight"].sizes(), torch::IntArrayRef({128, 32}));
  EXPECT_NEAR(params["wte.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(params["h.0.mlp.c_proj.weight"].std().item<double>(), 0.02 / 2.0, 0.0015);
  EXPECT_EQ(params["h.0.attn.c_attn.bias"].abs().sum().item<double>(), 0.0);
  auto logits = model(torch::zeros({2, 16}, torch::kLong));
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({2, 16, 256}));
  // Causal: the first position's logits ignore later tokens.
  auto changed = torch::zeros({2, 16}, torch::kLong);
  changed.index_put_({torch::indexing::Slice(), 5}, 7);
  EXPECT_TRUE(torch::allclose(model(changed).select(1, 0), logits.select(1, 0)));
}

// A Llama in the GPT's slots: RMSNorm weights (no biases), q/k/v/o projections with fewer key/value
// heads, SwiGLU, an untied lm_head (none when tied), no wpe; causal.
TEST(Llama, HasTheConfiguredLayersAndAnUntiedOrTiedHead) {
  gpt::GPTConfig config = gpt::GPTConfig::sized(2, 32, 4, 16, "llama");
  config.kv_heads = 2;
  config.ffn_dim = 48;
  auto model = gpt::make_gpt(config, 1);
  auto params = model->named_parameters();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"wte.weight", {256, 32}},          {"h.0.ln_1.weight", {32}},
      {"h.0.attn.q_proj.weight", {32, 32}}, {"h.0.attn.k_proj.weight", {16, 32}},
      {"h.0.attn.v_proj.weight", {16, 32}}, {"h.0.attn.o_proj.weight", {32, 32}},
      {"h.0.ln_2.weight", {32}},          {"h.0.mlp.gate_proj.weight", {48, 32}},
      {"h.0.mlp.up_proj.weight", {48, 32}}, {"h.0.mlp.down_proj.weight", {32, 48}},
      {"ln_f.weight", {32}},              {"lm_head.weight", {256, 32}}};
  for (const auto& [name, shape] : expected) {
    ASSERT_NE(params.find(name), nullptr) << name;
    EXPECT_EQ(params[name].sizes(), torch::IntArrayRef(shape)) << name;
  }
  EXPECT_EQ(params.size(), 2 + 2 * 9 + 1u);  // wte, ln_f, lm_head and nine per block: no biases
  EXPECT_EQ(params.find("wpe.weight"), nullptr);
  EXPECT_TRUE(torch::equal(params["h.1.ln_2.weight"], torch::ones({32})));
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  auto logits = model(x);
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({2, 16, 256}));
  auto changed = x.clone();
  changed.index_put_({torch::indexing::Slice(), 5}, (x.select(1, 5) + 1) % 256);
  EXPECT_TRUE(torch::allclose(model(changed).narrow(1, 0, 5), logits.narrow(1, 0, 5)));
  EXPECT_FALSE(torch::allclose(model(changed).narrow(1, 5, 1), logits.narrow(1, 5, 1)));

  config.tied_head = true;
  auto tied = gpt::make_gpt(config, 1);
  EXPECT_EQ(tied->named_parameters().find("lm_head.weight"), nullptr);
  EXPECT_EQ(tied->named_parameters().size(), 2 + 2 * 9u);
}

gpt::GPTConfig two_block_config() { return gpt::GPTConfig::sized(2, 32, 4, 16); }

// make_gpt draws each parameter from its own stream ([Note: GPT init]): the model is a function
// of (config, seed) alone, whatever the thread count, and same-shaped parameters differ.
TEST(Gpt, InitialisationDependsOnTheSeedNotOnTheThreads) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto serial = gpt::make_gpt(two_block_config(), 7)->named_parameters();
  at::set_num_threads(4);
  auto parallel = gpt::make_gpt(two_block_config(), 7)->named_parameters();
  at::set_num_threads(threads);
  auto other_seed = gpt::make_gpt(two_block_config(), 8)->named_parameters();
  for (const auto& item : serial) {
    EXPECT_TRUE(torch::equal(item.value(), parallel[item.key()])) << item.key();
    EXPECT_LT(item.value().abs().max().item<double>(), 1.01) << item.key() << " left uninitialised";
  }
  EXPECT_FALSE(torch::equal(serial["h.0.attn.c_attn.weight"], other_seed["h.0.attn.c_attn.weight"]));
  EXPECT_FALSE(torch::equal(serial["h.0.mlp.c_fc.weight"], serial["h.1.mlp.c_fc.weight"]));
  EXPECT_NE(gpt::parameter_seed(7, "h.0.mlp.c_fc.weight"), gpt::parameter_seed(7, "h.1.mlp.c_fc.weight"));
  EXPECT_NE(gpt::parameter_seed(7, "wte.weight"), gpt::parameter_seed(8, "wte.weight"));
}

TEST(Gpt, AParameterWithANanOrAnInfIsNotFinite) {
  auto model = gpt::make_gpt(two_block_config(), 1);
  EXPECT_TRUE(gpt::parameters_finite(model, nullptr));
  const double bad_values[] = {std::nan(""), INFINITY, -INFINITY};
  for (const double bad : bad_values) {
    auto broken = gpt::make_gpt(two_block_config(), 1);
    torch::NoGradGuard no_grad;
    broken->h[1]->mlp.get<gpt::MLP>()->c_fc->weight.view({-1})[77] = bad;
    EXPECT_FALSE(gpt::parameters_finite(broken, nullptr)) << bad;
  }
}

}  // namespace

// gpt_train's end-of-run summary keeps no record per step: its numbers are exact over a short
// run and, over a long one, come from a bounded sample that still finds the median.
TEST(StepSummary, IsExactOverShortRunsAndSamplesLongOnes) {
  gpt::StepSummary shortrun;
  for (int i = 0; i < 9; ++i) {
    gpt::StepRecord r;
    r.loss = 10 - i;
    r.step_ms = i == 0 ? 1000 : (i * 7) % 9;  // the first step (optimizer state) is left out
    r.memory.peak_bytes = i == 0 ? 1 << 30 : i;
    shortrun.add(r);
  }
  EXPECT_EQ(shortrun.first_loss(), 10);
  EXPECT_EQ(shortrun.last_loss(), 2);
  EXPECT_EQ(shortrun.peak_bytes(), 8);
  EXPECT_EQ(shortrun.median_step_ms(), 5);  // of 7, 5, 3, 1, 8, 6, 4, 2: the upper middle
  gpt::StepSummary longrun;
  for (int i = 0; i < 200000; ++i) {
    gpt::StepRecord r;
    r.step_ms = (i * 7919) % 1000;  // uniform over 0..999, in no order
    longrun.add(r);
  }
  EXPECT_EQ(longrun.steps(), 200000);
  EXPECT_NEAR(longrun.median_step_ms(), 500, 40);
}
