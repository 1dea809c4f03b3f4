// Two more public-style LibTorch programs, ported the way README says, train at every W as their
// unsharded program of W ranks does, simulated in one process by the test (W replicas of the plain
// model, replica r fed rank r's batch with rank r's own generator, the gradients summed in rank
// order and divided by W, LibTorch's own clip_grad_norm_ and optimizer on the master copy):
//  - a VAE: a unit whose forward returns a struct, the root returning a struct, noise drawn in
//    forward (randn_like) on each rank's own generator, `decode` run from main;
//  - a PPO agent: a plain Module kept in a shared_ptr, a method other than forward returning a
//    struct, clipping over agent->parameters(), a logging forward between backward and step, and
//    torch::save / torch::load of the whole agent in the middle of training.
// Tolerances: losses 1e-5 relative; each parameter ||x - x_ref|| <= 1e-3 ||x_ref - x_0|| (what
// training moved it; a gradient divided by the wrong count, a rank's noise shared, a root step
// skipped or a clip by one rank's norm moves it by a whole update).
#include "dist_env.h"
#include "generator_state.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>

namespace fsdp_test::users_programs_test {
namespace {

namespace nn = torch::nn;
namespace fs = std::filesystem;
using Tensors = std::map<std::string, torch::Tensor>;

constexpr int kSteps = 6;
constexpr uint64_t kModelSeed = 7;

/// README's recipe: every rank builds the model from one seed, then draws on its own.
uint64_t noise_seed(int rank) { return 1000 + rank; }

Tensors named_params(const nn::Module& net) {
  Tensors out;
  for (const auto& item : net.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}
Tensors named(const fsdp::NamedTensors& items) {
  Tensors out;
  for (const auto& [name, t] : items) out[name] = t.detach().clone();
  return out;
}

void expect_trained_alike(const Tensors& got, const Tensors& want, const Tensors& initial) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const double moved = (w - initial.at(name)).norm().item<double>();
    const double off = (got.at(name) - w).norm().item<double>();
    EXPECT_LE(off, 1e-3 * moved + 1e-9) << name << ": moved " << moved << " by training, off by " << off;
    worst = std::max(worst, off / (moved + 1e-30));
  }
  std::printf("W=%d parameters: worst ||x - x_ref|| / ||x_ref - x_0|| = %.2e\n", dist().world_size(), worst);
}

void expect_losses_alike(double got, double want, int step) {
  EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << "step " << step;
}

/// The rank-r batch of step s: inputs drawn from a generator of their own (every rank and the
/// reference draw the same ones).
torch::Tensor batch(int s, int r, at::IntArrayRef shape) {
  auto gen = at::detail::createCPUGenerator(100 * s + r + 1);
  return torch::rand(shape, gen);
}

/// The mean over ranks of each replica's loss, as the W-rank program's rank-0 loss is its own.
template <class Net>
void average_grads(Net& master, std::vector<Net>& replicas) {
  torch::NoGradGuard no_grad;
  for (auto& item : master->named_parameters()) {
    torch::Tensor sum = torch::zeros_like(item.value());
    for (auto& net : replicas) {
      const torch::Tensor grad = net->named_parameters()[item.key()].grad();
      if (grad.defined()) sum += grad;
    }
    item.value().mutable_grad() = sum / static_cast<double>(replicas.size());
  }
}
template <class Net>
void send_params(Net& master, std::vector<Net>& replicas) {
  torch::NoGradGuard no_grad;
  auto from = master->named_parameters();
  for (auto& net : replicas) {
    for (auto& item : net->named_parameters()) item.value().copy_(from[item.key()]);
  }
}

// ---- a VAE ------------------------------------------------------------------------------------

struct Encoding {  // a unit's output: a plain struct of tensors, found without a declaration
  torch::Tensor mu, log_var;
};

struct EncoderImpl : nn::Module {
  EncoderImpl() {
    hidden = register_module("hidden", nn::Linear(20, 16));
    mu = register_module("mu", nn::Linear(16, 4));
    log_var = register_module("log_var", nn::Linear(16, 4));
  }
  Encoding forward(const torch::Tensor& x) {
    auto h = torch::relu(hidden->forward(x));
    return {mu->forward(h), log_var->forward(h)};
  }
  nn::Linear hidden{nullptr}, mu{nullptr}, log_var{nullptr};
};
TORCH_MODULE(Encoder);

struct VAEOutput {
  torch::Tensor reconstruction, mu, log_var;
};

struct VAEImpl : nn::Module {
  VAEImpl() {
    encoder = register_module("encoder", fsdp::Unit<Encoder>(Encoder()));
    fc4 = register_module("fc4", nn::Linear(4, 16));  // the decoder: the root's own parameters
    fc5 = register_module("fc5", nn::Linear(16, 20));
  }
  torch::Tensor reparameterize(const torch::Tensor& mu, const torch::Tensor& log_var) {
    if (!is_training()) return mu;
    auto std = torch::exp(log_var / 2);
    return mu + torch::randn_like(std) * std;
  }
  torch::Tensor decode(const torch::Tensor& z) { return torch::sigmoid(fc5->forward(torch::relu(fc4->forward(z)))); }
  VAEOutput forward(const torch::Tensor& x) {
    auto encoding = encoder->forward(x);
    auto z = reparameterize(encoding.mu, encoding.log_var);
    return {decode(z), encoding.mu, encoding.log_var};
  }
  fsdp::Unit<Encoder> encoder{nullptr};
  nn::Linear fc4{nullptr}, fc5{nullptr};
};
TORCH_MODULE(VAE);

VAE make_vae() {
  torch::manual_seed(kModelSeed);
  return VAE();
}

torch::Tensor vae_loss(const VAEOutput& out, const torch::Tensor& x) {
  auto reconstruction = torch::binary_cross_entropy(out.reconstruction, x, {}, torch::Reduction::Sum);
  auto kl = -0.5 * torch::sum(1 + out.log_var - out.mu.pow(2) - out.log_var.exp());
  return (reconstruction + kl) / x.size(0);
}

torch::optim::AdamOptions vae_adam() { return torch::optim::AdamOptions(1e-2); }

TEST(UsersPrograms, AVaeWithStructOutputsAndNoiseInForwardTrainsAsItsUnshardedProgram) {
  const int world = dist().world_size(), rank = dist().rank();
  // The W-rank reference in this process.
  VAE master = make_vae();
  const Tensors initial = named_params(*master);
  std::vector<VAE> replicas;
  std::vector<torch::Tensor> rng;
  for (int r = 0; r < world; ++r) {
    replicas.push_back(make_vae());
    torch::manual_seed(noise_seed(r));
    rng.push_back(generator_state());
  }
  torch::optim::Adam reference_optimizer(master->parameters(), vae_adam());
  std::vector<double> reference_losses;
  for (int s = 0; s < kSteps; ++s) {
    send_params(master, replicas);
    for (int r = 0; r < world; ++r) {
      set_generator_state(rng[r]);
      replicas[r]->zero_grad();
      auto x = batch(s, r, {8, 20});
      auto loss = vae_loss(replicas[r]->forward(x), x);
      loss.backward();
      if (r == rank) reference_losses.push_back(loss.item<double>());
      rng[r] = generator_state();
    }
    average_grads(master, replicas);
    reference_optimizer.step();
  }

  // The port: the program as it is, sharded.
  auto model = fsdp::fully_shard(make_vae(), *dist().world);
  torch::manual_seed(noise_seed(rank));  // README: each rank its own noise from here on
  torch::optim::Adam optimizer(model->parameters(), vae_adam());
  for (int s = 0; s < kSteps; ++s) {
    optimizer.zero_grad();
    auto x = batch(s, rank, {8, 20});
    auto loss = vae_loss(model->forward(x), x);
    loss.backward();
    optimizer.step();
    expect_losses_alike(loss.item<double>(), reference_losses[s], s);
  }
  expect_trained_alike(named(fsdp::gather_full_params(model)), named_params(*master), initial);

  // Sampling from main: decode runs through the root (it uses the root's own parameters).
  torch::NoGradGuard no_grad;
  auto z = batch(99, 0, {3, 4});
  master->eval();
  model->eval();
  auto sample = model.call(&VAEImpl::decode, z);
  EXPECT_LE((sample - master->decode(z)).abs().max().item<double>(), 1e-5);
  // Reached around the root, decode would compute on the root's 1-D shards: refused by name
  // when it calls a unit, as VAEImpl::forward does ([Note: the root is not skipped]).
  if (world > 1) {
    VAEImpl& around_the_root = *model.module();
    try {
      around_the_root.forward(z.repeat({1, 5}));
      ADD_FAILURE() << "the root's forward ran around its unit";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("model.call(&NetImpl::method"), std::string::npos) << e.what();
    }
  }
}

