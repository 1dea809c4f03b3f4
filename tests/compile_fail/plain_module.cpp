// Must not compile: a module by value, without a TORCH_MODULE holder, given to fully_shard. The
// test (fully_shard_refuses_a_plain_module) checks the compiler's message names the fix.
#include <fsdp/fsdp.h>

#include <torch/torch.h>

struct Net : torch::nn::Module {
  Net() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(torch::Tensor x) { return fc(x); }
  torch::nn::Linear fc{nullptr};
};

void shard(fsdp::ProcessGroup& group) { fsdp::fully_shard(Net(), group); }
