#include "core/fsdp_state.h"

#include "launch/host_placement.h"

#include <fsdp/tensor_parallel.h>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <iostream>

namespace fsdp {

namespace {

std::vector<int> shard_group_ranks(int rank, int f) {
  std::vector<int> ranks;
  for (int r = rank / f * f; r < rank / f * f + f; ++r) ranks.push_back(r);
  return ranks;
}

std::vector<int> replicate_group_ranks(int rank, int f, int world) {
  std::vector<int> ranks;
  for (int r = rank % f; r < world; r += f) ranks.push_back(r);
  return ranks;
}

// A non-owning handle for the world group, which the caller owns.
std::shared_ptr<ProcessGroup> unowned(ProcessGroup& group) {
  return std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
}

}  // namespace

FsdpState::FsdpState(ProcessGroup& world, FullyShardOptions options, const c10::Device& device)
    : world_(world),
      options_(std::move(options)),
      limiter_(options_.limit_all_gathers()),
      conductor_(options_, *this),
      order_key_(world.next_store_key("fsdp/order")),
      device_(make_device(device)) {
  const int w = world.size(), f = options_.shard_group_size_for(w, world.settings().local_world_size);
  // Every rank creates its shard group, then its replicate group: the same sequence everywhere.
  shard_group_ = f == w ? unowned(world)
                        : world.subgroup(shard_group_ranks(world.rank(), f),
                                         world.next_store_key("shard"));
  if (f < w) {
    replicate_group_ = world.subgroup(replicate_group_ranks(world.rank(), f, w),
                                      world.next_store_key("replicate"));
    replicate_collectives_ = device_->collectives(*replicate_group_);
    const std::string warning = shard_groups_spanning_hosts(world.hosts(), f);
    if (world.rank() == 0 && !warning.empty()) std::cerr << warning << std::endl;
  }
  shard_collectives_ = device_->collectives(*shard_group_);
  unit_collectives_ = make_unit_collectives(*device_, *shard_collectives_, replicate_collectives_.get());
  unit_env_ = std::make_unique<UnitEnv>(
      UnitEnv{limiter_, conductor_, ReduceSettings{options_.mixed_precision().reduce_dtype(), w}});
}

FsdpState::~FsdpState() { device_.reset(); }

void FsdpState::pre_forward(ParamGroup& unit) {
  if (unit.is_root()) {
    check_gradient_scaling();  // before any unit releases its gradient shard
    for (auto& each : units_) each->take_in_rebound_params();  // [Note: a parameter rebound from outside]
  } else {
    check_root_is_running(unit);
    if (options_.check_execution_order() && !order_checked_) {
      check_execution_order(unit, conductor_.forward_order().size());
    }
  }
  conductor_.pre_forward(unit);
}

void FsdpState::post_forward(ParamGroup& unit, const std::vector<at::Tensor>& inputs,
                             const std::vector<at::Tensor>& outputs, bool training) {
  conductor_.post_forward(unit, training, unit.hook_backward(inputs, outputs));
}

void FsdpState::step_begins() {
  unit_collectives_->step_begins();
  finish_queued_ = false;  // a backward that threw never ran its callback
}

// Until a backward starts the shards may be written (an edit, a load, an optimizer step after
// an evaluation): a unit called meanwhile gathers in rounds.
void FsdpState::forward_ends() { unit_collectives_->forward_ends(); }

// [Note: the root is not skipped]
// A program reaches its model's forward through the root unit fully_shard returned. A helper that
// takes the model as its base holder (`void evaluate(GPTModel& model)` bound to the returned
// fsdp::Unit<GPTModel>), or keeps the shared_ptr it sharded, calls the module's forward directly:
// the root's parameters are then its 1-D shards (ATen fails on them, naming no cause) and, under
// grad mode, no end of backward is queued (the first backward leaves every gradient undefined).
// The inner units still run through their holders, so the first of them refuses, by name. A unit
// called on its own, outside the root (a decoder sampling from main) is fine when neither holds:
// without grad mode and with a root that has no parameters of its own.
void FsdpState::check_root_is_running(const ParamGroup& unit) const {
  if (conductor_.root_forward_running()) return;
  const ParamGroup& root = *units_.front();
  const bool root_has_params = std::any_of(root.flats().begin(), root.flats().end(),
                                           [](const FlatGroup& g) { return g.flat.numel() > 0; });
  if (!root_has_params && !at::GradMode::is_enabled()) return;
  TORCH_CHECK(false, "fsdp: unit '", unit.name(), "' ran outside the forward of its model's root "
              "unit", root_has_params ? ", whose own parameters are 1-D shards meanwhile" : "",
              at::GradMode::is_enabled() ? " (and under grad mode its backward could not complete)" : "",
              ". Call the model through the fsdp::Unit that fully_shard returned: a helper taking "
              "the model's holder by reference (`Net&`) or the shared_ptr that was sharded skips "
              "it; take `fsdp::Unit<Net>&` (or `auto&`), and run a method other than forward as "
              "`model.call(&NetImpl::method, args...)`");
}

void FsdpState::shards_may_change() { unit_collectives_->shards_may_change(); }

void FsdpState::backward_begins() {
  if (!finish_queued_) {
    finish_queued_ = true;
    // Queued from the root's pre-backward hook, i.e. from the outer backward: a callback queued
    // inside a nested backward (activation recomputation) would run when that one ends.
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  }
  unit_collectives_->backward_begins();  // the shards of the forward, unless something wrote them since
}

void FsdpState::gradients_reduced(ParamGroup&, FlatParam& flat, const CommHandle& reduction) {
  if (!gradients_reduced_hook_) return;
  auto [params, grads] = flat.sharded_grads();
  if (params.empty()) return;
  gradients_reduced_hook_(std::move(params), std::move(grads),
                          [handle = reduction]() mutable { handle.wait_host(); });
}

void FsdpState::check_execution_order(const ParamGroup& group, size_t index) {
  const std::string key = order_key_ + "/" + std::to_string(index) + "/";
  world_.store().set(key + std::to_string(world_.rank()),
                     std::vector<uint8_t>(group.name().begin(), group.name().end()));
  for (int other = 0; other < world_.size(); ++other) {
    if (other == world_.rank()) continue;
    std::vector<uint8_t> bytes;
    try {
      bytes = world_.store().get(key + std::to_string(other));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "fsdp: rank ", other, " never ran a unit #", index, " in its forward (rank ",
                  world_.rank(), " ran '", group.name(), "'): the ranks' execution orders differ");
    }
    const std::string theirs(bytes.begin(), bytes.end());
    TORCH_CHECK(theirs == group.name(), "fsdp: the forward execution order differs across ranks: ",
                "unit #", index, " is '", group.name(), "' on rank ", world_.rank(), " but '", theirs,
                "' on rank ", other, ". Every rank must call the units in the same order (no "
                "rank-dependent control flow around units).");
  }
}

