"""torchtitan's Llama tensor-parallel plan on transformers' LlamaForCausalLM module names, for
bench/peer_fsdp2.py --tp (PyTorch's own 2-D parallelism: `parallelize_module` over the mesh's "tp"
dimension, then `fully_shard` over its "dp_shard" dimension).

The plan, sequence parallelism on (the same styles as torchtitan's parallelize_llama; the facts of
docs in the issue 52 design: embedding and head vocabulary-parallel, norms sequence-parallel,
q/k/v and gate/up column-wise, o/down row-wise with a sequence reduce-scatter):
  model.embed_tokens                 RowwiseParallel(input Replicate, output Shard(1))
  layers.i.input_layernorm,
  layers.i.post_attention_layernorm,
  model.norm                         SequenceParallel()
  layers.i.self_attn, layers.i.mlp   PrepareModuleInput: hidden states Shard(1) -> Replicate
  q_proj, k_proj, v_proj,
  gate_proj, up_proj                 ColwiseParallel()
  o_proj, down_proj                  RowwiseParallel(output Shard(1))
  lm_head                            ColwiseParallel(input Shard(1), output Shard(-1), DTensor
                                     out): the loss under torch's loss_parallel()

What transformers' Llama needs under it (why the peer calls the model as it does):
- The embedding hands the decoder layers local sequence shards ([b, s/T, C]), so LlamaModel's own
  positions (arange of the hidden states' length) would be s/T long: the caller passes
  position_ids (arange(s)) for the rotary embedding, and use_cache=False (no cache to size).
- LlamaDecoderLayer calls self_attn with keyword arguments only, so its PrepareModuleInput names
  `hidden_states` among the keyword layouts (torchtitan's block takes them positionally); the
  rotary cos/sin and the mask pass through untouched (plain tensors, replicated by construction).
- Attention runs on the local heads: q/k/v's column-wise outputs are local tensors and
  LlamaAttention views them as (b, s, -1, head_dim), so heads and key/value heads must both be
  divisible by the TP size (checked here, as the trainer refuses them).
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def check_divisible(config, tp):
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        if getattr(config, name) % tp != 0:
            raise SystemExit(f"--tp {tp}: the model's {name} ({getattr(config, name)}) is not "
                             f"divisible by it; choose a --tp that divides it")


def root_plan():
    return {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                   use_local_output=False),
    }


def decoder_layer_plan():
    return {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                        desired_input_kwarg_layouts={"hidden_states": Replicate()}),
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def parallelize_llama(model, tp_mesh):
    """Applies the plan to a LlamaForCausalLM in place (before fully_shard)."""
    check_divisible(model.config, tp_mesh.size())
    parallelize_module(model, tp_mesh, root_plan())
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, decoder_layer_plan())
    return model
