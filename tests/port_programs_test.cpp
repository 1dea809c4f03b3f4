// Public-style LibTorch programs ported to fsdp-cpp (tests/port_programs.h) train as the
// unsharded programs do, resume from a sharded checkpoint at another world size, and (through
// tests/port_programs_e2e.py) give PyTorch a full state dict it loads with strict=True.
//
// The ground truth of programs 1-3 is the unsharded program of W ranks simulated in one process,
// with none of the library's sharding, collectives or state dicts: W replicas of the plain model
// (a Unit is a plain pass-through until fully_shard), replica r fed rank r's batch with rank r's random generator state (its
// dropout masks, noise and smoothed labels), each keeping its own BatchNorm statistics
// (BatchNorm is rank-local, as in PyTorch FSDP), the gradients summed in rank order and divided
// by W by the test, one plain torch::optim optimizer stepping the master parameters. That is the
// sharded program's arithmetic up to the order of the gradient sum and the vectorisation of the
// optimizer's element-wise kernels on a shard instead of a whole tensor (fp32 rounding only).
// Program 4's ground truth is its original multi-rank program, which averages the gradients by
// hand over the c10d group (Gloo's all-reduce, not the library's collectives).
//
// Tolerances (every run prints its maxima; measured at W = 2 and 3 with OMP_NUM_THREADS=1):
//  - losses, step by step and rank by rank: 1e-5 relative (measured <= 2.1e-7). Step 0 runs the
//    same operations on the same values (bitwise equal); later steps start from parameters that
//    differ by rounding, which moves a loss by about as much.
//  - parameters and running statistics: ||x - x_ref|| <= 1e-3 of what training changed,
//    ||x_ref - x_0|| (floor: 1e-3 ||x_ref||); the optimizer's state (momentum, Adam's moments):
//    <= 1e-3 of its norm. Measured <= 1.1e-5 (the DCGAN, whose discriminator gradient is the sum
//    of two backwards: the reference sums them on each rank before averaging, the sharded run
//    reduces each one), 0 to 1e-6 for the others; W = 2 is often bitwise (a + b is
//    commutative). A gradient divided by the wrong count, a rank's contribution lost, a buffer or
//    a momentum not restored moves them by a whole update (a ratio of 0.1 to 1): the bound leaves
//    100x for other kernels' summation orders and sits 100x below those. No model has a
//    bias right before a BatchNorm: its gradient, and so its momentum, would be rounding noise.
//  - num_batches_tracked: exact.
//  - a checkpoint loaded back: bitwise the parameters, buffers and optimizer state saved.
#include "dist_env.h"
#include "generator_state.h"
#include "port_programs.h"

#include <fsdp/checkpoint.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>

namespace fsdp_test::port_programs_test {
namespace {

using namespace ports;
namespace fs = std::filesystem;

using Tensors = std::map<std::string, torch::Tensor>;
using Losses = std::vector<std::vector<double>>;  // [rank][loss] of one step

constexpr int kSteps = 5;
constexpr int kSavedAt = 3;
constexpr double kLossTol = 1e-5;
constexpr double kStateTol = 1e-3;

Tensors named(const fsdp::NamedTensors& items, const std::string& prefix) {
  Tensors out;
  for (const auto& [name, t] : items) out[prefix + name] = t.detach().clone();
  return out;
}
Tensors named(const torch::OrderedDict<std::string, torch::Tensor>& items, const std::string& prefix) {
  Tensors out;
  for (const auto& item : items) out[prefix + item.key()] = item.value().detach().clone();
  return out;
}
void merge(Tensors& into, const Tensors& more) { into.insert(more.begin(), more.end()); }


// ---- The unsharded reference ------------------------------------------------------------------

/// One model of the unsharded program of W ranks: the master parameters and rank r's replica
/// (copies of the master parameters, its own buffers).
template <class Net>
struct Replicas {
  Net master;
  std::vector<Net> ranks;

