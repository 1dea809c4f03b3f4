// fsdp::optim::Muon's options and per-parameter state as torch::optim's optimizers keep theirs:
// serialized for torch::save / torch::load, compared, the lr read and set by schedulers.
#include <fsdp/muon.h>

#include <torch/serialize/archive.h>

namespace fsdp::optim {

MuonOptions::MuonOptions(double lr) : lr_(lr) {}

bool operator==(const MuonOptions& lhs, const MuonOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.weight_decay() == rhs.weight_decay() && lhs.momentum() == rhs.momentum() &&
         lhs.nesterov() == rhs.nesterov() && lhs.ns_coefficients() == rhs.ns_coefficients() &&
         lhs.eps() == rhs.eps() && lhs.ns_steps() == rhs.ns_steps() && lhs.adjust_lr_fn() == rhs.adjust_lr_fn();
}

void MuonOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(nesterov);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(ns_coefficients);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(ns_steps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(adjust_lr_fn);
}

void MuonOptions::serialize(torch::serialize::InputArchive& archive) {
  using Coefficients = std::tuple<double, double, double>;
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, nesterov);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Coefficients, ns_coefficients);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, ns_steps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::string, adjust_lr_fn);
}

double MuonOptions::get_lr() const { return lr(); }
void MuonOptions::set_lr(double lr) { this->lr(lr); }

bool operator==(const MuonParamState& lhs, const MuonParamState& rhs) {
  return torch::equal(lhs.momentum_buffer(), rhs.momentum_buffer());
}

void MuonParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
}

void MuonParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, momentum_buffer);
}

}  // namespace fsdp::optim
