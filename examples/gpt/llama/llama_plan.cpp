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
//
// On one of tp tensor-parallel ranks (sequence parallel, [Note: tensor parallelism in the plan]):
// the norms' outputs are gathered along the sequence and saved whole by q/k/v and gate/up (2TC·e),
// the rotation's tables are whole; the norms' other tensors, the residual sum and the block's
// output are the rank's sequence shard (T/tp tokens), attention's tensors its H/tp and KV/tp
// heads, SwiGLU's its I/tp channels. Forward's transient, o_proj's or down_proj's partial sums
// before their reduce-scatter, is whole; backward's incoming gradient is gathered whole.
fsdp::PlanActivations llama_block_activations(const GPTConfig& config, int64_t e, int64_t tp) {
  const int64_t T = config.max_seq, C = config.dim, H = config.heads, KV = config.key_value_heads();
  const int64_t d = config.head_size(), I = config.mlp_dim();
  const int64_t Ts = T / tp, Hl = H / tp, KVl = KV / tp, Il = I / tp;  // this rank's share
  fsdp::PlanActivations a;
  const int64_t gathered = product({2, T, C, e});  // the norms' outputs, whole
  const int64_t sequence_shard = e < 4 ? sum({product({3, Ts, C, e}), product({2, Ts, C, 4})})
                                       : product({2, Ts, C, e});
  a.saved = sum({gathered, sequence_shard, product({2, T, Hl, d, e}), product({2, T, KVl, d, e}),
                 product({4, T, Il, e}), product({2, T, d, e}), 8 * Ts, product({4, T, Hl})});
  a.checkpointed = product({Ts, C, e});
  a.forward_transient = product({T, C, e});  // o_proj's (down_proj's) output before the residual sum
  a.backward_transient = sum({product({T, C, e}), product({2, T, Il, e}), tp > 1 ? product({Ts, C, e}) : 0});
  return a;
}

}  // namespace

// What a Llama block computes: its products (2 flops per multiply-add) and other ops' traffic,
// a tp-th of it on each TP rank (its TP collectives: its styles', plan_tp_moves.cpp).
void LlamaFamily::describe_block(const GPTConfig& config, int64_t e, GptCode, int64_t tp,
                                 fsdp::PlanUnit& unit) const {
  const double T = static_cast<double>(config.max_seq), C = static_cast<double>(config.dim);
  const double q = static_cast<double>(config.heads * config.head_size());
  const double kv = static_cast<double>(config.key_value_heads() * config.head_size());
  const double I = static_cast<double>(config.mlp_dim());
  const double share = 1.0 / static_cast<double>(tp);
  unit.activations = llama_block_activations(config, e, tp);
  // The largest weight gradient: a SwiGLU matrix or q_proj / o_proj (its TP-local part).
  unit.backward_workspace = product({std::max(config.mlp_dim(), config.heads * config.head_size()), config.dim, e}) / tp;
  unit.forward_flops = 2.0 * T * (C * q + 2 * C * kv + q * C + 3 * C * I) * share;
  unit.forward_attention_flops = 2.0 * T * T * q * share;  // causal: half of QKᵀ and of PV
  unit.forward_transcendentals = T * I * share;           // SiLU's exp
  // Two RMSNorms and the rotations of q and k (in fp32 one pass each, read and write: rms_norm.cpp,
  // rotary.cpp; on a GPU the fp32 rotation stays op by op, which this host-side count leaves out;
  // below fp32 ~4 passes of TC in fp32 and six ops per norm, ~6 passes and five ops per rotation),
  // two residual sums (3TC), SwiGLU's SiLU and product (5TI).
  const bool one_pass = e == 4;
  unit.forward_memory_bytes = ((one_pass ? 16.0 : 32.0) * T * C +
                               (6.0 * T * C + (one_pass ? 2.0 : 6.0) * T * (q + kv) + 5.0 * T * I) * e) * share;
  unit.forward_ops = one_pass ? 12 : 30;
}

}  // namespace gpt
