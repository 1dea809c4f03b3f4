// Tied weights across stages: found, made equal, their gradients summed over their pp ranks
// ([Note: tied weights across stages]).
#include "pp/tied_weights.h"

#include "comm/point_to_point.h"
#include "core/sharded_view.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/utils.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fsdp::pp {

// [Note: a tie across sharded stages]
// A sharded stage's copy of a tied weight is its piece of the stage's flat gradient shard, and
// each stage lays out its pieces differently (wte among stage 0's parameters, head among the last
// stage's). So the sum runs on whole tensors, after the step's reductions (the stage's
// ReduceScatter, which the runner issues after its last backward, or W under ZBV): each holding
// stage puts its piece of the reduced gradient into a zero tensor of the weight's shape and sums
// it over its shard group (the pieces do not overlap: each element counted once; replicas hold
// equal pieces), so every dp rank has its stage's whole gradient; the pp ranks of the same dp
// coordinate then add theirs as for an unsharded tie, in pp rank order, and each writes its piece
// of the sum back. The gradient shards are in the parameters' dtype (fp32 under a bf16 policy):
// the sum is too. Deadlock-free under every schedule: it runs once the step's actions are done,
// the shard-group sums of every tie first, in name order on every rank of a stage, then the
// point-to-point exchange. The values at construction are made equal the same way. The cost: one
// all-reduce of the weight over dp besides the exchange (summing the kept unsharded gradients
// before the reduce-scatter would save it, at the price of reaching into the hold's buffers).
// Two sharded stages of one rank holding the tie would flatten one tensor twice: refused.

namespace {

// Above every activation and gradient tag of the step's messages (4 per micro-batch per boundary).
constexpr int kTiedTagBase = 1 << 24;

// Every name of every tensor registered under more than one, in the model's order.
std::map<const c10::TensorImpl*, std::vector<const ParameterPlace*>> names_of_tensors(
    const std::vector<ParameterPlace>& places) {
  std::map<const c10::TensorImpl*, std::vector<const ParameterPlace*>> out;
  for (const ParameterPlace& place : places) out[place.tensor.unsafeGetTensorImpl()].push_back(&place);
  return out;
}

// [Note: a tie across sharded stages]: two holders on one rank are one tensor, which two FSDP units
// cannot both flatten.
void check_one_holder_per_rank_if_sharded(const Stage& stage, const TiedParameter& tied,
                                          const std::vector<int>& rank_of) {
  if (!stage.is_sharded()) return;
  const int here = rank_of.at(static_cast<size_t>(stage.index()));
  for (int s : tied.stages) {
    TORCH_CHECK(s == stage.index() || rank_of.at(static_cast<size_t>(s)) != here, "pipeline: stage ",
                stage.index(), " is sharded (Stage::fully_shard) and holds '", tied.name, "', a weight tied to "
                "stage ", s, " on the same pp rank: two sharded stages of one rank cannot both flatten the one "
                "tensor; use a schedule that puts them on different ranks (OneFOneB, GPipe, Interleaved1F1B), "
                "untie the weight, or leave the stages unsharded");
  }
}

// The piece of a sharded stage's tied weight, found by the stage's name for it.
detail::ShardedParam sharded_param_named(const ShardedModel& model, const std::string& name) {
  for (const detail::ShardedParam& p : detail::ShardedView(model).params()) {
    if (p.name() == name) return p;
  }
  TORCH_CHECK(false, "pipeline: the sharded stage holds no parameter '", name, "' of its tie");
}

}  // namespace

std::vector<TiedParameter> ties_of_stage(const std::vector<ParameterPlace>& places, int index) {
  std::vector<TiedParameter> out;
  for (const auto& [impl, holders] : names_of_tensors(places)) {
    std::set<int> stages;
    for (const ParameterPlace* place : holders) stages.insert(place->stage);
    if (stages.size() < 2 || stages.count(index) == 0) continue;  // untied, or tied inside one stage
    TiedParameter tie;
    for (const ParameterPlace* place : holders) tie.names.push_back(place->name);
    tie.stages.assign(stages.begin(), stages.end());
    for (const ParameterPlace* place : holders) {
      if (place->stage != index) continue;
      tie.name = place->name;
      out.push_back(tie);
    }
  }
  std::sort(out.begin(), out.end(), [](const TiedParameter& a, const TiedParameter& b) { return a.name < b.name; });
  return out;
}

TiedWeights::TiedWeights(const std::vector<Stage>& local_stages, const std::vector<int>& rank_of, int rank)
    : rank_(rank) {
  std::set<const c10::TensorImpl*> seen;
  for (const Stage& stage : local_stages) {
    for (const TiedParameter& tied : stage.tied_parameters()) {
      check_one_holder_per_rank_if_sharded(stage, tied, rank_of);
      const at::Tensor& tensor = stage.named_parameters()[tied.name];
      if (!seen.insert(tensor.unsafeGetTensorImpl()).second) continue;
      std::set<int> ranks;
      for (int s : tied.stages) ranks.insert(rank_of.at(static_cast<size_t>(s)));
      if (ranks.size() < 2) continue;  // every holder on this rank: autograd sums it already
      std::optional<ShardedModel> sharded;
      if (stage.is_sharded()) sharded = stage.sharded_model();
      ties_.push_back({tied.names.front(), tensor, std::vector<int>(ranks.begin(), ranks.end()), tied.name, sharded});
    }
  }
  std::sort(ties_.begin(), ties_.end(), [](const Tie& a, const Tie& b) { return a.name < b.name; });
}

