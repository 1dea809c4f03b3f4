#pragma once
/// SummonFullParams: every parameter of a sharded model whole on every rank for a while, as FSDP1's
/// summon_full_params. Inside it the model is an ordinary LibTorch module: a rank may evaluate it
/// alone (its units are plain calls, without collectives), read or edit its parameters by name,
/// or torch::save it whole.

#include <fsdp/fully_shard.h>

#include <torch/csrc/autograd/grad_mode.h>

#include <memory>

namespace fsdp {

namespace detail {
struct HeldFullParams;
/// Gathers every unit's parameters (a collective) and points each parameter at its whole value.
std::shared_ptr<HeldFullParams> hold_full_params(const ShardedModel& model);
/// Points every parameter back at its shard, after copying this rank's piece of each whole value
/// into the shard when `writeback`. Never throws: a failed writeback is reported on stderr and the
/// shards keep their values.
void release_full_params(HeldFullParams& held, bool writeback) noexcept;
}  // namespace detail

/// While it lives, every parameter of the sharded model `root` is whole (its original shape and
/// dtype, full precision under mixed precision) on every rank, and autograd is off (a
/// torch::NoGradGuard: it is for evaluation, inspection and saving, not for training). Building it
/// is a collective: every rank must build it, outside a backward (a unit that a forward left
/// unsharded, an evaluation under grad mode, is resharded first). Leaving it is not: each rank copies
/// its own piece of what each parameter holds back into its shard (`writeback`, the default: edits
/// made inside the scope are kept, in place or by pointing a parameter elsewhere with torch::load,
/// set_data or `.data =`; make the same edit on every rank) and the units are sharded again. Every
/// rank holds the whole model meanwhile. On a model that is not sharded it does nothing.
///
/// Example:
///   {
///     fsdp::SummonFullParams full(model);       // every rank
///     if (dist->rank() == 0) {
///       model->eval();
///       auto accuracy = evaluate(model, test_set);  // rank 0 alone: no collectives
///       torch::save(model, "model.pt");             // the whole model, as an unsharded program saves it
///       model->train();
///     }
///   }
class SummonFullParams {
 public:
  template <class M>
  explicit SummonFullParams(const Unit<M>& root, bool writeback = true) : writeback_(writeback) {
    if (const ShardedModel* model = root.find_sharded_model()) held_ = detail::hold_full_params(*model);
  }
  ~SummonFullParams() {
    if (held_) detail::release_full_params(*held_, writeback_);
  }
  SummonFullParams(const SummonFullParams&) = delete;
  SummonFullParams& operator=(const SummonFullParams&) = delete;

 private:
  torch::NoGradGuard no_grad_;
  bool writeback_;
  std::shared_ptr<detail::HeldFullParams> held_;
};

}  // namespace fsdp
