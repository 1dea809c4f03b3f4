#include "core/unit_comm.h"

#include "core/unit_rules.h"

#include <ATen/ATen.h>

#include <tuple>

namespace fsdp {

std::pair<double, double> ReduceSettings::divide_factors(c10::ScalarType dtype) const {
  const int w = world_size;
  // fp32/fp64 sums of W gradients cannot overflow: one division of the (W times smaller) shard.
  if (c10::elementSize(dtype) >= 4) return {1.0, static_cast<double>(w)};
  // PyTorch FSDP's choice: double p while it divides W and p < W / p (W = 4: 2 and 2).
  int pre = 1;
  while (w % pre == 0 && w / pre > pre) pre *= 2;
  return {static_cast<double>(pre), static_cast<double>(w) / pre};
}

ReducePlan plan_reduction(const ReduceSettings& settings, c10::ScalarType grad_dtype,
                          bool full_precision, bool accumulate) {
  ReducePlan plan;
  plan.dtype = full_precision ? grad_dtype : settings.dtype_for(grad_dtype);
  std::tie(plan.pre, plan.post) = settings.divide_factors(plan.dtype);
  plan.accumulate = accumulate;
  return plan;
}

bool unsharded_is_host_shards(const FlatParam& flat) {
  return flat.sharded() && !flat.mixed_precision() && !flat.offloaded() && flat.shard().is_cpu();
}

void gather_unit(FlatParam& flat, Collectives& shard_group) {
  if (unsharded_is_host_shards(flat)) {
    // On the host, in one dtype, the collective copies the shard into its place itself (a
    // memcpy): no view of the unsharded buffer nor ATen copy per unit.
    shard_group.all_gather(flat.full(), flat.shard());
    return;
  }
  at::Tensor local = flat.shard_in_full();
  if (flat.offloaded()) {
    // [Note: offloaded copies] A copy that changes both device and dtype converts on the host,
    // into a pageable temporary, synchronously. The shard goes to the device as it is instead
    // (asynchronously: it is pinned), and is cast there.
    local.copy_(flat.shard().to(local.device(), /*non_blocking=*/true));
  } else {
    local.copy_(flat.shard());
  }
  if (flat.sharded()) shard_group.all_gather(flat.full(), local);
}

bool reduces_into_shard(FlatParam& flat, const ReducePlan& plan) {
  return rules::reduces_into_shard(plan.accumulate, plan.dtype, flat.grad_shard().scalar_type(), flat.offloaded());
}

at::Tensor gradient_to_scatter(FlatParam& flat, const ReducePlan& plan) {
  at::Tensor full_grad = flat.full_grad().scalar_type() == plan.dtype ? flat.full_grad()
                                                                      : flat.full_grad().to(plan.dtype);
  // In low precision, the mean over W ranks as a division before the sum and one after, each
  // about sqrt(W): a sum of W undivided gradients could overflow, a sum of fully divided ones
  // underflow.
  if (plan.pre != 1.0) full_grad.div_(plan.pre);
  return full_grad;
}

void reduce_unit_gradient(FlatParam& flat, const ReducePlan& plan, Collectives& shard_group,
                          Collectives* replicas) {
  at::Tensor& grad_shard = flat.grad_shard();
  const bool into_shard = reduces_into_shard(flat, plan);
  const at::Tensor full_grad = gradient_to_scatter(flat, plan);
  at::Tensor reduced = into_shard ? grad_shard : at::empty({grad_shard.numel()}, full_grad.options());
  shard_group.reduce_scatter_sum(reduced, full_grad);
  if (replicas) replicas->all_reduce_sum(reduced);
  if (plan.post != 1.0) reduced.div_(plan.post);
  if (plan.accumulate) {  // offloaded: a synchronous copy, then the sum on the host
    grad_shard.add_(reduced.to(grad_shard.device()));
  } else if (!into_shard && grad_shard.device() != reduced.device()) {
    // Offloaded ([Note: offloaded copies]): cast on the device, then copied into the pinned
    // gradient shard asynchronously; CommHandle::wait_host() is when the host may read it.
    grad_shard.copy_(reduced.to(grad_shard.scalar_type()), /*non_blocking=*/true);
  } else if (!into_shard) {
    grad_shard.copy_(reduced);
  }
}

}  // namespace fsdp
