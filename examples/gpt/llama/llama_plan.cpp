// The Llama's blocks described to the planner (gpt_plan.cpp's describe_gpt): what each computes
// and keeps for backward, counted op by op from llama.cpp, rms_norm.cpp and rotary.cpp.
#include "llama/llama_family.h"

#include "plan_counting.h"

#include <algorithm>

namespace gpt {

namespace {

// [Note: Llama activations]
// A Llama block (llama.cpp; width C, H query and KV key/value heads of d channels, SwiGLU width I)
// keeps per sequence of T tokens:
// - each RMSNorm (rms_norm.cpp): its inverse RMS per token (T·4) and its output (TC·e, saved by
//   the next matmuls); its input is the residual stream, counted below. Below fp32, op by op as
//   transformers computes it, also the normalised input cast back (TC·e, saved by the weight's
//   product) and the fp32 copy of its input (TC·4, saved by pow and the product).
// - attention: the rotated q (THd·e) and k (T·KV·d·e), v (T·KV·d·e: the projection's output,
//   viewed), all saved by the fused kernel (GQA in the kernel: no repeated copies), its output
//   (THd·e, saved by o_proj; laid out [B,T,H,d] as the GPT's) and log-sum-exp (TH·4). The
//   rotation saves only its cos and sin tables (2Td·e), made by the first forward and kept by
//   the attention between steps.
// - the residual sum (TC·e, saved by ln_2 in fp32; below fp32 ln_2 saves its fp32 copy instead)
//   and the block's output (TC·e, the next block's input).
// - SwiGLU: gate's output (saved by SiLU), SiLU's output and up's output (saved by their
//   product), the product (saved by down_proj): 4TI·e.
// fp32: 4TC·e + 2THd·e + 2T·KV·d·e + 4TI·e + 2Td·e + 8T + 4TH; below fp32 5TC·e + 2TC·4 in place
// of 4TC·e. Its backward peaks in SwiGLU's: the incoming gradient (TC·e) and two gradients of
// width I (2TI·e: each step of it releases a saved tensor of width I as it makes a gradient of
// that width, and mul's backward holds both of its gradients at once).
fsdp::PlanActivations llama_block_activations(const GPTConfig& config, int64_t e) {
  const int64_t T = config.max_seq, C = config.dim, H = config.heads, KV = config.key_value_heads();
  const int64_t d = config.head_size(), I = config.mlp_dim();
  fsdp::PlanActivations a;
  const int64_t norms_and_residuals = e < 4 ? sum({product({5, T, C, e}), product({2, T, C, 4})})
                                            : product({4, T, C, e});
  a.saved = sum({norms_and_residuals, product({2, T, H, d, e}), product({2, T, KV, d, e}),
                 product({4, T, I, e}), product({2, T, d, e}), 8 * T, product({4, T, H})});
  a.checkpointed = product({T, C, e});
  a.forward_transient = product({T, C, e});  // o_proj's (down_proj's) output before the residual sum
  a.backward_transient = sum({product({T, C, e}), product({2, T, I, e})});
  return a;
}

}  // namespace

// What a Llama block computes: its products (2 flops per multiply-add) and other ops' traffic.
void LlamaFamily::describe_block(const GPTConfig& config, int64_t e, GptCode,
                                 fsdp::PlanUnit& unit) const {
  const double T = static_cast<double>(config.max_seq), C = static_cast<double>(config.dim);
  const double q = static_cast<double>(config.heads * config.head_size());
  const double kv = static_cast<double>(config.key_value_heads() * config.head_size());
  const double I = static_cast<double>(config.mlp_dim());
  unit.activations = llama_block_activations(config, e);
  // The largest weight gradient: a SwiGLU matrix or q_proj / o_proj.
  unit.backward_workspace = product({std::max(config.mlp_dim(), config.heads * config.head_size()), config.dim, e});
  unit.forward_flops = 2.0 * T * (C * q + 2 * C * kv + q * C + 3 * C * I);
  unit.forward_attention_flops = 2.0 * T * T * q;  // causal: half of QKᵀ and of PV
  unit.forward_transcendentals = T * I;           // SiLU's exp
  // Two RMSNorms and the rotations of q and k (in fp32 one pass each, read and write: rms_norm.cpp,
  // rotary.cpp; on a GPU the fp32 rotation stays op by op, which this host-side count leaves out;
  // below fp32 ~4 passes of TC in fp32 and six ops per norm, ~6 passes and five ops per rotation),
  // two residual sums (3TC), SwiGLU's SiLU and product (5TI).
  const bool one_pass = e == 4;
  unit.forward_memory_bytes = (one_pass ? 16.0 : 32.0) * T * C +
                              (6.0 * T * C + (one_pass ? 2.0 : 6.0) * T * (q + kv) + 5.0 * T * I) * e;
  unit.forward_ops = one_pass ? 12 : 30;
}

}  // namespace gpt
