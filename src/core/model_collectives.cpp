#include "core/model_collectives.h"

#include <ATen/ATen.h>

namespace fsdp::detail {

void run_on_device(FsdpState& state, CommLane lane, const std::function<void()>& collective) {
  state.device().submit(lane, collective, /*overlap_bytes=*/0).wait();
}

void all_reduce_over_shard_group(FsdpState& state, const at::Tensor& t) {
  run_on_device(state, CommLane::Reduce, [&] { state.collectives().all_reduce_sum(t); });
}

at::Tensor gather_flat(FsdpState& state, const FlatParam& flat, const at::Tensor& shard) {
  at::Tensor full = at::empty({flat.padded_numel()}, shard.options());
  run_on_device(state, CommLane::AllGather, [&] { state.collectives().all_gather(full, shard); });
  return full;
}

}  // namespace fsdp::detail
