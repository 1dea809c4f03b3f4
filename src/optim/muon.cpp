// fsdp::optim::Muon's step: the element-wise parts (momentum, Nesterov, weight decay, the update)
// on each rank's pieces, the Newton-Schulz iteration on whole matrices at their owners
// ([Note: Muon's owners]), the pieces moved by two all-to-alls (optim/muon_exchange.h).
#include <fsdp/muon.h>

#include "core/sharded_view.h"
#include "optim/fused_step.h"
#include "optim/muon_exchange.h"
#include "optim/muon_owners.h"
#include "optim/newton_schulz.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <atomic>
#include <numeric>
#include <unordered_map>

namespace fsdp::optim {
namespace {

// One parameter to step now, with its gradient and its param group's options.
struct Stepped {
  at::Tensor param, grad;
  const MuonOptions* options;
};

// Where a parameter lies in a sharded model: its piece, the flat buffer (unit) holding it, and
// its place in the model's order.
struct Placement {
  detail::ShardedParam param;
  size_t buffer;
  size_t index;
};

// The parameters of one sharded model by TensorImpl.
struct ModelParams {
  ShardedModel model;
  detail::ShardedView view;
  std::unordered_map<const void*, Placement> by_impl;
};

std::vector<ModelParams> every_sharded_model() {
  std::vector<ModelParams> models;
  for (auto& model : detail::sharded_models()) {
    ModelParams m{model, detail::ShardedView(model), {}};
    size_t index = 0;
    for (size_t b = 0; b < m.view.buffers().size(); ++b) {
      for (const auto& p : m.view.buffers()[b].params()) {
        m.by_impl.emplace(p.param().unsafeGetTensorImpl(), Placement{p, b, index++});
      }
    }
    models.push_back(std::move(m));
  }
  return models;
}

// A forward without a backward may have left a unit unsharded ([Note: resharding between
// steps]): the parameter must be its piece again before it is stepped.
void hold_piece_only(const ModelParams& model, const Placement& m) {
  const detail::ShardedBuffer& buffer = model.view.buffers().at(m.buffer);
  if (!buffer.holds_shard_only()) buffer.reshard_unless_in_backward();
  TORCH_CHECK(buffer.holds_shard_only(), "fsdp::optim::Muon: unit '", buffer.unit_name(),
              "' is unsharded while its parameter '", m.param.name(), "' is stepped; step after "
              "backward has finished");
}

// Every rank of the group must step the same matrices (they meet in the exchanges): a rank whose
// gradients differ in which are defined would pair the wrong pieces. One small all-reduce checks it.
void check_same_matrices_stepped(ProcessGroup& group, const std::vector<const Stepped*>& now,
                                 const std::vector<const Placement*>& matrices) {
  if (group.size() == 1) return;
  at::Tensor counts = at::zeros({static_cast<int64_t>(now.size())}, at::kInt);
  auto count = counts.accessor<int, 1>();
  for (size_t i = 0; i < now.size(); ++i) count[i] = now[i] ? 1 : 0;
  all_reduce_sum(group, counts);
  for (size_t i = 0; i < now.size(); ++i) {
    const int ranks = count[i];
    TORCH_CHECK(ranks == 0 || ranks == group.size(), "fsdp::optim::Muon: parameter '",
                matrices[i]->param.name(), "' has a gradient on ", ranks, " of the ", group.size(),
                " ranks of its shard group; every rank must step the same parameters (a gradient set "
                "or cleared by hand on some ranks only?)");
  }
}

std::string shape_text(const std::vector<int64_t>& shape) { return c10::str(c10::IntArrayRef(shape)); }

void check_matrix(const std::vector<int64_t>& shape, const std::string& which) {
  TORCH_CHECK(shape.size() == 2, "fsdp::optim::Muon: ", which, " has shape ", shape_text(shape),
              ": Muon steps 2-D matrices only. Give it to AdamW instead (fsdp::optim::split_for_muon "
              "splits a model's parameters: hidden matrices for Muon, the rest for AdamW)");
}

// torch.optim.Muon's momentum and Nesterov steps on `s` (a whole parameter or a rank's piece):
// the update the iteration orthogonalizes.
at::Tensor momentum_update(Muon& optimizer, const Stepped& s) {
  auto& slot = optimizer.state()[s.param.unsafeGetTensorImpl()];
  if (!slot) {
    auto fresh = std::make_unique<MuonParamState>();
    fresh->momentum_buffer(at::zeros_like(s.grad, at::MemoryFormat::Preserve));
    slot = std::move(fresh);
  }
  auto* state = dynamic_cast<MuonParamState*>(slot.get());
  TORCH_CHECK(state, "fsdp::optim::Muon: the state of a parameter is not Muon's (loaded from another "
              "optimizer's checkpoint?)");
  at::Tensor buffer = state->momentum_buffer();
  const double momentum = s.options->momentum();
  buffer.lerp_(s.grad, 1 - momentum);
  return s.options->nesterov() ? s.grad.lerp(buffer, momentum) : buffer;
}

// torch.optim.Muon's last two lines: decoupled weight decay, then the orthogonalized update
// (`orthogonal`: the whole matrix's or this rank's piece of it, flat) at the adjusted lr.
void apply_update(const Stepped& s, const at::Tensor& orthogonal, const std::vector<int64_t>& shape) {
  const MuonOptions& o = *s.options;
  const double lr = muon::adjusted_lr(o.lr(), o.adjust_lr_fn(), shape);
  s.param.mul_(1 - o.lr() * o.weight_decay());
  s.param.add_(orthogonal.view(s.param.sizes()), -lr);
}

at::Tensor orthogonalize(const at::Tensor& update, const MuonOptions& o) {
  return muon::orthogonalize(update, o.ns_coefficients(), o.ns_steps(), o.eps());
}

void check_options(const MuonOptions& o) {
  TORCH_CHECK(o.lr() >= 0, "fsdp::optim::Muon: lr must be >= 0, got ", o.lr());
  TORCH_CHECK(o.momentum() >= 0, "fsdp::optim::Muon: momentum must be >= 0, got ", o.momentum());
  TORCH_CHECK(o.weight_decay() >= 0, "fsdp::optim::Muon: weight_decay must be >= 0, got ", o.weight_decay());
  TORCH_CHECK(o.ns_steps() >= 0 && o.ns_steps() < 100,
              "fsdp::optim::Muon: ns_steps must be in [0, 100), got ", o.ns_steps());
  muon::check_adjust_lr_fn(o.adjust_lr_fn());
}

}  // namespace

class Muon::Impl {
 public:
  // Steps `stepped`: parameters outside every sharded model whole, here; each sharded model's
  // matrices at their owners. Every rank of a shard group calls it with the same parameters.
  void step(Muon& self, const std::vector<Stepped>& stepped, MuonWork& work);