  Replicas(const std::function<Net()>& make, int world) : master(make()) {
    for (int r = 0; r < world; ++r) ranks.push_back(make());
  }
  void send_params() {
    torch::NoGradGuard no_grad;
    auto from = master->named_parameters();
    for (auto& net : ranks) {
      for (auto& item : net->named_parameters()) item.value().copy_(from[item.key()]);
    }
  }
  /// The master's gradient: the ranks' gradients summed in rank order, divided by W.
  void average_grads() {
    torch::NoGradGuard no_grad;
    for (auto& item : master->named_parameters()) {
      torch::Tensor sum = torch::zeros_like(item.value());
      for (auto& net : ranks) {
        const torch::Tensor grad = net->named_parameters()[item.key()].grad();
        if (grad.defined()) sum += grad;
      }
      item.value().mutable_grad() = sum / static_cast<double>(ranks.size());
    }
  }
  /// From now on the first `world` ranks, each with rank 0's buffers (what a checkpoint holds).
  void shrink(int world) {
    ranks.erase(ranks.begin() + world, ranks.end());
    torch::NoGradGuard no_grad;
    auto from = ranks[0]->named_buffers();
    for (auto& net : ranks) {
      for (auto& item : net->named_buffers()) item.value().copy_(from[item.key()]);
    }
  }
};

/// Each rank's default CPU generator: the reference swaps rank r's state in around rank r's work.
struct RankGenerators {
  std::vector<torch::Tensor> states;
  template <class F>
  void as_rank(int r, F&& work) {
    set_generator_state(states[r]);
    work();
    states[r] = generator_state();
  }
};

/// The state torch::optim keeps for each parameter of `net`, under the names
/// fsdp::gather_full_optimizer_state gives it ("state.NAME.exp_avg", "state.NAME.step"...), read
/// from the optimizer by the test.
Tensors adam_state(torch::optim::Adam& optimizer, nn::Module& net, const std::string& prefix) {
  Tensors out;
  for (const auto& item : net.named_parameters()) {
    auto it = optimizer.state().find(item.value().unsafeGetTensorImpl());
    if (it == optimizer.state().end()) continue;
    auto& state = static_cast<torch::optim::AdamParamState&>(*it->second);
    const std::string key = prefix + "state." + item.key() + ".";
    out[key + "exp_avg"] = state.exp_avg().clone();
    out[key + "exp_avg_sq"] = state.exp_avg_sq().clone();
    out[key + "step"] = torch::tensor(state.step(), torch::kLong);
  }
  return out;
}
Tensors sgd_state(torch::optim::SGD& optimizer, nn::Module& net, const std::string& prefix) {
  Tensors out;
  for (const auto& item : net.named_parameters()) {
    auto it = optimizer.state().find(item.value().unsafeGetTensorImpl());
    if (it == optimizer.state().end()) continue;
    auto& state = static_cast<torch::optim::SGDParamState&>(*it->second);
    out[prefix + "state." + item.key() + ".momentum_buffer"] = state.momentum_buffer().clone();
  }
  return out;
}

// Every reference: Losses step(s); Tensors params(); Tensors buffers(r); Tensors
// optimizer_state(); void shrink(world).
// Each is built as its program builds its models, and then takes the generator state that
// follows as every rank's (the programs seed every rank the same).

// One model and one optimizer (mnist, the LSTM): W replicas, the gradients averaged by the test.
// `Program` names the program's parts: make, options, batch, loss and state (its optimizer's).
template <class Net, class Optimizer, class Program>
struct OneModelReference {
  Replicas<Net> nets;
  Optimizer optimizer;
  RankGenerators rng;
  explicit OneModelReference(int world)
      : nets(Program::make, world),
        optimizer(nets.master->parameters(), Program::options()),
        rng{std::vector<torch::Tensor>(world, generator_state())} {}
  Losses step(int s) {
    nets.send_params();
    Losses losses;
    for (int r = 0; r < static_cast<int>(nets.ranks.size()); ++r) {
      rng.as_rank(r, [&] {
        auto& net = nets.ranks[r];
        auto [input, target] = Program::batch(s, r);
        net->zero_grad();
        auto loss = Program::loss(net->forward(input), target);
        loss.backward();
        losses.push_back({loss.template item<double>()});
      });
    }
    nets.average_grads();
    optimizer.step();
    return losses;
  }
  Tensors params() { return named(nets.master->named_parameters(), ""); }
  Tensors buffers(int r) { return named(nets.ranks[r]->named_buffers(), ""); }
  Tensors optimizer_state() { return Program::state(optimizer, *nets.master, ""); }
  void shrink(int world) {
    nets.shrink(world);
    rng.states.resize(world);
  }
};

struct MnistProgram {
  static MnistNet make() { return make_mnist(); }
  static torch::optim::SGDOptions options() { return mnist_sgd(); }
  static auto batch(int s, int r) { return mnist_batch(s, r); }
  static torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) {
    return torch::nll_loss(output, target);
  }
  static Tensors state(torch::optim::SGD& optimizer, nn::Module& net, const std::string& prefix) {
    return sgd_state(optimizer, net, prefix);
  }
};
using MnistReference = OneModelReference<MnistNet, torch::optim::SGD, MnistProgram>;

struct GanReference {
  Replicas<Generator> generators;
  Replicas<nn::Sequential> discriminators;
  torch::optim::Adam g_optimizer, d_optimizer;
  RankGenerators rng;
  explicit GanReference(int world)
      : generators([] { return make_gan().first; }, world),
        discriminators([] { return make_gan().second; }, world),
        g_optimizer(generators.master->parameters(), gan_adam()),
        d_optimizer(discriminators.master->parameters(), gan_adam()),
        rng{std::vector<torch::Tensor>(world, generator_state())} {}
  Losses step(int s) {
    const int world = static_cast<int>(generators.ranks.size());
    generators.send_params();
    discriminators.send_params();
    std::vector<GanStep> steps(world);
    for (int r = 0; r < world; ++r) {
      rng.as_rank(r, [&] {
        steps[r].discriminator_backward(generators.ranks[r], discriminators.ranks[r], s, r);
      });
    }
    discriminators.average_grads();
    d_optimizer.step();
    discriminators.send_params();  // the generator trains through the stepped discriminator
    for (int r = 0; r < world; ++r) {
      rng.as_rank(r, [&] { steps[r].generator_backward(generators.ranks[r], discriminators.ranks[r]); });
    }
    generators.average_grads();
    g_optimizer.step();
    Losses losses;
    for (const auto& step : steps) losses.push_back({step.d_loss, step.g_loss});
    return losses;
  }
  Tensors params() {
    Tensors out = named(generators.master->named_parameters(), "generator.");
    merge(out, named(discriminators.master->named_parameters(), "discriminator."));
    return out;
  }
  Tensors buffers(int r) {
    Tensors out = named(generators.ranks[r]->named_buffers(), "generator.");
    merge(out, named(discriminators.ranks[r]->named_buffers(), "discriminator."));
    return out;
  }
  Tensors optimizer_state() {
    Tensors out = adam_state(g_optimizer, *generators.master, "generator.");
    merge(out, adam_state(d_optimizer, *discriminators.master, "discriminator."));
    return out;
  }
  void shrink(int world) {
    generators.shrink(world);
    discriminators.shrink(world);
    rng.states.resize(world);
  }
};

struct LstmProgram {
  static LstmNet make() { return make_lstm(); }
  static torch::optim::AdamOptions options() { return lstm_adam(); }
  static auto batch(int s, int r) { return lstm_batch(s, r); }
  static torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) {
    return torch::mse_loss(output, target);
  }
  static Tensors state(torch::optim::Adam& optimizer, nn::Module& net, const std::string& prefix) {
    return adam_state(optimizer, net, prefix);
  }
};
using LstmReference = OneModelReference<LstmNet, torch::optim::Adam, LstmProgram>;

