#include "core/sharded_view.h"

#include "core/fsdp_state.h"
#include "core/model_collectives.h"
#include "core/sharded_model.h"

#include <algorithm>
#include <unordered_map>

namespace fsdp::detail {

const std::string& ShardedParam::name() const { return entry_->name; }
const at::Tensor& ShardedParam::param() const { return entry_->param; }
const std::vector<int64_t>& ShardedParam::shape() const { return entry_->shape; }
const std::optional<tp::Placement>& ShardedParam::tensor_parallel() const { return entry_->tensor_parallel; }
int64_t ShardedParam::begin() const { return flat_->local_range(*entry_).first; }
int64_t ShardedParam::end() const { return flat_->local_range(*entry_).second; }

at::Tensor ShardedParam::data() const { return entry_->in_shard(flat_->shard()); }

at::Tensor ShardedParam::in_shard(const at::Tensor& shard_like) const {
  return entry_->in_shard(shard_like);
}

at::Tensor ShardedParam::in_whole(const at::Tensor& gathered) const {
  return entry_->in_full(gathered);
}

at::Tensor ShardedParam::piece_of(const at::Tensor& whole) const {
  return flat_->local_piece(*entry_, whole);
}

std::vector<int64_t> ShardedParam::piece_numels() const {
  const int positions = flat_->shard_group_size();
  const int64_t shard = flat_->shard_numel();
  std::vector<int64_t> numels(positions, 0);
  for (int r = 0; r < positions; ++r) {
    const int64_t begin = std::clamp(entry_->offset, r * shard, (r + 1) * shard);
    const int64_t end = std::clamp(entry_->offset + entry_->numel, r * shard, (r + 1) * shard);
    numels[r] = end - begin;
  }
  return numels;
}

ShardedBuffer::ShardedBuffer(FsdpState& state, ParamGroup& unit, FlatParam& flat)
    : state_(&state), unit_(&unit), flat_(&flat) {
  for (const auto& entry : flat.entries()) params_.push_back(ShardedParam(flat, entry));
}

const at::Tensor& ShardedBuffer::shard() const { return flat_->shard(); }

at::Tensor ShardedBuffer::gather_whole(const at::Tensor& shard_like) const {
  return gather_flat(*state_, *flat_, shard_like);
}

const std::string& ShardedBuffer::unit_name() const { return unit_->name(); }

bool ShardedBuffer::reshard_unless_in_backward() const { return unit_->reshard_unless_in_backward(); }

bool ShardedBuffer::holds_shard_only() const {
  return !flat_->sharded() || unit_->sharded_state() == ShardedState::Sharded;
}

// A buffer per flat parameter of each unit ([Note: a unit's flat parameters]).
ShardedView::ShardedView(const ShardedModel& model) : state_(&engine_of(model)) {
  for (const auto& unit : state_->units()) {
    for (FlatGroup& g : unit->flats()) buffers_.push_back(ShardedBuffer(*state_, *unit, g.flat));
  }
}

std::vector<ShardedParam> ShardedView::params() const {
  std::vector<ShardedParam> all;
  for (const auto& buffer : buffers_) all.insert(all.end(), buffer.params().begin(), buffer.params().end());
  return all;
}

ProcessGroup& ShardedView::world() const { return state_->world(); }
ProcessGroup& ShardedView::shard_group() const { return state_->shard_group(); }
int ShardedView::shard_rank() const { return state_->collectives().rank(); }
int ShardedView::shard_group_size() const { return state_->collectives().size(); }

bool ShardedView::first_replica() const {
  const Collectives* replicas = state_->replicate_collectives();
  return replicas == nullptr || replicas->rank() == 0;
}

const FullyShardOptions& ShardedView::options() const { return state_->options(); }
c10::Device ShardedView::compute_device() const { return state_->compute_device(); }

void ShardedView::all_reduce_over_shard_group(const at::Tensor& t) const {
  detail::all_reduce_over_shard_group(*state_, t);
}

bool ShardedView::full_params_held() const { return state_->full_params_held(); }
void ShardedView::set_full_params_held(bool held) const { state_->set_full_params_held(held); }

void ShardedView::set_gradients_reduced_hook(GradientsReducedHook hook) const {
  state_->set_gradients_reduced_hook(std::move(hook));
}

std::vector<ShardedModel> models_holding(const std::vector<at::Tensor>& params) {
  std::unordered_map<const c10::TensorImpl*, size_t> first_of;  // a parameter's place in `params`
  for (size_t i = 0; i < params.size(); ++i) first_of.emplace(params[i].unsafeGetTensorImpl(), i);
  std::vector<std::pair<size_t, ShardedModel>> found;
  for (auto& model : sharded_models()) {
    size_t first = params.size();
    for (const auto& p : ShardedView(model).params()) {
      const auto it = first_of.find(p.param().unsafeGetTensorImpl());
      if (it != first_of.end()) first = std::min(first, it->second);
    }
    if (first < params.size()) found.emplace_back(first, std::move(model));
  }
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ShardedModel> models;
  for (auto& [first, model] : found) models.push_back(std::move(model));
  return models;
}

}  // namespace fsdp::detail
