// Tensor parallelism's collectives as autograd functions (tensor_parallel.h): each forward's
// collective has the matching one as its backward, Megatron-LM's f/g operators and their
// sequence-parallel forms.
#include <fsdp/tensor_parallel.h>

#include "comm/collectives.h"
#include "device/device.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

namespace fsdp::tp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t wrapped_dim(const at::Tensor& x, int64_t dim) { return dim < 0 ? dim + x.dim() : dim; }

// The group travels through the autograd context as an address: the layers that call these keep
// it alive for as long as their graphs.
void save(AutogradContext* ctx, TensorParallel* tp, int64_t dim = 0) {
  ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
  ctx->saved_data["dim"] = dim;
}
TensorParallel& tp_of(AutogradContext* ctx) {
  return *reinterpret_cast<TensorParallel*>(ctx->saved_data["tp"].toInt());
}
int64_t dim_of(AutogradContext* ctx) { return ctx->saved_data["dim"].toInt(); }

at::Tensor summed(TensorParallel& tp, const at::Tensor& t) {
  at::Tensor out = t.contiguous().clone();
  tp.all_reduce_(out);
  return out;
}

struct CopyTo : torch::autograd::Function<CopyTo> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, TensorParallel* tp) {
    save(ctx, tp);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {summed(tp_of(ctx), g[0]), at::Tensor()};
  }
};

struct Reduce : torch::autograd::Function<Reduce> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, TensorParallel* tp) { return summed(*tp, x); }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], at::Tensor()}; }
};

struct GatherAlong : torch::autograd::Function<GatherAlong> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, TensorParallel* tp, int64_t dim) {
    save(ctx, tp, dim);
    return tp->all_gather_along(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {tp_of(ctx).reduce_scatter_along(g[0], dim_of(ctx)), at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterAlong : torch::autograd::Function<ReduceScatterAlong> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, TensorParallel* tp, int64_t dim) {
    save(ctx, tp, dim);
    return tp->reduce_scatter_along(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {tp_of(ctx).all_gather_along(g[0], dim_of(ctx)), at::Tensor(), at::Tensor()};
  }
};

struct ChunkAlong : torch::autograd::Function<ChunkAlong> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, TensorParallel* tp, int64_t dim) {
    save(ctx, tp, dim);
    return tp->chunk_along(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {tp_of(ctx).all_gather_along(g[0], dim_of(ctx)), at::Tensor(), at::Tensor()};
  }
};

struct GatherLast : torch::autograd::Function<GatherLast> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, TensorParallel* tp) {
    const int64_t dim = x.dim() - 1;
    save(ctx, tp, dim);
    return tp->all_gather_along(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {tp_of(ctx).chunk_along(g[0], dim_of(ctx)), at::Tensor()};
  }
};

}  // namespace

TensorParallel::TensorParallel(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {
  TORCH_CHECK(group_, "TensorParallel: no process group");
}

TensorParallel::~TensorParallel() = default;

Collectives& TensorParallel::collectives_for(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& entry = by_device_[t.device()];
  if (!entry.second) {
    entry.first = make_device(t.device());
    entry.second = entry.first->collectives(*group_);
  }
  return *entry.second;
}

void TensorParallel::all_reduce_(const at::Tensor& t) {
  if (size() == 1) return;
  TORCH_CHECK(t.is_contiguous(), "TensorParallel::all_reduce_ needs a contiguous tensor");
  TensorParallelCounting counting;
  collectives_for(t).all_reduce_sum(t.view(-1));
}

at::Tensor TensorParallel::all_gather_along(const at::Tensor& x, int64_t dim) {
  dim = wrapped_dim(x, dim);
  if (size() == 1) return x;
  const at::Tensor local = x.contiguous();
  const int64_t n = local.numel();
  at::Tensor full = at::empty({size() * n}, local.options());
  at::Tensor mine = full.narrow(0, rank() * n, n);
  mine.copy_(local.view(-1));
  {
    TensorParallelCounting counting;
    collectives_for(full).all_gather(full, mine);
  }
  std::vector<int64_t> stacked{size()};
  stacked.insert(stacked.end(), local.sizes().begin(), local.sizes().end());
  // [size, ..., d, ...] -> [..., size, d, ...] -> [..., size·d, ...]: rank r's chunk at r·d.
  return full.view(stacked).movedim(0, dim).flatten(dim, dim + 1).contiguous();
}

at::Tensor TensorParallel::reduce_scatter_along(const at::Tensor& x, int64_t dim) {
  dim = wrapped_dim(x, dim);
  if (size() == 1) return x;
  const int64_t d = x.size(dim);
  TORCH_CHECK(d % size() == 0, "tensor parallelism: dimension ", dim, " of size ", d,
              " does not split over ", size(), " ranks (the sequence length must be a multiple "
              "of the tensor-parallel size)");
  std::vector<int64_t> split(x.sizes().begin(), x.sizes().end());
  split[dim] = d / size();
  split.insert(split.begin() + dim, size());
  // [..., size, d/size, ...] -> [size, ..., d/size, ...]: each rank's chunk contiguous.
  at::Tensor full = x.reshape(split).movedim(dim, 0).contiguous().view(-1);
  const int64_t n = full.numel() / size();
  at::Tensor shard = at::empty({n}, full.options());
  {
    TensorParallelCounting counting;
    collectives_for(full).reduce_scatter_sum(shard, full);
  }
  split.erase(split.begin() + dim);
  return shard.view(split);
}

at::Tensor TensorParallel::chunk_along(const at::Tensor& x, int64_t dim) const {
  dim = wrapped_dim(x, dim);
  const int64_t d = x.size(dim);
  TORCH_CHECK(d % size() == 0, "tensor parallelism: dimension ", dim, " of size ", d,
              " does not split over ", size(), " ranks");
  return x.narrow(dim, rank() * (d / size()), d / size()).contiguous();
}

at::Tensor TensorParallel::copy_to(const at::Tensor& x) {
  return size() == 1 ? x : CopyTo::apply(x, this);
}

at::Tensor TensorParallel::reduce(const at::Tensor& x) {
  return size() == 1 ? x : Reduce::apply(x, this);
}

at::Tensor TensorParallel::gather_sequence(const at::Tensor& x, int64_t dim) {
  return size() == 1 ? x : GatherAlong::apply(x, this, wrapped_dim(x, dim));
}

at::Tensor TensorParallel::reduce_scatter_sequence(const at::Tensor& x, int64_t dim) {
  return size() == 1 ? x : ReduceScatterAlong::apply(x, this, wrapped_dim(x, dim));
}

at::Tensor TensorParallel::sequence_chunk(const at::Tensor& x, int64_t dim) {
  return size() == 1 ? x : ChunkAlong::apply(x, this, wrapped_dim(x, dim));
}

at::Tensor TensorParallel::gather_last(const at::Tensor& x) {
  return size() == 1 ? x : GatherLast::apply(x, this);
}

}  // namespace fsdp::tp