// ---- The sharded programs ---------------------------------------------------------------------

/// One sharded model of a program with its optimizer, its names prefixed for programs of two.
template <class M, class Optimizer>
struct ShardedModel {
  fsdp::Unit<M> model;
  Optimizer optimizer;
  std::string prefix;

  template <class Options>
  ShardedModel(M net, fsdp::ProcessGroup& group, const Options& options, std::string name = "")
      : model(fsdp::fully_shard(std::move(net), group)),
        optimizer(model->parameters(), options),
        prefix(std::move(name)) {}
  Tensors full() { return named(fsdp::gather_full_params(model), prefix); }
  Tensors own_buffers() { return named(model->named_buffers(), prefix); }
  Tensors optimizer_state() {
    return named(fsdp::gather_full_optimizer_state(model, optimizer), prefix);
  }
  void save(const std::string& dir, int step) {
    fsdp::save_checkpoint(model, optimizer, dir + "/" + prefix + "ckpt", step);
  }
  void load(const std::string& dir) {
    fsdp::load_sharded(model, optimizer, fsdp::latest_checkpoint(dir + "/" + prefix + "ckpt"));
  }
};

struct MnistSharded : ShardedModel<MnistNet, torch::optim::SGD> {
  explicit MnistSharded(fsdp::ProcessGroup& group) : ShardedModel(make_mnist(), group, mnist_sgd()) {}
  std::vector<double> step(int s, int rank) {
    const double loss = mnist_step(model, optimizer, s, rank);
    // An evaluation between steps, as mnist's test() but without its NoGradGuard: a forward in
    // eval mode whose graph is never backpropagated changes nothing (no statistics, no draws).
    model->eval();
    auto [data, targets] = mnist_batch(1000 + s, rank);
    EXPECT_TRUE(model->forward(data).requires_grad());
    model->train();
    return {loss};
  }
};

