#pragma once
// Four public-style LibTorch programs ported to fsdp-cpp, as their authors would port them: the
// model is a `struct NetImpl : torch::nn::Module` + TORCH_MODULE whose blocks become
// `fsdp::Unit<...>` members (still called `block->forward(x)`), the model is built seeded (or
// taken from rank 0 with sync_module_states), `fsdp::fully_shard` replaces nothing else.
//   1. MnistNet: pytorch/examples cpp/mnist's CNN with a BatchNorm, dropout, SGD with momentum;
//   2. a DCGAN (pytorch/examples cpp/dcgan): a generator with BatchNorm and a discriminator that
//      is a plain Sequential, two Adams, three forwards and backwards per step;
//   3. LstmNet: a two-layer torch::nn::LSTM (with dropout) in a unit and a Linear head, Adam;
//   4. DistMnistNet: pytorch/examples cpp/distributed/dist-mnist's model, whose original program
//      (DistMnistOriginal below) averages the gradients by hand over the c10d group.
// The data are small and synthetic: rank r's batch of step s is a function of (s, r) alone.
// tests/port_programs_test.cpp checks them against the unsharded programs;
// tests/port_programs_export.cpp writes their full state dicts for tests/port_programs_e2e.py.
#include <fsdp/fsdp.h>

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace fsdp_test::ports {

namespace nn = torch::nn;

/// Rank `rank`'s data generator for step `step` of program `program` (a fixed seed per triple).
inline at::Generator batch_generator(int program, int step, int rank) {
  return at::detail::createCPUGenerator(100000 * program + 100 * step + rank);
}

// ---- 1. MNIST's CNN with a BatchNorm (cpp/mnist) ---------------------------------------------

struct MnistNetImpl : nn::Module {
  MnistNetImpl() {
    // Units declared, built and registered as the holders they replace.
    // No bias before a BatchNorm (which removes any constant): its gradient would be rounding
    // noise, and so would its momentum.
    conv1 = register_module("conv1", fsdp::Unit<nn::Conv2d>(nn::Conv2dOptions(1, 8, /*kernel_size=*/3).bias(false)));
    bn1 = register_module("bn1", fsdp::Unit<nn::BatchNorm2d>(8));
    conv2 = register_module("conv2", fsdp::Unit<nn::Conv2d>(nn::Conv2dOptions(8, 16, /*kernel_size=*/3)));
    conv2_drop = register_module("conv2_drop", nn::Dropout2d());
    fc1 = register_module("fc1", fsdp::Unit<nn::Linear>(64, 32));
    fc2 = register_module("fc2", nn::Linear(32, 10));
  }
  torch::Tensor forward(torch::Tensor x) {  // 1x14x14 images
    x = torch::relu(torch::max_pool2d(bn1->forward(conv1->forward(x)), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 64});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, /*p=*/0.5, /*train=*/is_training());
    x = fc2->forward(x);
    return torch::log_softmax(x, /*dim=*/1);
  }
  fsdp::Unit<nn::Conv2d> conv1{nullptr}, conv2{nullptr};  // units; fc2 belongs to the root
  fsdp::Unit<nn::BatchNorm2d> bn1{nullptr};
  nn::Dropout2d conv2_drop{nullptr};
  fsdp::Unit<nn::Linear> fc1{nullptr};
  nn::Linear fc2{nullptr};
};
TORCH_MODULE(MnistNet);

constexpr int kMnistSeed = 1;
inline MnistNet make_mnist() {
  torch::manual_seed(kMnistSeed);  // every rank the same model and the same dropout draws
  return MnistNet();
}
inline torch::optim::SGDOptions mnist_sgd() { return torch::optim::SGDOptions(0.01).momentum(0.5); }

inline std::pair<torch::Tensor, torch::Tensor> mnist_batch(int step, int rank) {
  auto gen = batch_generator(1, step, rank);
  return {torch::randn({6, 1, 14, 14}, gen), torch::randint(0, 10, {6}, gen)};
}

/// One step of the program, the same code on a sharded root and on a plain MnistNet.
template <class Model>
double mnist_step(Model& model, torch::optim::Optimizer& optimizer, int step, int rank) {
  auto [data, targets] = mnist_batch(step, rank);
  optimizer.zero_grad();
  auto output = model->forward(data);
  auto loss = torch::nll_loss(output, targets);
  loss.backward();
  optimizer.step();
  return loss.item().toDouble();
}

// ---- 2. DCGAN (cpp/dcgan) --------------------------------------------------------------------

constexpr int64_t kNoiseSize = 8;

