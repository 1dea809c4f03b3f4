#pragma once
// A tensor message between consecutive stages: a fixed header (dtype, rank of the shape, sizes)
// then the values, each under its own tag, so the receiver allocates what the sender sends and
// never waits on a byte count it guessed ([Note: pipeline stages and schedules]).

#include "comm/point_to_point.h"

#include <ATen/core/Tensor.h>

#include <vector>

namespace fsdp::pp {

/// Starts sending `t` to member `dst` under tags `tag` (header) and `tag` + 1 (values); both
/// sends are appended to `pending`.
void send_message(ProcessGroup& group, const at::Tensor& t, int dst, int tag, std::vector<PendingSend>& pending);
/// The tensor member `src` sent under `tag`: a new CPU tensor of the sender's shape and dtype.
at::Tensor recv_message(ProcessGroup& group, int src, int tag);

}  // namespace fsdp::pp