struct LstmSharded : ShardedModel<LstmNet, torch::optim::Adam> {
  explicit LstmSharded(fsdp::ProcessGroup& group) : ShardedModel(make_lstm(), group, lstm_adam()) {}
  std::vector<double> step(int s, int rank) { return {lstm_step(model, optimizer, s, rank)}; }
};

nn::Sequential wrap_convolutions(nn::Sequential discriminator) {
  fsdp::wrap_blocks<nn::Conv2d>(discriminator);  // each convolution a unit, BatchNorm the root's
  return discriminator;
}

/// Both models sharded on the same group.
struct GanSharded {
  ShardedModel<Generator, torch::optim::Adam> g;
  ShardedModel<nn::Sequential, torch::optim::Adam> d;
  explicit GanSharded(fsdp::ProcessGroup& group) : GanSharded(make_gan(), group) {}
  GanSharded(std::pair<Generator, nn::Sequential> gan, fsdp::ProcessGroup& group)
      : g(gan.first, group, gan_adam(), "generator."),
        d(wrap_convolutions(gan.second), group, gan_adam(), "discriminator.") {}
  std::vector<double> step(int s, int rank) {
    return gan_step(g.model, d.model, g.optimizer, d.optimizer, s, rank);
  }
  Tensors full() {
    Tensors out = g.full();
    merge(out, d.full());
    return out;
  }
  Tensors own_buffers() {
    Tensors out = g.own_buffers();
    merge(out, d.own_buffers());
    return out;
  }
  Tensors optimizer_state() {
    Tensors out = g.optimizer_state();
    merge(out, d.optimizer_state());
    return out;
  }
  void save(const std::string& dir, int step) {
    g.save(dir, step);
    d.save(dir, step);
  }
  void load(const std::string& dir) {
    g.load(dir);
    d.load(dir);
  }
};

// ---- Comparisons ------------------------------------------------------------------------------

struct Worst {
  double loss = 0, param = 0, buffer = 0, optimizer = 0;
};

void expect_losses(const std::vector<double>& got, const std::vector<double>& want, int step,
                   Worst& worst) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    const double diff = std::abs(got[k] - want[k]) / std::abs(want[k]);
    EXPECT_LE(diff, kLossTol) << "step " << step << " loss " << k << ": " << got[k] << " vs "
                              << want[k];
    worst.loss = std::max(worst.loss, diff);
  }
}

/// ||x - x_ref|| relative to what training changed, ||x_ref - x_0|| (floor 1e-3 ||x_ref||).
double relative_to_change(const torch::Tensor& x, const torch::Tensor& x_ref, const torch::Tensor& x_0) {
  auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  const double change = (d(x_ref) - d(x_0)).norm().item<double>();
  const double floor = 1e-3 * d(x_ref).norm().item<double>();
  return (d(x) - d(x_ref)).norm().item<double>() / std::max({change, floor, 1e-30});
}

void expect_tensor_near(const std::string& name, const torch::Tensor& got, const torch::Tensor& want,
                        const torch::Tensor& start, double& worst) {
  ASSERT_EQ(got.sizes(), want.sizes()) << name;
  if (!got.is_floating_point()) {  // num_batches_tracked
    EXPECT_TRUE(torch::equal(got, want)) << name << ": " << got << " vs " << want;
    return;
  }
  const double diff = relative_to_change(got, want, start);
  EXPECT_LE(diff, kStateTol) << name;
  worst = std::max(worst, diff);
}

