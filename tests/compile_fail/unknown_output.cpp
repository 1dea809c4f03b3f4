// Must not compile: a unit whose forward returns a class fsdp cannot see into (private members,
// no FSDP_OUTPUT_TENSORS line). The test (a_unit_output_with_unknown_tensors_is_refused) checks the
// compiler's message names the type and the fix.
#include <fsdp/fsdp.h>

#include <torch/torch.h>

class AgentOutput {
 public:
  explicit AgentOutput(torch::Tensor logits) : logits_(std::move(logits)) {}
  const torch::Tensor& logits() const { return logits_; }

 private:
  torch::Tensor logits_;
};

struct AgentImpl : torch::nn::Module {
  AgentImpl() { fc = register_module("fc", torch::nn::Linear(4, 2)); }
  AgentOutput forward(const torch::Tensor& x) { return AgentOutput(fc(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Agent);

AgentOutput act(fsdp::Unit<Agent>& agent, const torch::Tensor& x) { return agent(x); }
