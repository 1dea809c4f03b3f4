// fsdp::optim::Muon's step: the element-wise parts (momentum, Nesterov, weight decay, the update)
// on each rank's pieces, the Newton-Schulz iteration on whole matrices at their owners
// ([Note: Muon's owners]), the pieces moved by two all-to-alls (optim/muon_exchange.h), and a
// tensor-parallel matrix's parts by two more over its tp group ([Note: Muon on a tensor-parallel
// matrix]).
#include <fsdp/muon.h>

#include "core/sharded_view.h"
#include "device/device.h"
#include "optim/fused_step.h"
#include "optim/muon_checks.h"
#include "optim/muon_exchange.h"
#include "optim/muon_models.h"
#include "optim/muon_owners.h"
#include "optim/muon_phases.h"
#include "optim/muon_tensor_parallel.h"
#include "optim/newton_schulz.h"
#include "util/trace.h"

#include <fsdp/parallelize.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>
#include <mutex>
#include <numeric>
#include <unordered_map>

namespace fsdp::optim {
namespace {

using muon::check_matrix;
using muon::hold_piece_only;
using muon::Located;
using muon::ModelParams;

// One parameter to step now, with its gradient and its param group's options.
struct Stepped {
  at::Tensor param, grad;
  const MuonOptions* options;
};

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

// The owners of a model's matrices ([Note: Muon's owners]): from the whole shapes, which every
// rank (every tp rank too) sees alike, so every rank chooses the same.
muon::StepOwners owners_of(const std::vector<const Located*>& matrices, int shard_group_size) {
  std::vector<muon::MatrixCost> costs;
  int tp_size = 1;
  for (const Located* m : matrices) {
    costs.push_back({muon::iteration_flops(m->whole_shape(), 1), static_cast<int>(m->buffer), m->split()});
    if (m->split()) tp_size = m->param.tensor_parallel()->tp->size();
  }
  return muon::choose_step_owners(costs, shard_group_size, tp_size);
}

// The step's highest point on this rank, as [Note: Muon's step in phases] counts it.
void record_workspace(const std::vector<const Located*>& which, const std::vector<muon::ExchangedMatrix>& exchanged,
                      const std::vector<int>& tp_owners, int me, MuonWork& work) {
  std::vector<muon::MatrixShare> shares;
  for (size_t e = 0; e < which.size(); ++e) {
    const Located& m = *which[e];
    const std::vector<int64_t> whole = m.whole_shape();
    const int tp_rank = m.split() ? m.param.tensor_parallel()->tp->rank() : -1;
    shares.push_back({m.param.name(), whole.at(0), whole.at(1), c10::multiply_integers(m.param.shape()),
                      exchanged[e].piece_numels.at(me),
                      m.split(), exchanged[e].owner == me, m.split() && tp_owners[e] == tp_rank});
  }
  const muon::StepPhase top = muon::highest(muon::step_phases(shares));
  if (top.bytes > work.workspace_bytes) {
    work.workspace_bytes = top.bytes;
    work.workspace_at = top.at;
  }
}

at::Tensor orthogonalize(const at::Tensor& update, const MuonOptions& o) {
  return muon::orthogonalize(update, o.ns_coefficients(), o.ns_steps(), o.eps());
}

const std::string kTraceLabel = "muon";  // the step's phases in a --trace

}  // namespace

class Muon::Impl {
 public:
  explicit Impl(std::vector<ModelParams> models) : models_(std::move(models)) {}
  const std::vector<ModelParams>& models() const { return models_; }
  // Steps `stepped`: parameters outside every sharded model whole, here; each sharded model's
  // matrices at their owners. Every rank of a shard group calls it with the same parameters.
  void step(Muon& self, const std::vector<Stepped>& stepped, MuonWork& work);

 private:
  void step_model(Muon& self, const ModelParams& model, const std::vector<Stepped>& stepped, MuonWork& work);
  // Where Muon's exchanges over `base` (a model's shard group or its tp group) run: a group of
  // its own beside `base`, so that an exchange during backward (StepInBackward, on the
  // optimizer's thread) never interleaves with the model's collectives, and the device seam's
  // collectives over it for the pieces' device. `model` keeps `base` alive.
  struct Exchange {
    const ProcessGroup* base;
    c10::Device device;
    ShardedModel model;
    std::shared_ptr<ProcessGroup> own_group;  // none for a group of one
    ProcessGroup* group;
    std::unique_ptr<DeviceRuntime> runtime;
    std::unique_ptr<Collectives> collectives;
  };
  Exchange& exchange(ProcessGroup& base, const ShardedModel& model, const c10::Device& device);