/// The sharded program's state against the reference's: the full state dict's parameters against
/// the master parameters and its buffers (rank 0's) against rank 0's replica; this rank's own
/// buffers against its replica.
/// And the optimizer's state against the reference optimizer's: relative to its size (it starts
/// at zero), step counts exactly. Adam's steps hardly change when every gradient is scaled by the
/// same factor, its moments change by that factor.
template <class Reference>
void expect_state(const Tensors& full, const Tensors& own_buffers, const Tensors& optimizer_state,
                  Reference& ref, int rank, const Tensors& initial_params,
                  const Tensors& initial_buffers, Worst& worst) {
  const Tensors ref_optimizer = ref.optimizer_state();
  EXPECT_FALSE(ref_optimizer.empty());
  EXPECT_EQ(optimizer_state.size(), ref_optimizer.size()) << "every state tensor of the optimizer";
  for (const auto& [name, want] : ref_optimizer) {
    ASSERT_TRUE(optimizer_state.count(name)) << name << " missing from the optimizer state";
    expect_tensor_near(name, optimizer_state.at(name), want, torch::zeros_like(want), worst.optimizer);
  }
  const Tensors params = ref.params(), rank0 = ref.buffers(0), mine = ref.buffers(rank);
  EXPECT_EQ(full.size(), params.size() + rank0.size()) << "every parameter and buffer";
  for (const auto& [name, tensor] : full) {
    if (params.count(name)) {
      expect_tensor_near(name, tensor, params.at(name), initial_params.at(name), worst.param);
    } else {
      ASSERT_TRUE(rank0.count(name)) << name << " is neither a parameter nor a buffer";
      expect_tensor_near(name + " (rank 0's)", tensor, rank0.at(name), initial_buffers.at(name),
                         worst.buffer);
    }
  }
  EXPECT_EQ(own_buffers.size(), mine.size());
  for (const auto& [name, tensor] : own_buffers) {
    ASSERT_TRUE(mine.count(name)) << name;
    expect_tensor_near(name + " (this rank's)", tensor, mine.at(name), initial_buffers.at(name),
                       worst.buffer);
  }
}

void expect_bitwise(const Tensors& got, const Tensors& want, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, tensor] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": " << name << " missing";
    EXPECT_TRUE(torch::equal(got.at(name), tensor)) << what << ": " << name;
  }
}

Tensors only_buffers(const Tensors& full, const Tensors& params) {
  Tensors out;
  for (const auto& [name, t] : full) {
    if (!params.count(name)) out[name] = t;
  }
  return out;
}

// A folder every rank names alike (rank 0's pid); rank 0 removes it.
std::string shared_folder(const std::string& what) {
  auto pid = torch::full({1}, static_cast<int64_t>(::getpid()), torch::kLong);
  fsdp::broadcast(*dist().world, pid, 0);
  return (fs::temp_directory_path() / ("fsdp-ports-" + std::to_string(pid.item<int64_t>()) + "-w" +
                                       std::to_string(dist().world_size()) + "-" + what))
      .string();
}

void barrier() {
  auto t = torch::zeros({1});
  fsdp::all_reduce_sum(*dist().world, t);
}

std::shared_ptr<fsdp::ProcessGroup> first_ranks(int n, const std::string& name) {
  std::vector<int> ranks(n);
  for (int r = 0; r < n; ++r) ranks[r] = r;
  return dist().world->subgroup(ranks, name);
}

void report(const std::string& what, const Worst& worst) {
  std::printf("[ports %s, rank %d] max loss rel diff %.3g (tol %.0e); params %.3g, buffers %.3g of "
              "the update, optimizer state %.3g of its size (tol %.0e)\n",
              what.c_str(), dist().rank(), worst.loss, kLossTol, worst.param, worst.buffer,
              worst.optimizer, kStateTol);
  std::fflush(stdout);
}

/// Programs 1-3: the sharded program at W against the reference for kSteps steps, saving a
/// checkpoint after kSavedAt; then W - 1 ranks load it into a fresh model and train the rest,
/// against the reference that went on with W - 1 ranks from there (rank 0's buffers on every rank,
/// the optimizer's state and every rank's generator carried on; the resumed ranks restore theirs,
/// as a program saves its generator beside a checkpoint).
template <class Sharded, class Reference>
void expect_port_matches_unsharded_program(const std::string& name) {
  const int world = dist().world_size(), rank = dist().rank();
  if (world < 2) GTEST_SKIP() << "one rank: nothing is sharded, no other world size to resume at";

  Reference ref(world);
  const Tensors initial_params = ref.params(), initial_buffers = ref.buffers(0);
  std::vector<Losses> ref_losses;
  for (int s = 0; s < kSteps; ++s) ref_losses.push_back(ref.step(s));
  Reference resumed_ref(world);
  std::vector<Losses> resumed_losses;
  for (int s = 0; s < kSteps; ++s) {
    if (s == kSavedAt) resumed_ref.shrink(world - 1);
    resumed_losses.push_back(resumed_ref.step(s));
  }

  const std::string dir = shared_folder(name);
  Tensors saved_full, saved_optimizer;
  torch::Tensor saved_generator;
  {
    Worst worst;
    Sharded program(*dist().world);
    for (int s = 0; s < kSteps; ++s) {
      expect_losses(program.step(s, rank), ref_losses[s][rank], s, worst);
      if (s + 1 == kSavedAt) {
        program.save(dir, kSavedAt);
        saved_full = program.full();
        saved_optimizer = program.optimizer_state();
        saved_generator = generator_state();
      }
    }
    const Tensors full = program.full(), buffers = program.own_buffers(),
                  optimizer = program.optimizer_state();
    expect_state(full, buffers, optimizer, ref, rank, initial_params, initial_buffers, worst);
    report(name + " uninterrupted at W=" + std::to_string(world), worst);
  }
  if (rank < world - 1) {
    Worst worst;
    auto group = first_ranks(world - 1, "ports-" + name + "-resume");
    Sharded program(*group);
    program.load(dir);
    expect_bitwise(program.full(), saved_full, "the full state dict loaded");
    expect_bitwise(program.own_buffers(), only_buffers(saved_full, initial_params),
                   "every rank's buffers loaded (rank 0's saved)");
    expect_bitwise(program.optimizer_state(), saved_optimizer, "the optimizer state loaded");
    set_generator_state(saved_generator);
    for (int s = kSavedAt; s < kSteps; ++s) {
      expect_losses(program.step(s, rank), resumed_losses[s][rank], s, worst);
    }
    const Tensors full = program.full(), buffers = program.own_buffers(),
                  optimizer = program.optimizer_state();
    expect_state(full, buffers, optimizer, resumed_ref, rank, initial_params, initial_buffers,
                 worst);
    report(name + " saved at W=" + std::to_string(world) + ", resumed at W=" +
               std::to_string(world - 1),
           worst);
  }
  barrier();
  if (rank == 0) fs::remove_all(dir);
}

