#include "pp/part_call.h"

#include <fsdp/parallelize.h>

#include <utility>

namespace fsdp::pp {

at::Tensor call_part(Part& part, at::Tensor x) {
  tp::detail::LayerStyle* style = tp::detail::style_of(part.module.ptr().get());
  if (!style) return part.module.forward<at::Tensor>(std::move(x));
  return style->run(x, [&part](const at::Tensor& y) { return part.module.forward<at::Tensor>(y); });
}

}  // namespace fsdp::pp