  std::vector<ModelParams> models_;
  std::vector<std::unique_ptr<Exchange>> exchanges_;
};

Muon::Impl::Exchange& Muon::Impl::exchange(ProcessGroup& base, const ShardedModel& model, const c10::Device& device) {
  for (const auto& known : exchanges_) {
    if (known->base == &base && known->device == device) return *known;
  }
  auto made = std::make_unique<Exchange>(Exchange{&base, device, model, nullptr, &base, make_device(device), nullptr});
  if (base.size() > 1) {
    // Named by how many `base` has had: the same sequence on each of its members, whatever other
    // groups some of them belong to (a process-wide count would differ between them).
    static std::mutex made_mutex;
    static std::map<std::string, int> serials;  // by the base group's name
    int serial = 0;
    {
      std::lock_guard<std::mutex> lock(made_mutex);
      serial = serials[base.name()]++;
    }
    std::vector<int> members(base.size());
    std::iota(members.begin(), members.end(), 0);
    made->own_group = base.subgroup(members, "muon" + std::to_string(serial));
    made->group = made->own_group.get();
  }
  made->collectives = made->runtime->collectives(*made->group);
  exchanges_.push_back(std::move(made));
  return *exchanges_.back();
}

void Muon::Impl::step(Muon& self, const std::vector<Stepped>& stepped, MuonWork& work) {
  torch::NoGradGuard no_grad;
  const std::vector<ModelParams>& models = models_;
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
  std::vector<const Located*> matrices;
  for (const auto& group : self.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = model.by_impl.find(p.unsafeGetTensorImpl());
      if (it != model.by_impl.end()) matrices.push_back(&it->second);
    }
  }
  if (matrices.empty()) return;
  std::stable_sort(matrices.begin(), matrices.end(),
                   [](const Located* a, const Located* b) { return a->index < b->index; });
  std::unordered_map<const void*, size_t> position;  // in `matrices`
  for (size_t i = 0; i < matrices.size(); ++i) position[matrices[i]->param.param().unsafeGetTensorImpl()] = i;
  // The same whole shapes on every rank (every tp rank too): the same owners ([Note: Muon's
  // owners]), whatever is stepped now.
  std::vector<const Stepped*> now(matrices.size(), nullptr);
  for (const auto& s : stepped) now[position.at(s.param.unsafeGetTensorImpl())] = &s;
  const muon::StepOwners owners = owners_of(matrices, model.view.shard_group().size());
  // Where the pieces live (a model's shards share one device: offloaded, the host).
  Exchange& shard_exchange = exchange(model.view.shard_group(), model.model, matrices.front()->param.param().device());
  {
    TraceSpan span("muon matrix check", kTraceLabel, TraceLane::Communication);
    std::vector<bool> stepped_here;
    for (const Stepped* s : now) stepped_here.push_back(s != nullptr);
    muon::check_same_matrices_stepped(*shard_exchange.group, stepped_here, matrices);
  }

