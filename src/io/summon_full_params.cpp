// SummonFullParams: every parameter pointed at its whole value for a while, then back at its shard.
#include <fsdp/summon_full_params.h>

#include <fsdp/error_text.h>

#include "core/model_collectives.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <iostream>

namespace fsdp::detail {

// [Note: holding the full parameters]
// The engine points a parameter's data at its piece of the shard (1-D) or, while its unit runs, at
// the unsharded buffer. The scope gathers each unit's shard into a buffer of its own, in the
// shard's dtype (full precision under mixed precision), and points every parameter at its place
// in it; what the parameter pointed at before is kept and restored on exit, so the engine finds
// its units exactly as it left them. Units only run as plain calls meanwhile (holds_full_params).
struct HeldFullParams {
  struct Param {
    FlatParam* flat;
    FlatEntry* entry;
    at::Tensor before;  // the parameter's data before the scope: a view of its shard
    at::Tensor whole;   // its whole value, a view of `gathered`
  };
  FsdpState* state = nullptr;
  std::vector<at::Tensor> gathered;  // one unsharded buffer per flat parameter
  std::vector<Param> params;
};

namespace {

// The scope starts from the shards: a unit a forward left unsharded (an evaluation under grad
// mode) is resharded first, so that edits written back reach its next forward
// ([Note: resharding between steps]); a unit in its backward is refused.
void reshard_between_steps(FsdpState& state) {
  TORCH_CHECK(!state.full_params_held(), "SummonFullParams: this model's full parameters are held "
              "already; scopes do not nest");
  for (const auto& group : state.units()) {
    TORCH_CHECK(group->reshard_unless_in_backward(), "SummonFullParams: unit '",
                group->name().empty() ? "<root>" : group->name(), "' is in its backward; build "
                "the scope between steps");
  }
}

void point_at(at::Tensor& param, const at::Tensor& data) {
  torch::NoGradGuard no_grad;
  param.set_data(data);
}

}  // namespace

std::shared_ptr<HeldFullParams> hold_full_params(FsdpState& state) {
  reshard_between_steps(state);
  torch::NoGradGuard no_grad;
  auto held = std::make_shared<HeldFullParams>();
  held->state = &state;
  for (FlatParam* flat_param : state.flat_params()) {
    FlatParam& flat = *flat_param;
    at::Tensor full = gather_flat(state, flat, flat.shard().to(state.compute_device()));
    for (auto& e : flat.entries()) {
      held->params.push_back({&flat, &e, e.param.variable_data(), e.in_full(full)});
    }
    held->gathered.push_back(std::move(full));
  }
  for (auto& p : held->params) point_at(p.entry->param, p.whole);
  state.set_full_params_held(true);
  return held;
}

void release_full_params(HeldFullParams& held, bool writeback) noexcept {
  torch::NoGradGuard no_grad;
  if (writeback) {
    try {
      for (auto& p : held.params) {
        if (p.entry->outside_shard()) continue;
        p.entry->in_shard(p.flat->shard()).copy_(p.flat->local_piece(*p.entry, p.whole));
      }
    } catch (const std::exception& e) {
      std::cerr << "fsdp::SummonFullParams: writing the parameters back into the shards failed ("
                << message_of(e) << "); some shards may keep the values they had before the scope\n";
    }
  }
  for (auto& p : held.params) point_at(p.entry->param, p.before);
  held.gathered.clear();
  held.state->set_full_params_held(false);
}

}  // namespace fsdp::detail
