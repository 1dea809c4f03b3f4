// A program of a user's shape trained with fsdp::optim::Muon + AdamW on a 2-D (FSDP x TP) model,
// for tests/muon_tp_program_e2e.py, which trains the unsplit model with torch.optim.Muon +
// torch.optim.AdamW in Python on the same batches and compares the parameters. Blocks hold their
// layers as fsdp::tp::Parallel<torch::nn::Linear> (column-wise up, row-wise down: non-square, with
// biases) and are FSDP units; a plain head in the root. The initial values and each step's batch
// come from a safetensors file ("<param>", "x<k>", "y<k>"); each dp rank trains on its rows of the
// batch. Writes the trained full parameters (rank 0) to --out.
#include <fsdp/fsdp.h>
#include <fsdp/safetensors.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <string>

namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t hidden)
      : up(register_module("up", torch::nn::Linear(dim, hidden))),
        down(register_module("down", torch::nn::Linear(hidden, dim))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + down(torch::gelu(up(x))); }
  fsdp::tp::Parallel<torch::nn::Linear> up, down;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 2; ++i) list->push_back(Block(12, 40));
    blocks = fsdp::wrap_blocks<Block>(list);
    head = register_module("head", torch::nn::Linear(12, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = block(x);
    return head(x);
  }
  std::vector<fsdp::Unit<Block>> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Muon + AdamW on a 2-D model of a user's shape (tests/muon_tp_program_e2e.py)"};
  std::string data, out;
  int steps = 6, tp_size = 1;
  app.add_option("--data", data, "safetensors: initial parameters, x<k> and y<k> per step")->required();
  app.add_option("--out", out, "the trained full parameters (safetensors)")->required();
  app.add_option("--steps", steps);
  app.add_option("--tp", tp_size);
  CLI11_PARSE(app, argc, argv);

  auto dist = fsdp::init_distributed();
  fsdp::DeviceMesh mesh(dist->world, {{"dp", dist->world_size() / tp_size}, {"tp", tp_size}});
  auto tp = std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp"));
  const fsdp::SafetensorsReader file(data);
  Net net;  // unseeded: the file's values replace LibTorch's draw
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->named_parameters()) p.value().copy_(file.read(p.key()));
  }
  fsdp::tp::parallelize_module(*net, tp, {{"blocks.*.up", fsdp::tp::ColwiseParallel()},
                                          {"blocks.*.down", fsdp::tp::RowwiseParallel()}});
  auto model = fsdp::fully_shard(net, mesh.group("dp"));
  auto split = fsdp::optim::split_for_muon(*model);
  fsdp::optim::Muon muon(split.matrices, fsdp::optim::MuonOptions(0.02));
  torch::optim::AdamW adamw(split.others, torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  const int dp = mesh.size("dp"), dp_rank = mesh.group("dp").rank();
  for (int step = 0; step < steps; ++step) {
    const torch::Tensor x = file.read("x" + std::to_string(step)), y = file.read("y" + std::to_string(step));
    const int64_t rows = x.size(0) / dp;
    muon.zero_grad();
    adamw.zero_grad();
    auto loss = torch::mse_loss(model->forward(x.narrow(0, dp_rank * rows, rows)), y.narrow(0, dp_rank * rows, rows));
    loss.backward();
    muon.step();
    adamw.step();
    std::printf("step %d loss %.8f\n", step, loss.item<double>());
  }
  const fsdp::NamedTensors params = fsdp::gather_full_params(model);
  if (dist->rank() == 0) fsdp::save_safetensors(out, params);
  return 0;
}
