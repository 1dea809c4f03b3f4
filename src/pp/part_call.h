#pragma once
// A stage's part called as its model would call it ([Note: a part split by tensor parallelism]).

#include <fsdp/pipeline.h>

#include <ATen/core/Tensor.h>

namespace fsdp::pp {

// [Note: a part split by tensor parallelism]
// A stage calls its parts through torch::nn::AnyModule, which reaches the module itself: a layer
// that parallelize_module split (a vocabulary-parallel wte, a column-wise head) would skip its
// style, the communication its fsdp::tp::Parallel holder runs. So a part with a style is run
// through it, as its holder would; a part without (a block, whose layers' holders are inside its
// own forward) is called as it is. With TP, stage boundaries carry each tp rank's own activation
// (its sequence shard), sent over the pp group of its (dp, tp) coordinates: the tp peer of equal
// coordinate in the neighbour stage.
at::Tensor call_part(Part& part, at::Tensor x);

}  // namespace fsdp::pp
