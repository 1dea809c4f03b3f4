// SummonFullParams: every parameter pointed at its whole value for a while, then back at its shard.
#include <fsdp/summon_full_params.h>

#include <fsdp/error_text.h>

#include <fsdp/parallelize.h>

#include "core/sharded_view.h"
#include "util/plain_error.h"

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
//
// [Note: a tensor-parallel part shown whole]
// Under tensor parallelism FSDP's whole parameter is this rank's part; the scope gathers each
// split one over its tp group too (tp::whole_of, as save_full_params does), so that torch::save
// writes, and torch::load reads, the model an unsplit program has. On exit each rank keeps its
// own part of what the parameter holds (tp::part_of_whole) before cutting its FSDP piece.
struct HeldFullParams {
  struct Param {
    ShardedParam piece;
    at::Tensor before;  // the parameter's data before the scope: a view of its shard
    at::Tensor whole;   // its whole value: a view of `gathered`, or its tp parts gathered
  };
  explicit HeldFullParams(const ShardedModel& sharded) : model(sharded) {}
  ShardedView model;
  std::vector<at::Tensor> gathered;  // one unsharded buffer per flat parameter
  std::vector<Param> params;
};

namespace {

// The scope starts from the shards: a unit a forward left unsharded (an evaluation under grad
// mode) is resharded first, so that edits written back reach its next forward
// ([Note: resharding between steps]); a unit in its backward is refused.
void reshard_between_steps(const ShardedView& model) {
  TORCH_CHECK(!model.full_params_held(), "SummonFullParams: this model's full parameters are held "
              "already; scopes do not nest");
  for (const auto& buffer : model.buffers()) {
    TORCH_CHECK(buffer.reshard_unless_in_backward(), "SummonFullParams: unit '",
                buffer.unit_name().empty() ? "<root>" : buffer.unit_name(), "' is in its backward; "
                "build the scope between steps");
  }
}

void point_at(const at::Tensor& param, const at::Tensor& data) {
  torch::NoGradGuard no_grad;
  param.set_data(data);
}

// The whole parameter from this rank's `part` in the gathered buffer: itself (a view, so that
// edits in place are kept) unless tensor parallelism split it ([Note: a tensor-parallel part
// shown whole]); a collective over the tp group then, in the same order on its every rank.
at::Tensor shown_whole(const ShardedParam& p, const at::Tensor& part) {
  const auto& placement = p.tensor_parallel();
  if (!placement || placement->replicated()) return part;
  return tp::whole_of(part, *placement);
}

// This rank's tensor-parallel part of a whole value: what its FSDP piece is cut from.
at::Tensor own_tp_part(const ShardedParam& p, const at::Tensor& whole) {
  const auto& placement = p.tensor_parallel();
  if (!placement || placement->replicated()) return whole;
  return tp::part_of_whole(whole, *placement, placement->tp->rank());
}

}  // namespace

std::shared_ptr<HeldFullParams> hold_full_params(const ShardedModel& sharded) {
  auto held = std::make_shared<HeldFullParams>(sharded);
  const ShardedView& model = held->model;
  reshard_between_steps(model);
  torch::NoGradGuard no_grad;
  try {
    for (const auto& buffer : model.buffers()) {
      at::Tensor full = buffer.gather_whole(buffer.shard().to(model.compute_device()));
      for (const auto& p : buffer.params()) {
        held->params.push_back({p, p.param().variable_data(), shown_whole(p, p.in_whole(full))});
      }
      held->gathered.push_back(std::move(full));
    }
  } catch (const std::exception& e) {
    // Most often the scope was built on some ranks only (inside `if (rank == 0)`): said first,
    // in one line (uncaught, what() is printed whole).
    throw_plain_error("fsdp::SummonFullParams: gathering the whole model failed; every rank must build "
                      "the scope at the same point (build it before `if (rank == 0)`, not inside): " +
                      message_of(e));
  }
  for (auto& p : held->params) point_at(p.piece.param(), p.whole);
  model.set_full_params_held(true);
  return held;
}

// What the parameter holds now: its place in the gathered buffer, edited in place, or what the
// scope's code pointed it at (torch::load, set_data, `.data =`: [Note: a parameter rebound from
// outside]), which must have the parameter's shape.
at::Tensor value_at_exit(const HeldFullParams::Param& p) {
  const at::Tensor& param = p.piece.param();
  TORCH_CHECK(param.sizes() == p.whole.sizes(), "SummonFullParams: parameter '", p.piece.name(),
              "' was pointed at a tensor of shape ", param.sizes(), " inside the scope, but it is ",
              p.whole.sizes(), " in the model; it keeps the value it had before the scope");
  return param.detach();
}

void release_full_params(HeldFullParams& held, bool writeback) noexcept {
  torch::NoGradGuard no_grad;
  if (writeback) {
    try {
      std::vector<at::Tensor> values;  // every one checked before any shard is written
      for (auto& p : held.params) values.push_back(value_at_exit(p));
      for (size_t i = 0; i < held.params.size(); ++i) {
        auto& piece = held.params[i].piece;
        if (!piece.empty()) piece.data().copy_(piece.piece_of(own_tp_part(piece, values[i])));
      }
    } catch (const std::exception& e) {
      std::cerr << "fsdp::SummonFullParams: writing the parameters back into the shards failed ("
                << message_of(e) << "); every shard keeps the values it had before the scope\n";
    }
  }
  for (auto& p : held.params) point_at(p.piece.param(), p.before);
  held.gathered.clear();
  held.model.set_full_params_held(false);
}

}  // namespace fsdp::detail