std::vector<const TiedWeights::Tie*> TiedWeights::shared_with(int peer) const {
  std::vector<const Tie*> out;
  for (const Tie& tie : ties_) {
    if (std::find(tie.ranks.begin(), tie.ranks.end(), peer) != tie.ranks.end()) out.push_back(&tie);
  }
  return out;
}

int TiedWeights::tag_of(const Tie& tie, int peer) const {
  const std::vector<const Tie*> shared = shared_with(peer);
  return kTiedTagBase + static_cast<int>(std::find(shared.begin(), shared.end(), &tie) - shared.begin());
}

at::Tensor TiedWeights::whole_of(const Tie& tie, const at::Tensor& local) {
  if (!tie.sharded) return local;
  const detail::ShardedParam p = sharded_param_named(*tie.sharded, tie.stage_name);
  const detail::ShardedView view(*tie.sharded);
  at::Tensor whole = at::zeros(p.shape(), local.options().device(view.compute_device()));
  p.piece_of(whole).copy_(local.reshape({-1}));
  view.all_reduce_over_shard_group(whole);
  return whole;
}

void TiedWeights::write_piece(const Tie& tie, const at::Tensor& whole, const at::Tensor& local) {
  if (!tie.sharded) {
    if (!local.is_same(whole)) local.copy_(whole);
    return;
  }
  const detail::ShardedParam p = sharded_param_named(*tie.sharded, tie.stage_name);
  local.copy_(p.piece_of(whole).view(local.sizes()));
}

void TiedWeights::make_equal(ProcessGroup& pp) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> wholes;  // every shard-group sum before any point-to-point
  for (const Tie& tie : ties_) wholes.push_back(whole_of(tie, tie.tensor));
  std::vector<PendingSend> sends;
  for (size_t t = 0; t < ties_.size(); ++t) {
    const Tie& tie = ties_[t];
    const int source = tie.ranks.front();
    if (source != rank_) {
      recv_from(pp, wholes[t], source, tag_of(tie, source));
      write_piece(tie, wholes[t], tie.tensor);
      continue;
    }
    for (int peer : tie.ranks) {
      if (peer != rank_) sends.push_back(send_to(pp, wholes[t], peer, tag_of(tie, peer)));
    }
  }
  for (PendingSend& send : sends) send.wait();
}

// [Note: a tied weight's gradient accumulated over steps]
// Gradient accumulation calls step() several times before the optimizer steps. After a step each
// holder's gradient is the sum over every holder; summing the holders' whole gradients again
// after the next step would count the earlier steps once per holder. So each step sets the
// gradient aside first, its backward computes this step's alone, the holders sum that, and the
// kept gradient (equal on every holder) gets the sum added: bitwise equal copies still.
// A sharded stage's copy is a view of its gradient shard, which the step's reduction adds into:
// it stays, a copy is set aside, and the step's own gradient is what the shard gained.
void TiedWeights::set_aside_gradients() {
  kept_.clear();
  for (const Tie& tie : ties_) {
    if (tie.sharded) {
      kept_.push_back(tie.tensor.grad().defined() ? tie.tensor.grad().clone() : at::Tensor());
      continue;
    }
    kept_.push_back(tie.tensor.grad());
    tie.tensor.mutable_grad() = at::Tensor();
  }
}

at::Tensor TiedWeights::kept_of(size_t tie) const { return tie < kept_.size() ? kept_[tie] : at::Tensor(); }

void TiedWeights::sum_gradients(ProcessGroup& pp) {
  torch::NoGradGuard no_grad;
  std::vector<PendingSend> sends;
  std::vector<at::Tensor> own;
  for (size_t t = 0; t < ties_.size(); ++t) {
    const Tie& tie = ties_[t];
    at::Tensor grad = tie.tensor.grad().defined() ? tie.tensor.grad() : at::zeros_like(tie.tensor);
    if (tie.sharded && kept_of(t).defined()) grad = grad - kept_of(t);  // this step's alone
    own.push_back(tie.sharded ? whole_of(tie, grad) : grad.clone());
  }
  for (size_t t = 0; t < ties_.size(); ++t) {
    const Tie& tie = ties_[t];
    for (int peer : tie.ranks) {
      if (peer != rank_) sends.push_back(send_to(pp, own[t], peer, tag_of(tie, peer)));
    }
  }
  for (size_t t = 0; t < ties_.size(); ++t) {
    const Tie& tie = ties_[t];
    at::Tensor total;
    for (int holder : tie.ranks) {
      at::Tensor part = own[t];
      if (holder != rank_) {
        part = at::empty_like(own[t]);
        recv_from(pp, part, holder, tag_of(tie, holder));
      }
      total = total.defined() ? total + part : part.clone();
    }
    const at::Tensor kept = kept_of(t);
    if (kept.defined() && !tie.sharded) {
      tie.tensor.mutable_grad() = kept.add_(total);
    } else if (tie.tensor.grad().defined()) {
      write_piece(tie, total, tie.tensor.grad());
      if (kept.defined()) tie.tensor.grad().add_(kept);
    } else {
      TORCH_CHECK(!tie.sharded, "pipeline: '", tie.name, "' of a sharded stage has no gradient after the step");
      tie.tensor.mutable_grad() = total;
    }
  }
  kept_.clear();
  for (PendingSend& send : sends) send.wait();
}

}  // namespace fsdp::pp
