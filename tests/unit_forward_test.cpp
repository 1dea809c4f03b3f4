// The natural call is safe: `unit->forward(x)`, as every public LibTorch program calls its
// submodules, goes through the unit like `unit(x)` ([Note: unit->forward]) instead of running the
// module on its 1-D shard.
#include "dist_env.h"
#include "test_models.h"

#include <gtest/gtest.h>

namespace fsdp_test {
namespace {

// OddNet's forward, each unit called the way public LibTorch programs call submodules.
struct ArrowNetImpl : torch::nn::Module {
  ArrowNetImpl() { net = register_module("net", make_odd_net(3)); }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(net->first_unit->forward(x));
    h = net->shift_call->forward(net->scale_call->forward(h));
    h = torch::tanh(net->second_unit->forward(h));
    return net->head(h) * net->gain;
  }
  OddNet net{nullptr};
};
TORCH_MODULE(ArrowNet);

TEST(UnitForward, ArrowForwardGoesThroughTheUnitLikeCallingIt) {
  const auto [x, y] = odd_batch(0, 4);
  auto called = fsdp::fully_shard(make_odd_net(3), *dist().world);
  const auto expected = called(x);
  auto arrow = fsdp::fully_shard(ArrowNet(), *dist().world);
  const auto output = arrow->forward(x);  // the root too
  EXPECT_TRUE(torch::equal(output, expected));
  (output - y).pow(2).mean().backward();  // and backward reduces the gradients as after unit(x)
  for (const auto& p : arrow->parameters()) ASSERT_TRUE(p.grad().defined());
}

}  // namespace
}  // namespace fsdp_test
