// The four ported programs of tests/port_programs.h trained two sharded steps, then for each
// model: its full state dict (fsdp::save_full_params: NAME.pt) and, in eval mode, an input and
// the sharded model's output on it (NAME-io.pt), for tests/port_programs_e2e.py to load into the
// same models written in PyTorch. Run under fsdprun: port_programs_export FOLDER
#include "port_programs.h"

#include <fsdp/fsdp.h>

#include <iostream>
#include <string>

using namespace fsdp_test::ports;

namespace {

template <class M>
void export_model(fsdp::Unit<M>& model, const torch::Tensor& input, const std::string& folder,
                  const std::string& name, int rank) {
  model->eval();
  torch::Tensor output;
  {
    torch::NoGradGuard no_grad;
    output = model->forward(input);
  }
  fsdp::save_full_params(model, folder + "/" + name + ".pt");
  if (rank == 0) {
    fsdp::save_tensor_dict(folder + "/" + name + "-io.pt", {{"input", input}, {"output", output}});
  }
}

constexpr int kSteps = 2;
constexpr int kEvalStep = 100;  // the "test set": a batch no step trains on

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fsdprun --nproc-per-node W port_programs_export FOLDER" << std::endl;
    return 2;
  }
  const std::string folder = argv[1];
  try {
    auto dist = fsdp::init_distributed();
    auto& world = *dist->world;
    const int rank = dist->rank();
    {
      auto model = fsdp::fully_shard(make_mnist(), world);
      torch::optim::SGD optimizer(model->parameters(), mnist_sgd());
      for (int s = 0; s < kSteps; ++s) mnist_step(model, optimizer, s, rank);
      export_model(model, mnist_batch(kEvalStep, 0).first, folder, "mnist", rank);
    }
    {
      auto [generator_net, discriminator_net] = make_gan();
      fsdp::wrap_blocks<nn::Conv2d>(discriminator_net);
      auto generator = fsdp::fully_shard(generator_net, world);
      auto discriminator = fsdp::fully_shard(discriminator_net, world);
      torch::optim::Adam g_optimizer(generator->parameters(), gan_adam());
      torch::optim::Adam d_optimizer(discriminator->parameters(), gan_adam());
      for (int s = 0; s < kSteps; ++s) {
        gan_step(generator, discriminator, g_optimizer, d_optimizer, s, rank);
      }
      auto gen = batch_generator(2, kEvalStep, 1);
      export_model(generator, torch::randn({3, kNoiseSize, 1, 1}, gen), folder, "generator", rank);
      export_model(discriminator, gan_real_images(kEvalStep, 0), folder, "discriminator", rank);
    }
    {
      auto model = fsdp::fully_shard(make_lstm(), world);
      torch::optim::Adam optimizer(model->parameters(), lstm_adam());
      for (int s = 0; s < kSteps; ++s) lstm_step(model, optimizer, s, rank);
      export_model(model, lstm_batch(kEvalStep, 0).first, folder, "lstm", rank);
    }
    {
      torch::manual_seed(kDistMnistSeed + rank);  // every rank its own values: rank 0's are taken
      auto model = fsdp::fully_shard(DistMnistNet(), world,
                                     fsdp::FullyShardOptions().sync_module_states(true));
      torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kDistMnistLr));
      for (int s = 0; s < kSteps; ++s) {
        model->zero_grad();
        dist_mnist_loss(model, s, rank).backward();
        optimizer.step();
      }
      export_model(model, dist_mnist_batch(kEvalStep, 0).first, folder, "dist_mnist", rank);
    }
  } catch (const c10::Error& e) {
    std::cerr << "port_programs_export: " << e.what_without_backtrace() << std::endl;
    return 1;
  }
  return 0;
}
