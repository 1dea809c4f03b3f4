// The smallest complete FSDP program: README's example, compiled and run by the tests.
// Run: build/bin/fsdprun --nproc-per-node 2 build/bin/minimal_example
#include <fsdp/fsdp.h>

#include <torch/torch.h>

#include <iostream>

struct BlockImpl : torch::nn::Module {
  BlockImpl() { fc = register_module("fc", torch::nn::Linear(64, 64)); }
  torch::Tensor forward(torch::Tensor x) { return x + torch::relu(fc(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    auto h = register_module("h", torch::nn::ModuleList());
    for (int i = 0; i < 4; ++i) h->push_back(Block());
    blocks = fsdp::wrap_blocks<Block>(h);          // each block is one FSDP unit
    head = register_module("head", torch::nn::Linear(64, 1));  // the root unit holds the rest
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = block(x);       // all-gather, forward, free
    return head(x);
  }
  std::vector<fsdp::Unit<Block>> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

int main() {
  fsdp::install_memory_counter();                  // opt-in: exact tensor bytes (memory_stats)
  auto dist = fsdp::init_distributed();            // RANK, WORLD_SIZE, MASTER_ADDR, ... ; Gloo
  torch::manual_seed(0);                           // the same initial model on every rank
  auto model = fsdp::fully_shard(Net(), *dist->world);
  torch::optim::AdamW optim(model->parameters(), torch::optim::AdamWOptions(1e-2));

  auto gen = at::detail::createCPUGenerator(100 + dist->rank());  // each rank its own data
  auto x = torch::randn({32, 64}, gen);
  auto y = x.sum(1, /*keepdim=*/true) / 8;
  for (int step = 0; step < 50; ++step) {
    optim.zero_grad();
    auto loss = torch::mse_loss(model(x), y);
    loss.backward();                               // gradients reduce-scattered unit by unit
    optim.step();                                  // each rank steps its own shards
    if (dist->rank() == 0 && step % 10 == 9) std::cout << "step " << step + 1 << " loss " << loss.item<float>() << "\n";
  }
  auto stats = fsdp::memory_stats();
  std::cout << "rank " << dist->rank() << ": peak tensor memory " << stats.peak_bytes << " bytes\n";
}
