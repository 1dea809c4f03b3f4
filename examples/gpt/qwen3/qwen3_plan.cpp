// The Qwen3's blocks described to the planner (gpt_plan.cpp's describe_gpt): the Llama block's
// description (llama/llama_plan.cpp's [Note: Llama activations]) and the per-head norms'; and
// its tensor-parallel plan.
#include "qwen3/qwen3_family.h"

#include "llama/llama_family.h"
#include "plan_counting.h"

namespace gpt {

// [Note: Qwen3 activations]
// A Qwen3 block is a Llama block (H query and KV key/value heads of d channels) whose q and k
// projections' outputs pass through an RMSNorm over each head (ln_q, ln_k: rms_norm.cpp, rows of
// d) before the rotation. Per sequence of T tokens each keeps, besides the Llama's:
// - in fp32 (one autograd node): its input, the projection's output, which the Llama's rotation
//   left unsaved (T·H·d·e for q, T·KV·d·e for k), and one inverse RMS per token and head (4·T·H,
//   4·T·KV);
// - below fp32 (transformers' ops): the input's fp32 copy (T·H·d·4, saved by pow and the
//   product), the normalised input cast back (T·H·d·e, saved by the weight's product) and the
//   inverse RMS; the input itself is not kept.
// On one of tp tensor-parallel ranks the norms run inside the attention, on the gathered sequence
// and the rank's H/tp and KV/tp heads: T whole, the heads this rank's. Their weights are replicated
// (tensor_parallel_plan.cpp marks every norm of the block table SequenceParallel), their gradients,
// each rank's from its heads, all-reduced over the tp ranks: d elements each, counted from that
// style (plan_tp_moves.cpp), not here.
void Qwen3Family::describe_block(const GPTConfig& config, int64_t e, GptCode code, int64_t tp,
                                 fsdp::PlanUnit& unit) const {
  llama_family().describe_block(config, e, code, tp, unit);
  const int64_t T = config.max_seq, d = config.head_size();
  const int64_t heads_here = (config.heads + config.key_value_heads()) / tp;  // query and key heads
  const int64_t per_element = e < 4 ? 4 + e : e;
  unit.activations.saved = sum({unit.activations.saved, product({T, heads_here, d, per_element}),
                                product({4, T, heads_here})});
  // In fp32 one pass each, read and write (8 bytes an element); below fp32 ~4 passes in fp32 and
  // six ops per norm, as the Llama's norms count.
  const bool one_pass = e == 4;
  const double normed = static_cast<double>(T) * static_cast<double>(heads_here * d);  // this rank's
  unit.forward_memory_bytes += (one_pass ? 8.0 : 16.0) * normed;
  unit.forward_ops += one_pass ? 2 : 12;
}

// torchtitan's Qwen3 plan: the Llama's (q, k, v, gate and up column-wise, o and down row-wise).
// ln_q and ln_k are replicated with their gradients summed: tensor_parallel_plan.cpp gives every
// norm of the block's table SequenceParallel, which keeps its weights whole on every rank and
// all-reduces their gradients in backward (each rank applies them to its own heads only).
fsdp::tp::ParallelizePlan Qwen3Family::block_parallel_plan(const GPTConfig& config) const {
  return llama_family().block_parallel_plan(config);
}

}  // namespace gpt
