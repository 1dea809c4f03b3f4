// Tied weights across stages: found, made equal, their gradients summed over their pp ranks
// ([Note: tied weights across stages]).
#include "pp/tied_weights.h"

#include "comm/point_to_point.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/utils.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fsdp::pp {

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
      const at::Tensor& tensor = stage.named_parameters()[tied.name];
      if (!seen.insert(tensor.unsafeGetTensorImpl()).second) continue;
      std::set<int> ranks;
      for (int s : tied.stages) ranks.insert(rank_of.at(static_cast<size_t>(s)));
      if (ranks.size() < 2) continue;  // every holder on this rank: autograd sums it already
      ties_.push_back({tied.names.front(), tensor, std::vector<int>(ranks.begin(), ranks.end())});
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

void TiedWeights::make_equal(ProcessGroup& pp) {
  torch::NoGradGuard no_grad;
  std::vector<PendingSend> sends;
  for (const Tie& tie : ties_) {
    const int source = tie.ranks.front();
    if (source != rank_) {
      recv_from(pp, tie.tensor, source, tag_of(tie, source));
      continue;
    }
    for (int peer : tie.ranks) {
      if (peer != rank_) sends.push_back(send_to(pp, tie.tensor, peer, tag_of(tie, peer)));
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
void TiedWeights::set_aside_gradients() {
  kept_.clear();
  for (const Tie& tie : ties_) {
    kept_.push_back(tie.tensor.grad());
    tie.tensor.mutable_grad() = at::Tensor();
  }
}

void TiedWeights::sum_gradients(ProcessGroup& pp) {
  torch::NoGradGuard no_grad;
  std::vector<PendingSend> sends;
  std::vector<at::Tensor> own;
  for (const Tie& tie : ties_) {
    own.push_back(tie.tensor.grad().defined() ? tie.tensor.grad().clone() : at::zeros_like(tie.tensor));
    for (int peer : tie.ranks) {
      if (peer != rank_) sends.push_back(send_to(pp, own.back(), peer, tag_of(tie, peer)));
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
    const at::Tensor kept = t < kept_.size() ? kept_[t] : at::Tensor();
    if (kept.defined()) {
      tie.tensor.mutable_grad() = kept.add_(total);
    } else if (tie.tensor.grad().defined()) {
      tie.tensor.mutable_grad().copy_(total);
    } else {
      tie.tensor.mutable_grad() = total;
    }
  }
  kept_.clear();
  for (PendingSend& send : sends) send.wait();
}

}  // namespace fsdp::pp