TEST(PortPrograms, MnistCnnWithBatchNormAndDropoutMatchesTheUnshardedProgramAndResumes) {
  expect_port_matches_unsharded_program<MnistSharded, MnistReference>("mnist");
}

TEST(PortPrograms, DcganTwoModelsOnOneGroupMatchTheUnshardedProgramAndResume) {
  expect_port_matches_unsharded_program<GanSharded, GanReference>("dcgan");
}

TEST(PortPrograms, TwoLayerLstmMatchesTheUnshardedProgramAndResumes) {
  expect_port_matches_unsharded_program<LstmSharded, LstmReference>("lstm");
}

// A forward under grad mode whose output is never backpropagated (an evaluation without
// NoGradGuard, as public programs often write it) leaves the root unit unsharded for a backward
// that never comes. A full state dict loaded then must reach the next forward (as PyTorch FSDP2
// reshards before a state dict), and a checkpoint must save (MnistSharded evaluates so each step).
TEST(PortPrograms, AFullStateDictLoadedAfterAnEvaluationForwardReachesTheNextForward) {
  if (dist().world_size() < 2) GTEST_SKIP() << "one rank: the shard is the whole unit";
  auto model = fsdp::fully_shard(make_mnist(), *dist().world);
  auto [x, y] = mnist_batch(0, dist().rank());
  model->eval();
  EXPECT_TRUE(model->forward(x).requires_grad());  // no backward follows

  torch::manual_seed(kMnistSeed + 1);
  MnistNet other;  // other values, trained statistics
  for (auto& b : other->buffers()) {
    if (b.is_floating_point()) b.add_(0.5);
  }
  other->eval();
  fsdp::NamedTensors state;
  for (const auto& item : other->named_parameters()) state.emplace_back(item.key(), item.value().detach());
  for (const auto& item : other->named_buffers()) state.emplace_back(item.key(), item.value());
  fsdp::load_full_params(model, state, "another MnistNet");

  torch::NoGradGuard no_grad;
  const auto expected = other->forward(x);
  const auto output = model->forward(x);
  EXPECT_TRUE(torch::allclose(output, expected, /*rtol=*/1e-6, /*atol=*/1e-7))
      << "max |diff| " << (output - expected).abs().max().item<double>();
}

// The root resharded for a checkpoint saved between a forward and its backward: the backward
// unshards it again and the step is bitwise the one without the save.
TEST(PortPrograms, ACheckpointSavedBetweenAForwardAndItsBackwardLeavesTheStepUnchanged) {
  if (dist().world_size() < 2) GTEST_SKIP() << "one rank: the shard is the whole unit";
  const std::string folder = shared_folder("between");
  auto [x, y] = mnist_batch(0, dist().rank());
  auto saved = fsdp::fully_shard(make_mnist(), *dist().world);
  auto plain = fsdp::fully_shard(make_mnist(), *dist().world);
  torch::optim::SGD saved_optimizer(saved->parameters(), mnist_sgd());
  torch::optim::SGD plain_optimizer(plain->parameters(), mnist_sgd());
  const torch::Tensor generator = generator_state();  // the same dropout masks in both
  auto loss = torch::nll_loss(saved->forward(x), y);
  fsdp::save_sharded(saved, saved_optimizer, folder);
  loss.backward();
  saved_optimizer.step();
  set_generator_state(generator);
  torch::nll_loss(plain->forward(x), y).backward();
  plain_optimizer.step();
  expect_bitwise(named(fsdp::gather_full_params(saved), ""), named(fsdp::gather_full_params(plain), ""),
                 "the step with a save between its forward and backward");
  barrier();
  if (dist().rank() == 0) fs::remove_all(folder);
}

