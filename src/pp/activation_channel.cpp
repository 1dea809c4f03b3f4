// Tensor messages with a shape header over c10d send/recv.
#include "pp/activation_channel.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace fsdp::pp {

namespace {

constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeaderSize = 2 + kMaxDims;  // dtype, number of dimensions, sizes

at::Tensor header_of(const at::Tensor& t) {
  TORCH_CHECK(t.dim() <= kMaxDims, "pipeline: a stage's output has ", t.dim(), " dimensions; at most ", kMaxDims,
              " cross stages (reshape it inside the stage)");
  at::Tensor header = at::zeros({kHeaderSize}, at::kLong);
  auto h = header.accessor<int64_t, 1>();
  h[0] = static_cast<int64_t>(t.scalar_type());
  h[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) h[2 + d] = t.size(d);
  return header;
}

}  // namespace

void send_message(ProcessGroup& group, const at::Tensor& t, int dst, int tag, std::vector<PendingSend>& pending) {
  pending.push_back(send_to(group, header_of(t), dst, tag));
  pending.push_back(send_to(group, t, dst, tag + 1));
}

at::Tensor recv_message(ProcessGroup& group, int src, int tag) {
  at::Tensor header = at::empty({kHeaderSize}, at::kLong);
  recv_from(group, header, src, tag);
  auto h = header.accessor<int64_t, 1>();
  TORCH_CHECK(h[1] >= 0 && h[1] <= kMaxDims && h[0] >= 0 &&
                  h[0] < static_cast<int64_t>(c10::ScalarType::NumOptions),
              "pipeline: the message from ", group.describe_member(src), " under tag ", tag,
              " is not a tensor header; the stages run different schedules or micro-batch counts");
  std::vector<int64_t> sizes(h[1]);
  for (int64_t d = 0; d < h[1]; ++d) sizes[d] = h[2 + d];
  at::Tensor values = at::empty(sizes, at::TensorOptions().dtype(static_cast<c10::ScalarType>(h[0])));
  recv_from(group, values, src, tag + 1);
  return values;
}

}  // namespace fsdp::pp
