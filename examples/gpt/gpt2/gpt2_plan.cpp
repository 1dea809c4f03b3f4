// The GPT-2's blocks described to the planner (gpt_plan.cpp's describe_gpt): what each computes
// and keeps for backward, counted op by op from gpt2.cpp, and minGPT's (the paper's model).
#include "gpt2/gpt2_family.h"

#include "plan_counting.h"

namespace gpt {

namespace {

// [Note: GPT activations]
// What autograd keeps per sequence of T tokens (width C, H heads, vocabulary V, e bytes per
// element of the compute dtype; LayerNorm's statistics and attention's log-sum-exp in fp32):
// - a block (gpt.cpp BlockImpl::forward): ln_1's mean and rstd (2T·4) and output (TC·e, saved by
//   c_attn), c_attn's output q,k,v (3TC·e, saved by attention), attention's output (TC·e, saved
//   by c_proj; ATen's CPU flash kernel lays it out [B,T,H,d], so .contiguous() copies nothing) and
//   log-sum-exp (TH·4), the residual sum (TC·e, saved by ln_2), ln_2's statistics and output, c_fc's
//   output (4TC·e, saved by GELU), GELU's output (4TC·e, saved by c_proj) and the block's output
//   (TC·e, the next block's input): 16TC·e + 16T + 4TH. Under activation checkpointing only the
//   output stays.
// - its backward, at its highest (GELU's backward): the incoming gradient (TC·e), GELU's output's
//   gradient and its input's (4TC·e each), less GELU's output, released by c_proj's backward:
//   5TC·e; and a weight gradient of the largest matrix (4C²·e) before it is copied into the
//   unsharded gradient.
// - the root before the blocks: the embeddings' sum (TC·e), while wte's output (TC·e) exists.
// - the head: ln_f's statistics and output (TC·e), log_softmax's output (TV·4, fp32: lm_loss
//   computes the loss in fp32); while it runs, the logits (TV·e) and, below fp32, their fp32 copy
//   (TV·4). Its backward holds the loss's gradient and log_softmax's input gradient (2·TV·4) and
//   wte's gradient from the head (VC·e).
//
// minGPT's block (the paper's model) keeps more: attention's scores after softmax (HT²·e), the
// dropout mask on them (HT², bool) and dropout's output (HT²·e); dropout masks of both residual
// branches (TC each, bool); its GELU, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) in separate
// ops, keeps tanh's output, 0.5·x and 1 + tanh (4TC·e each) besides c_fc's output: 28TC·e + 2TC +
// HT²·(2e + 1) + 16T. While attention runs, the raw and masked scores exist at once (2·HT²·e);
// its backward holds two score-sized gradients (2·HT²·e) besides the 5TC·e above.
fsdp::PlanActivations min_gpt_block_activations(int64_t T, int64_t C, int64_t H, int64_t e) {
  const int64_t scores = product({H, T, T});
  fsdp::PlanActivations a;
  a.saved = sum({product({28, T, C, e}), product({2, T, C}), product({scores, 2 * e + 1}), 16 * T});
  a.checkpointed = product({T, C, e});
  a.forward_transient = product({2, scores, e});
  a.backward_transient = sum({product({2, scores, e}), product({5, T, C, e})});
  return a;
}

// On one of tp tensor-parallel ranks (sequence parallel, [Note: tensor parallelism in the plan]):
// ln_1's and ln_2's outputs are gathered along the sequence and saved whole by c_attn and c_fc
// (2TC·e); the norms' statistics, the residual sum and the block's output are the rank's
// sequence shard (T/tp tokens); q, k, v, attention's output and log-sum-exp its H/tp heads
// (C/tp channels); c_fc's and GELU's outputs its 4C/tp channels: 2TC·e + (2TC·e + 16T)/tp +
// (4TC·e + 4TH + 8TC·e)/tp. c_proj's partial sums before their reduce-scatter (forward) and the
// gathered incoming gradient (backward) are whole.
fsdp::PlanActivations block_activations(int64_t T, int64_t C, int64_t H, int64_t e, int64_t tp) {
  const int64_t Ts = T / tp, Cl = C / tp, Hl = H / tp;  // this rank's share
  fsdp::PlanActivations a;
  a.saved = sum({product({2, T, C, e}), product({2, Ts, C, e}), 16 * Ts, product({4, T, Cl, e}), product({4, T, Hl}),
                 product({8, T, Cl, e})});
  a.checkpointed = product({Ts, C, e});
  a.forward_transient = product({T, C, e});  // c_proj's output before the residual sum
  a.backward_transient = sum({product({T, C, e}), product({4, T, Cl, e}), tp > 1 ? product({Ts, C, e}) : 0});
  return a;
}

}  // namespace

void Gpt2Family::describe_block(const GPTConfig& config, int64_t e, GptCode code, int64_t tp,
                                fsdp::PlanUnit& unit) const {
  TORCH_CHECK(tp == 1 || code != GptCode::MinGpt, "--mingpt with --tp ", tp, ": minGPT's blocks are planned "
              "without tensor parallelism; drop --mingpt or use --tp 1");
  const int64_t T = config.max_seq, C = config.dim;
  const double share = 1.0 / static_cast<double>(tp);
  unit.activations = code == GptCode::MinGpt ? min_gpt_block_activations(T, C, config.heads, e)
                                             : block_activations(T, C, config.heads, e, tp);
  unit.backward_workspace = product({4, C, C, e}) / tp;
  // Products: 2·T·(3C² + C² + 4C² + 4C²); causal fused attention, half of QKᵀ and of PV: 2·T²·C
  // (minGPT computes all of both: 4·T²·C). A tp-th of each on a TP rank.
  unit.forward_flops = 24.0 * T * C * C * share;
  if (code == GptCode::MinGpt) {
    unit.forward_flops += 4.0 * T * T * C;  // scores and their product with V as plain matmuls
  } else {
    unit.forward_attention_flops = 2.0 * T * T * C * share;
  }
  unit.forward_transcendentals = 4.0 * T * C * share;  // GELU of the MLP's hidden layer
  // Other ops' traffic: two LayerNorms (2TC each), two residual sums (3TC each), the copy of
  // q, k, v for attention and of its output (4TC).
  unit.forward_memory_bytes = 14.0 * T * C * e * share;
  unit.forward_ops = 16;
}

}  // namespace gpt
