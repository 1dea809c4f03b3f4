#include "io/optimizer_state.h"

#include "optim/optimizer_kinds.h"

#include <fsdp/muon.h>

#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <typeinfo>

namespace fsdp::detail {

using torch::optim::Optimizer;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;
using Kinds = std::vector<std::string>;

/// How one torch::optim class keeps its per-parameter state: what it keeps is its description's
/// ([Note: what an optimizer keeps, once]); here are only the typed accessors of its state.
struct OptimizerFamily {
  const optimizers::OptimizerKind& kind;
  bool (*is)(Optimizer&);
  optimizers::StateOptions (*options)(const OptimizerOptions&);  // those that add state
  ParamOptimState (*read)(OptimizerParamState&);
  std::unique_ptr<OptimizerParamState> (*make)(const ParamOptimState&);
};

namespace {

// The tensors of `kinds` that are defined, by kind.
std::map<std::string, at::Tensor> defined(std::initializer_list<std::pair<const char*, at::Tensor>> kinds) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [kind, tensor] : kinds) {
    if (tensor.defined()) out.emplace(kind, tensor);
  }
  return out;
}

at::Tensor kind_or_undefined(const ParamOptimState& s, const std::string& kind) {
  auto it = s.tensors.find(kind);
  return it == s.tensors.end() ? at::Tensor() : it->second;
}

template <class O>
bool is(Optimizer& optimizer) {
  return dynamic_cast<O*>(&optimizer) != nullptr;
}

template <class S>
S& as(OptimizerParamState& state) {
  auto* typed = dynamic_cast<S*>(&state);
  TORCH_INTERNAL_ASSERT(typed, "an optimizer holds a state of another optimizer");
  return *typed;
}

const optimizers::OptimizerKind& described(const char* name) {
  const optimizers::OptimizerKind* kind = optimizers::find_optimizer(name);
  TORCH_INTERNAL_ASSERT(kind, "optim/optimizer_kinds.cpp does not describe ", name);
  return *kind;
}

// Adam and AdamW keep the same state.
template <class O, class Options, class S>
OptimizerFamily adam_like(const char* name) {
  return {described(name), is<O>,
          [](const OptimizerOptions& o) {
            optimizers::StateOptions kept;
            kept.amsgrad = static_cast<const Options&>(o).amsgrad();
            return kept;
          },
          [](OptimizerParamState& base) {
            auto& s = as<S>(base);
            return ParamOptimState{s.step(), defined({{"exp_avg", s.exp_avg()},
                                                      {"exp_avg_sq", s.exp_avg_sq()},
                                                      {"max_exp_avg_sq", s.max_exp_avg_sq()}})};
          },
          [](const ParamOptimState& saved) -> std::unique_ptr<OptimizerParamState> {
            auto s = std::make_unique<S>();
            s->step(saved.step.value_or(0));
            s->exp_avg(kind_or_undefined(saved, "exp_avg"));
            s->exp_avg_sq(kind_or_undefined(saved, "exp_avg_sq"));
            s->max_exp_avg_sq(kind_or_undefined(saved, "max_exp_avg_sq"));
            return s;
          }};
}