// KNOWN BUG, left open (enable to see it): an optimizer step after a forward in *training* mode
// under grad mode, before the next backward (training metrics computed between backward and step
// without model->eval()), meets the root's parameters as views of its gathered buffer (kept for a
// backward that never comes) next to gradients that are views of the gradient shard:
// torch::optim::SGD throws "The size of tensor a (32) must match the size of tensor b (165)"
// (W = 2), and shapes that happen to broadcast would step the wrong tensor. A forward in
// evaluation mode reshards ([Note: an evaluation forward reshards];
// PortingApi.AStepAfterAnEvaluationForwardUnderGradModeStepsTheShards). A fix for training mode
// must point the parameters at the shards between a forward and its backward (and back at the
// unit's pre-backward), and regather at the next forward.
TEST(PortPrograms, AStepAfterATrainingForwardWithoutBackwardStepsTheShards) {
  if (dist().world_size() < 2) GTEST_SKIP() << "one rank: the shard is the whole unit";
  auto [x, y] = mnist_batch(0, dist().rank());
  auto evaluated = fsdp::fully_shard(make_mnist(), *dist().world);
  auto plain = fsdp::fully_shard(make_mnist(), *dist().world);
  torch::optim::SGD evaluated_optimizer(evaluated->parameters(), mnist_sgd());
  torch::optim::SGD plain_optimizer(plain->parameters(), mnist_sgd());
  const torch::Tensor generator = generator_state();
  torch::nll_loss(evaluated->forward(x), y).backward();
  evaluated->forward(x);  // under grad mode; no backward follows
  evaluated_optimizer.step();
  set_generator_state(generator);
  torch::nll_loss(plain->forward(x), y).backward();
  {
    torch::NoGradGuard no_grad;
    plain->forward(x);
  }
  plain_optimizer.step();
  expect_bitwise(named(fsdp::gather_full_params(evaluated), ""), named(fsdp::gather_full_params(plain), ""),
                 "a step after an evaluation forward under grad mode");
}

// ---- 4. dist-mnist: the gradients averaged by hand, and the port that shards instead ----------

/// The original program on this rank: its own model; after backward, every gradient all-reduced
/// over the c10d group (Gloo's allreduce) and divided by the number of ranks. Its one correction:
/// rank 0's initial values broadcast by hand (the original trains W different models).
struct DistMnistOriginalRun {
  std::shared_ptr<DistMnistOriginal> model = std::make_shared<DistMnistOriginal>();
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(kDistMnistLr)};

  explicit DistMnistOriginalRun(fsdp::ProcessGroup& group) {
    torch::NoGradGuard no_grad;
    for (auto& param : model->parameters()) {
      std::vector<torch::Tensor> tmp = {param};
      group.backend().broadcast(tmp)->wait();
    }
  }
  double step(fsdp::ProcessGroup& group, int s, int rank) {
    model->zero_grad();
    auto loss = dist_mnist_loss(model, s, rank);
    loss.backward();
    // Averaging the gradients of the parameters in all the processors (as dist-mnist does).
    const int numranks = group.size();
    for (auto& param : model->named_parameters()) {
      std::vector<torch::Tensor> tmp = {param.value().grad()};
      group.backend().allreduce(tmp)->wait();
      param.value().grad().data() = param.value().grad().data() / numranks;
    }
    optimizer.step();
    return loss.item<double>();
  }
};

double dist_mnist_port_step(fsdp::Unit<DistMnistNet>& model, torch::optim::SGD& optimizer, int s,
                            int rank) {
  model->zero_grad();
  auto loss = dist_mnist_loss(model, s, rank);
  loss.backward();  // no averaging by hand: reduce-scattered and divided by W
  optimizer.step();
  return loss.item<double>();
}

fsdp::Unit<DistMnistNet> dist_mnist_port(fsdp::ProcessGroup& group) {
  torch::manual_seed(kDistMnistSeed + dist().rank());  // unseeded-style: every rank its own values
  return fsdp::fully_shard(DistMnistNet(), group, fsdp::FullyShardOptions().sync_module_states(true));
}