 private:
  void step_model(Muon& self, const ModelParams& model, const std::vector<Stepped>& stepped, MuonWork& work);
  // The group Muon's exchanges for `model` run in: its own, beside the shard group's, so that
  // an exchange during backward (StepInBackward, on the optimizer's thread) never interleaves
  // with the model's collectives.
  ProcessGroup& exchange_group(const ModelParams& model);

  std::vector<std::pair<ShardedModel, std::shared_ptr<ProcessGroup>>> groups_;
};

ProcessGroup& Muon::Impl::exchange_group(const ModelParams& model) {
  const detail::ShardedView view(model.model);
  if (view.shard_group().size() == 1) return view.shard_group();
  for (const auto& [known, group] : groups_) {
    if (known == model.model) return *group;
  }
  static std::atomic<int> made{0};  // the same sequence on every rank: groups are made in step order
  std::vector<int> members(view.shard_group().size());
  std::iota(members.begin(), members.end(), 0);
  auto group = view.shard_group().subgroup(members, "muon" + std::to_string(made++));
  groups_.emplace_back(model.model, group);
  return *group;
}

void Muon::Impl::step(Muon& self, const std::vector<Stepped>& stepped, MuonWork& work) {
  torch::NoGradGuard no_grad;
  const std::vector<ModelParams> models = every_sharded_model();
  std::vector<std::vector<Stepped>> by_model(models.size());
  for (size_t i = 0; i < stepped.size(); ++i) {
    const Stepped& s = stepped[i];
    size_t m = 0;
    while (m < models.size() && !models[m].by_impl.count(s.param.unsafeGetTensorImpl())) ++m;
    if (m < models.size()) {
      by_model[m].push_back(s);
      continue;
    }
    // Outside every sharded model: torch.optim.Muon's step, whole.
    check_matrix(s.param.sizes().vec(), "parameter #" + std::to_string(i) + " stepped now");
    const at::Tensor orthogonal = orthogonalize(momentum_update(self, s), *s.options);
    apply_update(s, orthogonal, s.param.sizes().vec());
    work.matrices += 1;
    work.flops += muon::iteration_flops(s.param.sizes().vec(), s.options->ns_steps());
    work.names.push_back("#" + std::to_string(i));
  }
  for (size_t m = 0; m < models.size(); ++m) step_model(self, models[m], by_model[m], work);
}

void Muon::Impl::step_model(Muon& self, const ModelParams& model, const std::vector<Stepped>& stepped,
                            MuonWork& work) {
  // Every matrix of this model that Muon steps, in the model's order: owners are chosen over all
  // of them, so that they stay put from step to step.
  std::vector<const Placement*> matrices;
  std::vector<muon::MatrixCost> costs;
  for (const auto& group : self.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = model.by_impl.find(p.unsafeGetTensorImpl());
      if (it == model.by_impl.end()) continue;
      check_matrix(it->second.param.shape(), "parameter '" + it->second.param.name() + "'");
      matrices.push_back(&it->second);
    }
  }
  if (matrices.empty()) return;
  std::stable_sort(matrices.begin(), matrices.end(),
                   [](const Placement* a, const Placement* b) { return a->index < b->index; });
  std::unordered_map<const void*, size_t> position;  // in `matrices`
  for (size_t i = 0; i < matrices.size(); ++i) position[matrices[i]->param.param().unsafeGetTensorImpl()] = i;
  ProcessGroup& group = exchange_group(model);
  // The same shapes on every rank: the same owners ([Note: Muon's owners]), whatever is stepped now.
  std::vector<const Stepped*> now(matrices.size(), nullptr);
  for (const auto& s : stepped) now[position.at(s.param.unsafeGetTensorImpl())] = &s;
  for (const Placement* m : matrices) {
    costs.push_back({muon::iteration_flops(m->param.shape(), 1), static_cast<int>(m->buffer)});
  }
  const std::vector<int> owners = muon::choose_owners(costs, group.size());
  check_same_matrices_stepped(group, now, matrices);