// ---- a PPO agent ------------------------------------------------------------------------------

struct AgentOutput {  // a class with getters: declared once (FSDP_OUTPUT_TENSORS below)
  AgentOutput(torch::Tensor logits, torch::Tensor value) : logits_(std::move(logits)), value_(std::move(value)) {}
  const torch::Tensor& logits() const { return logits_; }
  const torch::Tensor& value() const { return value_; }

 private:
  torch::Tensor logits_, value_;
};

}  // namespace
}  // namespace fsdp_test::users_programs_test

FSDP_OUTPUT_TENSORS(fsdp_test::users_programs_test::AgentOutput, logits(), value());

namespace fsdp_test::users_programs_test {
namespace {

struct AgentImpl : nn::Module {
  AgentImpl() {
    body = register_module("body", nn::Sequential(nn::Linear(4, 32), nn::Tanh(), nn::Linear(32, 32), nn::Tanh()));
    policy = register_module("policy", nn::Linear(32, 2));
    critic = register_module("critic", nn::Linear(32, 1));
  }
  AgentOutput evaluate(const torch::Tensor& obs) {
    auto h = body->forward(obs);
    return {policy->forward(h), critic->forward(h).squeeze(-1)};
  }
  torch::Tensor forward(const torch::Tensor& obs) { return critic->forward(body->forward(obs)).squeeze(-1); }
  nn::Sequential body{nullptr};
  nn::Linear policy{nullptr}, critic{nullptr};
};

std::shared_ptr<AgentImpl> make_agent() {
  torch::manual_seed(kModelSeed);
  return std::make_shared<AgentImpl>();  // as the program keeps it: a shared_ptr
}

/// The rank's rollout of update s: observations, actions, advantages, returns, old log-probs.
struct Rollout {
  torch::Tensor obs, actions, advantages, returns, old_log_probs;
};
Rollout rollout(int s, int r) {
  auto gen = at::detail::createCPUGenerator(7000 + 100 * s + r);
  Rollout out;
  out.obs = torch::randn({16, 4}, gen);
  out.actions = torch::randint(0, 2, {16}, gen);
  out.advantages = torch::randn({16}, gen);
  out.returns = torch::randn({16}, gen);
  out.old_log_probs = torch::log(torch::full({16}, 0.5));
  return out;
}

torch::Tensor ppo_loss(const AgentOutput& out, const Rollout& batch) {
  auto log_probs = torch::log_softmax(out.logits(), -1);
  auto taken = log_probs.gather(1, batch.actions.unsqueeze(1)).squeeze(1);
  auto ratio = torch::exp(taken - batch.old_log_probs);
  auto clipped = torch::clamp(ratio, 0.8, 1.2);
  auto policy_loss = -torch::min(ratio * batch.advantages, clipped * batch.advantages).mean();
  auto value_loss = (out.value() - batch.returns).pow(2).mean();
  auto entropy = -(log_probs.exp() * log_probs).sum(-1).mean();
  return policy_loss + 0.5 * value_loss - 0.01 * entropy;
}

constexpr double kMaxGradNorm = 0.05;  // small enough that every step clips
torch::optim::AdamOptions ppo_adam() { return torch::optim::AdamOptions(3e-3); }

TEST(UsersPrograms, APpoAgentInASharedPtrTrainsAsItsUnshardedProgramThroughSaveAndLoad) {
  const int world = dist().world_size(), rank = dist().rank();
  auto master = make_agent();
  const Tensors initial = named_params(*master);
  std::vector<std::shared_ptr<AgentImpl>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(make_agent());
  torch::optim::Adam reference_optimizer(master->parameters(), ppo_adam());
  std::vector<double> reference_losses, reference_norms;
  for (int s = 0; s < kSteps; ++s) {
    send_params(master, replicas);
    for (int r = 0; r < world; ++r) {
      replicas[r]->zero_grad();
      const Rollout b = rollout(s, r);
      auto loss = ppo_loss(replicas[r]->evaluate(b.obs), b);
      loss.backward();
      if (r == rank) reference_losses.push_back(loss.item<double>());
    }
    average_grads(master, replicas);
    reference_norms.push_back(torch::nn::utils::clip_grad_norm_(master->parameters(), kMaxGradNorm));
    reference_optimizer.step();
  }

  auto agent = fsdp::fully_shard(make_agent(), *dist().world);
  torch::optim::Adam optimizer(agent->parameters(), ppo_adam());
  const std::string file = (fs::temp_directory_path() / ("fsdp-ppo-" + std::to_string(::getpid()) + ".pt")).string();
  for (int s = 0; s < kSteps; ++s) {
    optimizer.zero_grad();
    const Rollout b = rollout(s, rank);
    auto loss = ppo_loss(agent.call(&AgentImpl::evaluate, b.obs), b);
    loss.backward();
    const double norm = fsdp::clip_grad_norm_(agent->parameters(), kMaxGradNorm);
    EXPECT_NEAR(norm, reference_norms[s], 1e-5 * reference_norms[s]) << "step " << s;
    auto logged_value = agent->forward(b.obs).mean();  // logging, under grad mode, no backward
    (void)logged_value;
    optimizer.step();
    expect_losses_alike(loss.item<double>(), reference_losses[s], s);
    if (s == kSteps / 2) {  // the program saves the agent and resumes from the file
      {
        fsdp::SummonFullParams whole(agent);
        torch::save(agent, file + std::to_string(rank));  // each rank its own file
      }
      torch::load(agent, file + std::to_string(rank));  // rebinds every parameter: taken in
      fs::remove(file + std::to_string(rank));
    }
  }
  expect_trained_alike(named(fsdp::gather_full_params(agent)), named_params(*master), initial);
}

// torch::load of a file that holds a sharded model's own pieces (a torch::save without
// SummonFullParams) cannot be taken in: whose pieces are they? Refused by name at the next forward.
TEST(UsersPrograms, LoadingASavedShardIsRefusedByName) {
  if (dist().world_size() < 2) GTEST_SKIP() << "one rank: the shard is the whole parameter";
  auto agent = fsdp::fully_shard(make_agent(), *dist().world);
  const std::string file = (fs::temp_directory_path() / ("fsdp-ppo-pieces-" + std::to_string(::getpid()) + ".pt")).string();
  torch::save(agent, file);
  torch::load(agent, file);
  fs::remove(file);
  try {
    agent->forward(torch::zeros({1, 4}));
    ADD_FAILURE() << "a forward on parameters loaded from a shard's pieces";
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("parameter 'body.0.weight' was rebound"), std::string::npos) << message;
    EXPECT_NE(message.find("SummonFullParams"), std::string::npos) << message;
  }
}

// A whole parameter pointed elsewhere inside SummonFullParams (torch::load, set_data) is kept at
// the scope's end, as an in-place edit is.
TEST(UsersPrograms, ParametersReboundInsideSummonFullParamsAreKept) {
  auto agent = fsdp::fully_shard(make_agent(), *dist().world);
  torch::Tensor new_weight = torch::full({2, 32}, 0.25);
  {
    fsdp::SummonFullParams whole(agent);
    agent->policy->weight.set_data(new_weight.clone());
  }
  const Tensors full = named(fsdp::gather_full_params(agent));
  EXPECT_TRUE(torch::equal(full.at("policy.weight"), new_weight));
}

}  // namespace
}  // namespace fsdp_test::users_programs_test
