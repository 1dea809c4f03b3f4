#include "io/optimizer_state.h"

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

/// How one torch::optim class keeps its per-parameter state.
struct OptimizerFamily {
  const char* name;
  bool counts_steps;
  bool state_from_start;  // builds every parameter's state at construction (Adagrad)
  Kinds all_kinds;  // in the order they are saved
  bool (*is)(Optimizer&);
  Kinds (*needed)(const OptimizerOptions&);
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

// Adam and AdamW keep the same state.
template <class O, class Options, class S>
OptimizerFamily adam_like(const char* name) {
  return {name, true, false, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, is<O>,
          [](const OptimizerOptions& o) {
            Kinds kinds{"exp_avg", "exp_avg_sq"};
            if (static_cast<const Options&>(o).amsgrad()) kinds.push_back("max_exp_avg_sq");
            return kinds;
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
      {"SGD", false, false, {"momentum_buffer"}, is<o::SGD>,
       [](const OptimizerOptions& opt) {
         return static_cast<const o::SGDOptions&>(opt).momentum() != 0 ? Kinds{"momentum_buffer"} : Kinds{};
       },
       [](OptimizerParamState& base) {
         return ParamOptimState{std::nullopt, defined({{"momentum_buffer", as<o::SGDParamState>(base).momentum_buffer()}})};
       },
       [](const ParamOptimState& saved) -> std::unique_ptr<OptimizerParamState> {
         auto s = std::make_unique<o::SGDParamState>();
         s->momentum_buffer(kind_or_undefined(saved, "momentum_buffer"));
         return s;
       }},
      {"RMSprop", true, false, {"square_avg", "momentum_buffer", "grad_avg"}, is<o::RMSprop>,
       [](const OptimizerOptions& opt) {
         const auto& r = static_cast<const o::RMSpropOptions&>(opt);
         Kinds kinds{"square_avg"};
         if (r.momentum() > 0) kinds.push_back("momentum_buffer");
         if (r.centered()) kinds.push_back("grad_avg");
         return kinds;
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
      {"Adagrad", true, true, {"sum"}, is<o::Adagrad>, [](const OptimizerOptions&) { return Kinds{"sum"}; },
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
  };
  return known;
}

const OptimizerFamily& family_of(Optimizer& optimizer, const std::string& what) {
  for (const auto& family : families()) {
    if (family.is(optimizer)) return family;
  }
  TORCH_CHECK(false, what, ": cannot checkpoint the optimizer ", c10::demangle(typeid(optimizer).name()),
              ": sharded checkpoints hold the state of torch::optim's SGD, Adam, AdamW, RMSprop and "
              "Adagrad (and fsdp::optim's AdamW and SGD); use one of them, or save the parameters "
              "alone with fsdp::save_full_params");
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

std::string OptimizerState::name() const { return family_->name; }

std::vector<std::string> OptimizerState::kinds_in_use() const {
  Kinds used;
  for (const auto& kind : family_->all_kinds) {
    for (auto& group : optimizer_->param_groups()) {
      const Kinds needed = family_->needed(group.options());
      if (std::find(needed.begin(), needed.end(), kind) != needed.end()) {
        used.push_back(kind);
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
  return family_->needed(options.empty() ? optimizer_->param_groups()[*g].options() : *options.at(*g));
}

bool OptimizerState::counts_steps() const { return family_->counts_steps; }

std::optional<ParamOptimState> OptimizerState::read(const at::Tensor& param) const {
  auto it = optimizer_->state().find(param.unsafeGetTensorImpl());
  if (it == optimizer_->state().end()) return std::nullopt;
  return family_->read(*it->second);
}

void OptimizerState::write(const at::Tensor& param, const std::optional<ParamOptimState>& state) {
  void* key = param.unsafeGetTensorImpl();
  if (!state) {
    // Adagrad's step expects the state it built: a checkpoint without any keeps it fresh.
    if (!family_->state_from_start) optimizer_->state().erase(key);
    return;
  }
  optimizer_->state()[key] = family_->make(*state);
}

}  // namespace fsdp::detail