  std::vector<muon::ExchangedMatrix> exchanged;
  std::vector<at::Tensor> pieces;
  std::vector<size_t> which;  // into `matrices`, of each exchanged matrix
  for (size_t i = 0; i < matrices.size(); ++i) {
    if (!now[i]) continue;
    hold_piece_only(model, *matrices[i]);
    pieces.push_back(momentum_update(self, *now[i]).to(at::kBFloat16).reshape(-1));
    exchanged.push_back({matrices[i]->param.shape(), matrices[i]->param.piece_numels(), owners[i]});
    which.push_back(i);
  }
  if (exchanged.empty()) return;
  const std::vector<at::Tensor> wholes = muon::gather_to_owners(group, exchanged, pieces);
  std::vector<at::Tensor> results;
  size_t k = 0;
  for (size_t e = 0; e < exchanged.size(); ++e) {
    if (exchanged[e].owner != group.rank()) continue;
    const MuonOptions& o = *now[which[e]]->options;
    results.push_back(orthogonalize(wholes.at(k++), o));
    work.matrices += 1;
    work.flops += muon::iteration_flops(exchanged[e].shape, o.ns_steps());
    work.names.push_back(matrices[which[e]]->param.name());
  }
  const std::vector<at::Tensor> mine =
      muon::scatter_from_owners(group, exchanged, results, pieces.front().options());
  for (size_t e = 0; e < exchanged.size(); ++e) apply_update(*now[which[e]], mine[e], exchanged[e].shape);
}

Muon::Muon(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, MuonOptions defaults)
    : torch::optim::Optimizer(param_groups, std::make_unique<MuonOptions>(defaults)),
      impl_(std::make_unique<Impl>()) {
  check_options(defaults);
  const std::vector<ModelParams> models = every_sharded_model();
  for (size_t g = 0; g < this->param_groups().size(); ++g) {
    const auto& group = this->param_groups()[g];
    check_options(static_cast<const MuonOptions&>(group.options()));
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      std::vector<int64_t> shape = p.sizes().vec();
      std::string which = "parameter #" + std::to_string(i) + " of param group " + std::to_string(g);
      for (const auto& m : models) {
        auto it = m.by_impl.find(p.unsafeGetTensorImpl());
        if (it == m.by_impl.end()) continue;
        shape = it->second.param.shape();
        which = "parameter '" + it->second.param.name() + "'";
      }
      check_matrix(shape, which);
    }
  }
}

Muon::Muon(std::vector<at::Tensor> params, MuonOptions defaults)
    : Muon(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
           std::move(defaults)) {}

Muon::~Muon() { finish_queued_steps(); }

torch::Tensor Muon::step(LossClosure closure) {
  wait_queued_steps();
  torch::Tensor loss = fused::loss_of(closure);
  std::vector<Stepped> stepped;
  for (auto& group : param_groups()) {
    const auto* options = &static_cast<const MuonOptions&>(group.options());
    for (auto& p : group.params()) {
      if (p.grad().defined() && !stepped_in_backward(p)) stepped.push_back({p, p.grad(), options});
    }
  }
  impl_->step(*this, stepped, work_);
  forget_stepped();
  last_work_ = work_;
  work_ = {};
  return loss;
}

void Muon::step_parameters(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
  const auto grad_of = claim_gradients(params, grads);
  std::vector<Stepped> stepped;
  for (auto& group : param_groups()) {
    const auto* options = &static_cast<const MuonOptions&>(group.options());
    for (auto& p : group.params()) {
      const auto it = grad_of.find(p.unsafeGetTensorImpl());
      if (it != grad_of.end()) stepped.push_back({p, it->second, options});
    }
  }
  impl_->step(*this, stepped, work_);
}

void Muon::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<MuonParamState, MuonOptions>(archive, *this);
}

void Muon::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<MuonParamState, MuonOptions>(archive, *this);
}

}  // namespace fsdp::optim
