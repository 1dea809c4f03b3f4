#include "io/optimizer_options.h"

#include <fsdp/bounded_json.h>
#include <fsdp/muon.h>

#include <c10/util/Exception.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <type_traits>

namespace fsdp::detail {

namespace {

namespace o = torch::optim;

// Calls visit(name, option) for every option of each class, by reference.
template <class V>
void each_option(o::AdamOptions& x, V&& visit) {
  visit("lr", x.lr()), visit("betas", x.betas()), visit("eps", x.eps());
  visit("weight_decay", x.weight_decay()), visit("amsgrad", x.amsgrad());
}
template <class V>
void each_option(o::AdamWOptions& x, V&& visit) {
  visit("lr", x.lr()), visit("betas", x.betas()), visit("eps", x.eps());
  visit("weight_decay", x.weight_decay()), visit("amsgrad", x.amsgrad());
}
template <class V>
void each_option(o::SGDOptions& x, V&& visit) {
  visit("lr", x.lr()), visit("momentum", x.momentum()), visit("dampening", x.dampening());
  visit("weight_decay", x.weight_decay()), visit("nesterov", x.nesterov());
}
template <class V>
void each_option(o::RMSpropOptions& x, V&& visit) {
  visit("lr", x.lr()), visit("alpha", x.alpha()), visit("eps", x.eps());
  visit("weight_decay", x.weight_decay()), visit("momentum", x.momentum());
  visit("centered", x.centered());
}
template <class V>
void each_option(o::AdagradOptions& x, V&& visit) {
  visit("lr", x.lr()), visit("lr_decay", x.lr_decay()), visit("weight_decay", x.weight_decay());
  visit("initial_accumulator_value", x.initial_accumulator_value()), visit("eps", x.eps());
}

template <class V>
void each_option(fsdp::optim::MuonOptions& x, V&& visit) {
  visit("lr", x.lr()), visit("weight_decay", x.weight_decay()), visit("momentum", x.momentum());
  visit("nesterov", x.nesterov()), visit("ns_coefficients", x.ns_coefficients()), visit("eps", x.eps());
  visit("ns_steps", x.ns_steps()), visit("adjust_lr_fn", x.adjust_lr_fn());
}

// each_option of `options`, whichever of the six classes it is.
template <class V>
void visit_options(o::OptimizerOptions& options, V&& visit) {
  if (auto* x = dynamic_cast<o::AdamWOptions*>(&options)) return each_option(*x, visit);
  if (auto* x = dynamic_cast<o::AdamOptions*>(&options)) return each_option(*x, visit);
  if (auto* x = dynamic_cast<o::SGDOptions*>(&options)) return each_option(*x, visit);
  if (auto* x = dynamic_cast<o::RMSpropOptions*>(&options)) return each_option(*x, visit);
  if (auto* x = dynamic_cast<o::AdagradOptions*>(&options)) return each_option(*x, visit);
  if (auto* x = dynamic_cast<fsdp::optim::MuonOptions*>(&options)) return each_option(*x, visit);
  TORCH_INTERNAL_ASSERT(false, "options of an optimizer whose state checkpoints do not know");
}

}  // namespace

nlohmann::json options_to_json(const o::OptimizerOptions& options) {
  nlohmann::json j = nlohmann::json::object();
  auto copy = options.clone();  // the accessors visit_options takes are the mutable ones
  visit_options(*copy, [&](const char* name, const auto& value) { j[name] = value; });
  return j;
}

std::unique_ptr<o::OptimizerOptions> options_from_json(const o::OptimizerOptions& like,
                                                       const nlohmann::json& saved,
                                                       const std::string& source) {
  auto options = like.clone();
  visit_options(*options, [&](const char* name, auto& value) {
    try {
      value = saved.at(name).template get<std::decay_t<decltype(value)>>();
    } catch (const nlohmann::json::exception&) {
      TORCH_CHECK(false, source, ": a param group's option '", name, "' is ",
                  saved.contains(name) ? "of another type" : "missing", " (",
                  saved.contains(name) ? json_excerpt(saved.at(name)) : "not in param_groups",
                  "): the file was edited; resume from an intact copy of the checkpoint");
    }
  });
  // In range, too: an edited value is refused here, naming the file, not at the first step.
  if (const auto* muon = dynamic_cast<const fsdp::optim::MuonOptions*>(options.get())) {
    try {
      muon->validate();
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, source, ": a param group's options are out of range: ", e.what_without_backtrace(),
                  ": the file was edited; resume from an intact copy of the checkpoint");
    }
  }
  return options;
}

}  // namespace fsdp::detail
