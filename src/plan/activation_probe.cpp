#include <fsdp/memory.h>
#include <fsdp/plan.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace fsdp {

PlanActivations measure_activations(const std::function<at::Tensor(const at::Tensor&)>& forward,
                                    const at::Tensor& input) {
  const c10::Device device = input.device();
  TORCH_CHECK(!device.is_cpu() || memory_counter_installed(),
              "measure_activations counts bytes with fsdp::memory_stats: call fsdp::install_memory_counter() "
              "first thing in main()");
  at::Tensor x = input.detach().clone();
  if (x.is_floating_point()) x.requires_grad_(true);
  const int64_t before = memory_stats(device).current_bytes;
  reset_peak_memory(device);
  at::Tensor out = forward(x);
  const MemoryStats after_forward = memory_stats(device);
  PlanActivations a;
  a.saved = after_forward.current_bytes - before;
  a.forward_transient = after_forward.peak_bytes - after_forward.current_bytes;
  a.checkpointed = static_cast<int64_t>(out.nbytes());
  reset_peak_memory(device);
  out.backward(at::ones_like(out));
  a.backward_transient = memory_stats(device).peak_bytes - after_forward.current_bytes;
  return a;
}

}  // namespace fsdp