struct GeneratorImpl : nn::Module {
  GeneratorImpl() {
    conv1 = register_module("conv1", fsdp::Unit<nn::ConvTranspose2d>(nn::ConvTranspose2dOptions(kNoiseSize, 32, 4).bias(false)));
    batch_norm1 = register_module("batch_norm1", nn::BatchNorm2d(32));
    conv2 = register_module("conv2", fsdp::Unit<nn::ConvTranspose2d>(nn::ConvTranspose2dOptions(32, 16, 4).stride(2).padding(1).bias(false)));
    batch_norm2 = register_module("batch_norm2", nn::BatchNorm2d(16));
    conv3 = register_module(
        "conv3", nn::ConvTranspose2d(
                     nn::ConvTranspose2dOptions(16, 1, 4).stride(2).padding(1).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) {  // noise N x 8 x 1 x 1 -> images N x 1 x 16 x 16
    x = torch::relu(batch_norm1->forward(conv1->forward(x)));
    x = torch::relu(batch_norm2->forward(conv2->forward(x)));
    return torch::tanh(conv3->forward(x));
  }
  fsdp::Unit<nn::ConvTranspose2d> conv1{nullptr}, conv2{nullptr};  // units; the rest is the root's
  nn::ConvTranspose2d conv3{nullptr};
  nn::BatchNorm2d batch_norm1{nullptr}, batch_norm2{nullptr};
};
TORCH_MODULE(Generator);

/// The discriminator as cpp/dcgan writes it: a Sequential (sharded with its convolutions as
/// units by fsdp::wrap_blocks<nn::Conv2d>).
inline nn::Sequential make_discriminator() {
  return nn::Sequential(
      nn::Conv2d(nn::Conv2dOptions(1, 16, 4).stride(2).padding(1).bias(false)),
      nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
      nn::Conv2d(nn::Conv2dOptions(16, 32, 4).stride(2).padding(1).bias(false)),
      nn::BatchNorm2d(32),
      nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
      nn::Conv2d(nn::Conv2dOptions(32, 1, 4).stride(1).padding(0).bias(false)),
      nn::Sigmoid());
}

constexpr int kGanSeed = 2;
inline std::pair<Generator, nn::Sequential> make_gan() {
  torch::manual_seed(kGanSeed);
  Generator generator;
  auto discriminator = make_discriminator();
  return {generator, discriminator};
}
inline torch::optim::AdamOptions gan_adam() {
  return torch::optim::AdamOptions(2e-4).betas(std::make_tuple(0.5, 0.999));
}

inline torch::Tensor gan_real_images(int step, int rank) {
  auto gen = batch_generator(2, step, rank);
  return torch::rand({6, 1, 16, 16}, gen) * 2 - 1;
}

/// cpp/dcgan's step in three phases, so that the unsharded reference can average the gradients of
/// the ranks between them: (a) the discriminator's backwards on real and on fake.detach(), (b)
/// its step, (c) the generator's backward through the discriminator; then the generator's step.
struct GanStep {
  torch::Tensor fake_images;
  double d_loss = 0, g_loss = 0;

  template <class G, class D>
  void discriminator_backward(G& generator, D& discriminator, int step, int rank) {
    auto real_images = gan_real_images(step, rank);
    discriminator->zero_grad();
    torch::Tensor real_labels = torch::empty(real_images.size(0)).uniform_(0.8, 1.0);
    torch::Tensor real_output = discriminator->forward(real_images).reshape(real_labels.sizes());
    torch::Tensor d_loss_real = torch::binary_cross_entropy(real_output, real_labels);
    d_loss_real.backward();

    torch::Tensor noise = torch::randn({real_images.size(0), kNoiseSize, 1, 1});
    fake_images = generator->forward(noise);
    torch::Tensor fake_labels = torch::zeros(real_images.size(0));
    torch::Tensor fake_output =
        discriminator->forward(fake_images.detach()).reshape(fake_labels.sizes());
    torch::Tensor d_loss_fake = torch::binary_cross_entropy(fake_output, fake_labels);
    d_loss_fake.backward();
    d_loss = (d_loss_real + d_loss_fake).item<double>();
  }

  template <class G, class D>
  void generator_backward(G& generator, D& discriminator) {
    generator->zero_grad();
    torch::Tensor fake_labels = torch::ones(fake_images.size(0));
    torch::Tensor fake_output = discriminator->forward(fake_images).reshape(fake_labels.sizes());
    torch::Tensor g_loss_t = torch::binary_cross_entropy(fake_output, fake_labels);
    g_loss_t.backward();
    g_loss = g_loss_t.item<double>();
  }
};

/// One step of the program on one rank (sharded or not): both losses.
template <class G, class D>
std::vector<double> gan_step(G& generator, D& discriminator, torch::optim::Optimizer& g_optimizer,
                             torch::optim::Optimizer& d_optimizer, int step, int rank) {
  GanStep s;
  s.discriminator_backward(generator, discriminator, step, rank);
  d_optimizer.step();
  s.generator_backward(generator, discriminator);
  g_optimizer.step();
  return {s.d_loss, s.g_loss};
}

// ---- 3. A two-layer LSTM with a Linear head --------------------------------------------------

constexpr int64_t kLstmInput = 3, kLstmHidden = 8, kLstmOutput = 2, kLstmSeq = 5;

struct LstmNetImpl : nn::Module {
  LstmNetImpl() {
    lstm = register_module("lstm", fsdp::Unit<nn::LSTM>(
        nn::LSTMOptions(kLstmInput, kLstmHidden).num_layers(2).dropout(0.2).batch_first(true)));
    fc = register_module("fc", nn::Linear(kLstmHidden, kLstmOutput));
  }
  torch::Tensor forward(const torch::Tensor& x) {  // N x T x 3 -> N x 2
    auto [output, state] = lstm->forward(x);
    return fc->forward(output.select(/*dim=*/1, /*index=*/-1));
  }
  fsdp::Unit<nn::LSTM> lstm{nullptr};  // the unit; fc belongs to the root
  nn::Linear fc{nullptr};
};
TORCH_MODULE(LstmNet);

constexpr int kLstmSeed = 3;
inline LstmNet make_lstm() {
  torch::manual_seed(kLstmSeed);
  return LstmNet();
}
inline torch::optim::AdamOptions lstm_adam() { return torch::optim::AdamOptions(1e-2); }

inline std::pair<torch::Tensor, torch::Tensor> lstm_batch(int step, int rank) {
  auto gen = batch_generator(3, step, rank);
  auto x = torch::randn({4, kLstmSeq, kLstmInput}, gen);
  // A target the sequence determines: the sums of its first two features, squashed.
  auto y = torch::tanh(x.sum(1).narrow(1, 0, kLstmOutput));
  return {x, y};
}

template <class Model>
double lstm_step(Model& model, torch::optim::Optimizer& optimizer, int step, int rank) {
  auto [x, y] = lstm_batch(step, rank);
  optimizer.zero_grad();
  auto loss = torch::mse_loss(model->forward(x), y);
  loss.backward();
  optimizer.step();
  return loss.item().toDouble();
}

// ---- 4. dist-mnist (cpp/distributed/dist-mnist) ------------------------------------------------

/// The original program's model, as dist-mnist writes it (a plain Module, make_shared).
struct DistMnistOriginal : nn::Module {
  DistMnistOriginal()
      : conv1(nn::Conv2dOptions(1, 10, /*kernel_size=*/5)),
        conv2(nn::Conv2dOptions(10, 20, /*kernel_size=*/5)),
        fc1(320, 50),
        fc2(50, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, /*p=*/0.5, /*training=*/is_training());
    x = fc2->forward(x);
    return torch::log_softmax(x, /*dim=*/1);
  }
  nn::Conv2d conv1;
  nn::Conv2d conv2;
  nn::Dropout2d conv2_drop;
  nn::Linear fc1;
  nn::Linear fc2;
};

/// The port: the same model, its layers held as units (the names and the order of the random
/// initialisation unchanged).
struct DistMnistNetImpl : nn::Module {
  DistMnistNetImpl() {
    conv1 = register_module("conv1", fsdp::Unit<nn::Conv2d>(nn::Conv2dOptions(1, 10, /*kernel_size=*/5)));
    conv2 = register_module("conv2", fsdp::Unit<nn::Conv2d>(nn::Conv2dOptions(10, 20, /*kernel_size=*/5)));
    conv2_drop = register_module("conv2_drop", nn::Dropout2d());
    fc1 = register_module("fc1", fsdp::Unit<nn::Linear>(320, 50));
    fc2 = register_module("fc2", nn::Linear(50, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, /*p=*/0.5, /*training=*/is_training());
    x = fc2->forward(x);
    return torch::log_softmax(x, /*dim=*/1);
  }
  fsdp::Unit<nn::Conv2d> conv1{nullptr}, conv2{nullptr};
  nn::Dropout2d conv2_drop{nullptr};
  fsdp::Unit<nn::Linear> fc1{nullptr};
  nn::Linear fc2{nullptr};
};
TORCH_MODULE(DistMnistNet);

constexpr int kDistMnistSeed = 4;
constexpr double kDistMnistLr = 1e-2;

inline std::pair<torch::Tensor, torch::Tensor> dist_mnist_batch(int step, int rank) {
  auto gen = batch_generator(4, step, rank);
  return {torch::rand({4, 1, 28, 28}, gen), torch::randint(0, 10, {4}, gen)};
}

/// dist-mnist's loss (it applies log_softmax to the model's log_softmax output, as the original).
template <class Model>
torch::Tensor dist_mnist_loss(Model& model, int step, int rank) {
  auto [ip, op] = dist_mnist_batch(step, rank);
  auto prediction = model->forward(ip);
  return torch::nll_loss(torch::log_softmax(prediction, 1), op);
}

}  // namespace fsdp_test::ports