TEST(PortPrograms, DistMnistShardedEqualsTheGradientsAveragedByHandAndResumes) {
  const int world = dist().world_size(), rank = dist().rank();
  if (world < 2) GTEST_SKIP() << "one rank: nothing to average or shard";

  // Ported as it stands (every rank's own random model), fully_shard refuses it on every rank.
  torch::manual_seed(kDistMnistSeed + rank);
  try {
    fsdp::fully_shard(DistMnistNet(), *dist().world);
    ADD_FAILURE() << "ranks with different initial values were sharded";
  } catch (const c10::Error& e) {
    const std::string text = e.what_without_backtrace();
    EXPECT_NE(text.find("differ across ranks"), std::string::npos) << text;
    EXPECT_NE(text.find("sync_module_states"), std::string::npos) << text;
  }

  // The original at W ranks; its parameters and generator kept at kSavedAt for the resume below.
  torch::manual_seed(kDistMnistSeed + rank);
  DistMnistOriginalRun original(*dist().world);
  const Tensors initial = named(original.model->named_parameters(), "");
  std::vector<double> original_losses;
  Tensors original_at_save;
  torch::Tensor original_generator_at_save;
  for (int s = 0; s < kSteps; ++s) {
    original_losses.push_back(original.step(*dist().world, s, rank));
    if (s + 1 == kSavedAt) {
      original_at_save = named(original.model->named_parameters(), "");
      original_generator_at_save = generator_state();
    }
  }
  const Tensors original_final = named(original.model->named_parameters(), "");

  const std::string dir = shared_folder("dist-mnist");
  torch::Tensor port_generator_at_save;
  {
    Worst worst;
    // As dist-mnist orders it: the optimizer over the model's parameters first, the model sharded
    // after (the parameters stay the same tensors, now this rank's shards).
    torch::manual_seed(kDistMnistSeed + rank);
    DistMnistNet net;
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(kDistMnistLr));
    auto model = fsdp::fully_shard(net, *dist().world, fsdp::FullyShardOptions().sync_module_states(true));
    for (int s = 0; s < kSteps; ++s) {
      expect_losses({dist_mnist_port_step(model, optimizer, s, rank)}, {original_losses[s]}, s, worst);
      if (s + 1 == kSavedAt) {
        fsdp::save_checkpoint(model, optimizer, dir, kSavedAt);
        port_generator_at_save = generator_state();
      }
    }
    const Tensors full = named(fsdp::gather_full_params(model), "");
    EXPECT_EQ(full.size(), original_final.size());
    for (const auto& [name, tensor] : original_final) {
      ASSERT_TRUE(full.count(name)) << name;
      expect_tensor_near(name, full.at(name), tensor, initial.at(name), worst.param);
    }
    report("dist-mnist vs averaging by hand at W=" + std::to_string(world), worst);
  }

  // W - 1 ranks go on: the original from its parameters at kSavedAt over a group of W - 1, the
  // port from its checkpoint.
  if (rank < world - 1) {
    Worst worst;
    auto group = first_ranks(world - 1, "ports-dist-mnist-resume");
    {
      torch::NoGradGuard no_grad;
      for (auto& item : original.model->named_parameters()) {
        item.value().copy_(original_at_save.at(item.key()));
      }
    }
    set_generator_state(original_generator_at_save);
    std::vector<double> resumed_losses;
    for (int s = kSavedAt; s < kSteps; ++s) resumed_losses.push_back(original.step(*group, s, rank));
    const Tensors resumed_final = named(original.model->named_parameters(), "");

    auto model = dist_mnist_port(*group);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kDistMnistLr));
    fsdp::load_sharded(model, optimizer, fsdp::latest_checkpoint(dir));
    set_generator_state(port_generator_at_save);
    for (int s = kSavedAt; s < kSteps; ++s) {
      expect_losses({dist_mnist_port_step(model, optimizer, s, rank)},
                    {resumed_losses[s - kSavedAt]}, s, worst);
    }
    const Tensors full = named(fsdp::gather_full_params(model), "");
    for (const auto& [name, tensor] : resumed_final) {
      ASSERT_TRUE(full.count(name)) << name;
      expect_tensor_near(name, full.at(name), tensor, initial.at(name), worst.param);
    }
    report("dist-mnist saved at W=" + std::to_string(world) + ", resumed at W=" +
               std::to_string(world - 1),
           worst);
  }
  barrier();
  if (rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace fsdp_test::port_programs_test