void FsdpState::finish_backward() {
  finish_queued_ = false;
  std::vector<ScheduledUnit*> units;
  for (auto& unit : units_) units.push_back(unit.get());
  conductor_.finish_backward(units);
}

void FsdpState::backward_ends() {
  unit_collectives_->backward_ends();  // the optimizer may write the shards next
  order_checked_ = true;
  if (!groups_holding_pieces().empty()) gradient_watch_.record(watched_buffers());
}

std::vector<WatchedBuffer> FsdpState::watched_buffers() {
  std::vector<WatchedBuffer> buffers;
  for (auto& unit : units_) {
    for (FlatGroup& g : unit->flats()) buffers.push_back({&g.flat, &unit->name()});
  }
  return buffers;
}

// [Note: gradients scaled by each rank alone] (core/gradient_watch.cpp): compared over the
// groups whose ranks hold different pieces, the shard group and the tp group, which this forward
// needs anyway (replicas hold equal gradients; a rank-0-only evaluation of a NO_SHARD model must
// not wait on the others). With neither, every rank holds whole gradients: nothing to compare.
std::vector<ProcessGroup*> FsdpState::groups_holding_pieces() {
  std::vector<ProcessGroup*> groups;
  if (shard_group_->size() > 1) groups.push_back(shard_group_.get());
  for (auto& unit : units_) {
    for (const FlatGroup& g : unit->flats()) {
      for (const FlatEntry& e : g.flat.entries()) {
        if (e.tensor_parallel && e.tensor_parallel->tp->size() > 1) {
          groups.push_back(&e.tensor_parallel->tp->group());
          return groups;
        }
      }
    }
  }
  return groups;
}

void FsdpState::check_gradient_scaling() {
  const auto groups = groups_holding_pieces();
  if (groups.empty()) return;
  const bool prints = world_.rank() == 0 && (groups.back() == shard_group_.get() || groups.back()->rank() == 0);
  gradient_watch_.check(watched_buffers(), groups, compute_device(), prints);
}

}  // namespace fsdp
