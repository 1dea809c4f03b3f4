// A public-style LibTorch training program (pytorch/examples' cpp/mnist: a CNN with BatchNorm and
// dropout, SGD with momentum, printf), ported to fsdp-cpp: README's "Porting a LibTorch program".
// The five edits are marked "port (N)"; everything else is the program as it was.
// Run: build/bin/fsdprun --nproc-per-node 2 build/bin/port_example   (or alone: one rank)
#include <fsdp/fsdp.h>  // port (1): the library

#include <torch/torch.h>

#include <cstdio>

struct NetImpl : torch::nn::Module {
  NetImpl() {
    // port (2): the big layers become units, declared and registered as the holders they replace.
    conv1 = register_module("conv1", fsdp::Unit<torch::nn::Conv2d>(torch::nn::Conv2dOptions(1, 8, 3)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(8));
    conv2 = register_module("conv2", fsdp::Unit<torch::nn::Conv2d>(torch::nn::Conv2dOptions(8, 16, 3)));
    dropout = register_module("dropout", torch::nn::Dropout(0.25));
    fc1 = register_module("fc1", fsdp::Unit<torch::nn::Linear>(16 * 4 * 4, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 4));  // small: stays in the root unit
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1->forward(conv1->forward(x)));                // [N, 8, 10, 10]
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);        // [N, 16, 4, 4]
    x = dropout->forward(x.view({-1, 16 * 4 * 4}));
    x = torch::relu(fc1->forward(x));
    return torch::log_softmax(fc2->forward(x), /*dim=*/1);
  }
  fsdp::Unit<torch::nn::Conv2d> conv1{nullptr}, conv2{nullptr};  // port (2): were torch::nn::Conv2d
  fsdp::Unit<torch::nn::Linear> fc1{nullptr};                     // port (2): was torch::nn::Linear
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(Net);

// The data set: 12x12 images of four classes (a bright quadrant each), the same on every machine.
std::pair<torch::Tensor, torch::Tensor> make_dataset(int64_t size) {
  auto gen = at::detail::createCPUGenerator(2024);
  auto labels = torch::randint(0, 4, {size}, gen);
  auto images = torch::randn({size, 1, 12, 12}, gen) * 0.5;
  for (int64_t i = 0; i < size; ++i) {
    const int64_t q = labels[i].item<int64_t>();
    images[i].narrow(1, (q / 2) * 6, 6).narrow(2, (q % 2) * 6, 6).add_(1.0);
  }
  return {images, labels};
}

int main(int argc, char** argv) {
  auto dist = fsdp::init_distributed();  // port (3): join the other ranks (torchrun's variables)
  torch::manual_seed(1);  // port (4): the same initial model on every rank (LibTorch seeds each process at random)
  auto model = fsdp::fully_shard(Net(), *dist->world);  // port (5): shard, and call the returned root
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));

  const auto [images, labels] = make_dataset(512);
  // Per rank: each rank trains on its own rows and the gradients are averaged. Every rank takes
  // as many steps (a step is a collective): the rows left over are dropped.
  const int64_t batch = 32, steps = images.size(0) / (batch * dist->world_size());
  for (int64_t epoch = 1; epoch <= 3; ++epoch) {
    model->train();
    double loss_sum = 0;
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t start = (step * dist->world_size() + dist->rank()) * batch;
      optimizer.zero_grad();
      auto loss = torch::nll_loss(model->forward(images.narrow(0, start, batch)), labels.narrow(0, start, batch));
      loss.backward();
      optimizer.step();
      loss_sum += loss.item<double>();
    }
    if (dist->rank() == 0) std::printf("epoch %ld loss %.4f\n", static_cast<long>(epoch), loss_sum / steps);
  }

  // Rank 0 evaluates the whole model alone and saves it as the unsharded program did.
  fsdp::SummonFullParams whole(model);  // a collective: every rank
  if (dist->rank() == 0) {
    torch::NoGradGuard no_grad;
    model->eval();
    auto correct = model->forward(images).argmax(1).eq(labels).sum().item<int64_t>();
    std::printf("accuracy %.3f\n", static_cast<double>(correct) / images.size(0));
    torch::save(model, argc > 1 ? argv[1] : "port_model.pt");  // loads into an unsharded Net
  }
}