const std::vector<OptimizerFamily>& families() {
  namespace o = torch::optim;
  static const std::vector<OptimizerFamily> known{
      adam_like<o::AdamW, o::AdamWOptions, o::AdamWParamState>("AdamW"),
      adam_like<o::Adam, o::AdamOptions, o::AdamParamState>("Adam"),
      {described("SGD"), is<o::SGD>,
       [](const OptimizerOptions& opt) {
         optimizers::StateOptions kept;
         kept.momentum = static_cast<const o::SGDOptions&>(opt).momentum() != 0;
         return kept;
       },
       [](OptimizerParamState& base) {
         return ParamOptimState{std::nullopt, defined({{"momentum_buffer", as<o::SGDParamState>(base).momentum_buffer()}})};
       },
       [](const ParamOptimState& saved) -> std::unique_ptr<OptimizerParamState> {
         auto s = std::make_unique<o::SGDParamState>();
         s->momentum_buffer(kind_or_undefined(saved, "momentum_buffer"));
         return s;
       }},
      {described("RMSprop"), is<o::RMSprop>,
       [](const OptimizerOptions& opt) {
         const auto& r = static_cast<const o::RMSpropOptions&>(opt);
         optimizers::StateOptions kept;
         kept.momentum = r.momentum() > 0;
         kept.centered = r.centered();
         return kept;
       },
       [](OptimizerParamState& base) {
         auto& s = as<o::RMSpropParamState>(base);
         return ParamOptimState{s.step(), defined({{"square_avg", s.square_avg()},
                                                   {"momentum_buffer", s.momentum_buffer()},
                                                   {"grad_avg", s.grad_avg()}})};
       },
       [](const ParamOptimState& saved) -> std::unique_ptr<OptimizerParamState> {
         auto s = std::make_unique<o::RMSpropParamState>();
         s->step(saved.step.value_or(0));
         s->square_avg(kind_or_undefined(saved, "square_avg"));
         s->momentum_buffer(kind_or_undefined(saved, "momentum_buffer"));
         s->grad_avg(kind_or_undefined(saved, "grad_avg"));
         return s;
       }},
      {described("Adagrad"), is<o::Adagrad>, [](const OptimizerOptions&) { return optimizers::StateOptions{}; },
       [](OptimizerParamState& base) {
         auto& s = as<o::AdagradParamState>(base);
         return ParamOptimState{s.step(), defined({{"sum", s.sum()}})};
       },
       [](const ParamOptimState& saved) -> std::unique_ptr<OptimizerParamState> {
         auto s = std::make_unique<o::AdagradParamState>();
         s->step(saved.step.value_or(0));
         s->sum(kind_or_undefined(saved, "sum"));
         return s;
       }},
      // torch.optim.Muon's one tensor, whatever its options (momentum 0 keeps it too).
      {described("Muon"), is<fsdp::optim::Muon>, [](const OptimizerOptions&) { return optimizers::StateOptions{}; },
       [](OptimizerParamState& base) {
         return ParamOptimState{std::nullopt,
                                defined({{"momentum_buffer", as<fsdp::optim::MuonParamState>(base).momentum_buffer()}})};
       },
       [](const ParamOptimState& saved) -> std::unique_ptr<OptimizerParamState> {
         auto s = std::make_unique<fsdp::optim::MuonParamState>();
         s->momentum_buffer(kind_or_undefined(saved, "momentum_buffer"));
         return s;
       }},
  };
  return known;
}

const OptimizerFamily& family_of(Optimizer& optimizer, const std::string& what) {
  for (const auto& family : families()) {
    if (family.is(optimizer)) return family;
  }
  TORCH_CHECK(false, what, ": cannot checkpoint the optimizer ", c10::demangle(typeid(optimizer).name()),
              ": sharded checkpoints hold the state of torch::optim's ", optimizers::known_optimizer_names(),
              " (and fsdp::optim's AdamW, SGD and Muon); use one of them, or save the parameters alone with "
              "fsdp::save_full_params");
}

// The index of the param group holding `param`, or nullopt.
std::optional<size_t> group_of(Optimizer& optimizer, const at::Tensor& param) {
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    for (auto& p : optimizer.param_groups()[g].params()) {
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return g;
    }
  }
  return std::nullopt;
}

}  // namespace

OptimizerState::OptimizerState(Optimizer& optimizer, const std::string& what)
    : optimizer_(&optimizer), family_(&family_of(optimizer, what)) {}

std::string OptimizerState::name() const { return family_->kind.name; }

std::vector<std::string> OptimizerState::kinds_in_use() const {
  Kinds used;
  for (const auto& tensor : family_->kind.tensors) {
    for (auto& group : optimizer_->param_groups()) {
      const Kinds needed = kinds_kept(family_->kind, family_->options(group.options()));
      if (std::find(needed.begin(), needed.end(), tensor.kind) != needed.end()) {
        used.emplace_back(tensor.kind);
        break;
      }
    }
  }
  return used;
}

std::optional<std::vector<std::string>> OptimizerState::kinds_needed(const at::Tensor& param) const {
  return kinds_needed(param, {});
}

std::optional<std::vector<std::string>> OptimizerState::kinds_needed(
    const at::Tensor& param, const std::vector<std::unique_ptr<OptimizerOptions>>& options) const {
  const auto g = group_of(*optimizer_, param);
  if (!g) return std::nullopt;
  const OptimizerOptions& group = options.empty() ? optimizer_->param_groups()[*g].options() : *options.at(*g);
  return kinds_kept(family_->kind, family_->options(group));
}

bool OptimizerState::counts_steps() const { return family_->kind.counts_steps; }

std::optional<ParamOptimState> OptimizerState::read(const at::Tensor& param) const {
  auto it = optimizer_->state().find(param.unsafeGetTensorImpl());
  if (it == optimizer_->state().end()) return std::nullopt;
  return family_->read(*it->second);
}

void OptimizerState::write(const at::Tensor& param, const std::optional<ParamOptimState>& state) {
  void* key = param.unsafeGetTensorImpl();
  if (!state) {
    // Adagrad's step expects the state it built: a checkpoint without any keeps it fresh.
    if (!family_->kind.state_from_start) optimizer_->state().erase(key);
    return;
  }
  optimizer_->state()[key] = family_->make(*state);
}

}  // namespace fsdp::detail