  std::vector<muon::ExchangedMatrix> exchanged;
  std::vector<at::Tensor> pieces;
  std::vector<const Located*> which;  // each exchanged matrix's
  std::vector<int> tp_owners;         // each exchanged matrix's, in its tp group
  {
    TraceSpan span("muon momentum", kTraceLabel, TraceLane::Compute);
    for (size_t i = 0; i < matrices.size(); ++i) {
      if (!now[i]) continue;
      hold_piece_only(model, *matrices[i]);
      pieces.push_back(momentum_update(self, *now[i]).to(at::kBFloat16).reshape(-1));
      exchanged.push_back({matrices[i]->param.shape(), matrices[i]->param.piece_numels(), owners.shard[i]});
      which.push_back(matrices[i]);
      tp_owners.push_back(owners.tp[i]);
    }
  }
  if (exchanged.empty()) return;
  Collectives& group = *shard_exchange.collectives;
  record_workspace(which, exchanged, tp_owners, group.rank(), work);
  std::vector<const Stepped*> stepped_now;
  for (const Located* m : which) stepped_now.push_back(now[position.at(m->param.param().unsafeGetTensorImpl())]);
  const auto orthogonalized_here = [&](const at::Tensor& whole, size_t e) {
    const MuonOptions& o = *stepped_now[e]->options;
    work.matrices += 1;
    work.flops += muon::iteration_flops(which[e]->whole_shape(), o.ns_steps());
    work.names.push_back(which[e]->param.name());
    TraceSpan span("muon orthogonalize", kTraceLabel, TraceLane::Compute);
    return orthogonalize(whole, o);
  };
  // This rank's part of each matrix it owns in its shard group, whole over FSDP.
  const std::vector<at::Tensor> parts = [&] {
    TraceSpan span("muon all-to-all to the owners", kTraceLabel, TraceLane::Communication);
    return muon::gather_to_owners(group, exchanged, pieces);
  }();
  std::vector<at::Tensor> results(parts.size());
  std::vector<size_t> split, split_exchanged;  // into `parts` and `exchanged`
  std::vector<at::Tensor> split_parts;
  std::vector<tp::Placement> split_placements;
  std::vector<int> split_owners;
  size_t k = 0;
  for (size_t e = 0; e < exchanged.size(); ++e) {
    if (exchanged[e].owner != group.rank()) continue;
    if (which[e]->split()) {
      split.push_back(k);
      split_exchanged.push_back(e);
      split_parts.push_back(parts[k]);
      split_placements.push_back(*which[e]->param.tensor_parallel());
      split_owners.push_back(tp_owners[e]);
    } else {
      results[k] = orthogonalized_here(parts[k], e);
    }
    ++k;
  }
  // The same split matrices on every member of this rank's tp group ([Note: Muon on a
  // tensor-parallel matrix]): all of them make the group and exchange, or none.
  if (!split_placements.empty()) {
    Collectives& tp_group =
        *exchange(split_placements.front().tp->group(), model.model, pieces.front().device()).collectives;
    const std::vector<at::Tensor> split_results = muon::orthogonalize_split(
        tp_group, split_parts, split_placements, split_owners,
        [&](const at::Tensor& whole, size_t i) { return orthogonalized_here(whole, split_exchanged[i]); });
    for (size_t i = 0; i < split.size(); ++i) results[split[i]] = split_results[i];
  }
  const std::vector<at::Tensor> mine = [&] {
    TraceSpan span("muon all-to-all from the owners", kTraceLabel, TraceLane::Communication);
    return muon::scatter_from_owners(group, exchanged, results, pieces.front().options());
  }();
  TraceSpan apply_span("muon apply", kTraceLabel, TraceLane::Compute);
  for (size_t e = 0; e < exchanged.size(); ++e) apply_update(*stepped_now[e], mine[e], which[e]->whole_shape());
}

namespace {

std::vector<at::Tensor> every_param(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  std::vector<at::Tensor> params;
  for (const auto& group : groups) params.insert(params.end(), group.params().begin(), group.params().end());
  return params;
}

// A parameter split by parallelize_module but outside every sharded model has no record of its
// placement for Muon to assemble the whole matrix from: stepping its part alone is wrong.
void check_not_split_alone(const at::Tensor& param, const std::string& which) {
  const auto placement = tp::placement_of(param);
  TORCH_CHECK(!placement || placement->replicated() || placement->tp->size() == 1, "fsdp::optim::Muon: ",
              which, " is split over ", placement ? placement->tp->size() : 0, " tensor-parallel ranks "
              "(parallelize_module) but belongs to no model fully_shard has sharded, so Muon cannot put "
              "the whole matrix together; shard the model with fully_shard over its data-parallel group "
              "(a group of one rank will do) before making the optimizer");
}

}  // namespace

Muon::Muon(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, MuonOptions defaults)
    : torch::optim::Optimizer(param_groups, std::make_unique<MuonOptions>(defaults)),
      impl_(std::make_unique<Impl>(muon::models_of(every_param(param_groups)))) {
  defaults.validate();
  for (size_t g = 0; g < this->param_groups().size(); ++g) {
    const auto& group = this->param_groups()[g];
    static_cast<const MuonOptions&>(group.options()).validate();
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      std::vector<int64_t> shape = p.sizes().vec();
      std::string which = "parameter #" + std::to_string(i) + " of param group " + std::to_string(g);
      bool sharded = false;
      for (const auto& m : impl_->models()) {
        auto it = m.by_impl.find(p.unsafeGetTensorImpl());
        if (it == m.by_impl.end()) continue;
        shape = it->second.whole_shape();
        which = "parameter '" + it->second.param.name() + "'";
        sharded = true;
      }
      if (!sharded) check_not_split_alone(p, which);
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
  for (const auto& group : param_groups()) static_cast<const MuonOptions&>(group.options()).validate();
}

}  // namespace fsdp::optim
