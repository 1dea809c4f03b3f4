// fsdp::optim::Muon's options and per-parameter state as torch::optim's optimizers keep theirs:
// serialized for torch::save / torch::load, compared, the lr read and set by schedulers.
#include <fsdp/muon.h>

#include "optim/newton_schulz.h"

#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

namespace fsdp::optim {

MuonOptions::MuonOptions(double lr) : lr_(lr) {}

void MuonOptions::validate() const {
  TORCH_CHECK(lr() >= 0, "fsdp::optim::Muon: lr must be >= 0, got ", lr());
  TORCH_CHECK(momentum() >= 0, "fsdp::optim::Muon: momentum must be >= 0, got ", momentum());
  TORCH_CHECK(weight_decay() >= 0, "fsdp::optim::Muon: weight_decay must be >= 0, got ", weight_decay());
  TORCH_CHECK(ns_steps() >= 0 && ns_steps() < 100, "fsdp::optim::Muon: ns_steps must be in [0, 100), got ", ns_steps());
  muon::check_adjust_lr_fn(adjust_lr_fn());
}

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
