"""The PyTorch FSDP2 peer of gpt_train: the same GPT, weights, batches and optimizer, sharded with
`torch.distributed.fsdp.fully_shard` (one unit per block, then the root) over Gloo on CPU, or over
NCCL on GPUs with `--device cuda` (rank r on cuda:LOCAL_RANK; bench/gpu_bench.py).

Launch (from the repository root):
    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc-per-node 2 bench/peer_fsdp2.py \
        --layers 4 --dim 128 --heads 4 --seq 128 --batch 8 --steps 20 --lr 1e-3 \
        --init-from init.pt --batches batches.pt --metrics peer-{rank}.jsonl [--device cuda]

With `--model llama` the model is transformers' own LlamaForCausalLM, read from the Hugging Face
folder gpt_train reads with --init-from-hf (one unit per decoder layer, then the root).

With `--tp N` (Llama only) the run is PyTorch's own 2-D parallelism: a DeviceMesh
("dp_shard", "tp") = (W / N, N) over Gloo (ranks of one TP group consecutive, as gpt_train's),
`parallelize_module` with torchtitan's Llama plan, sequence parallelism on (bench/peer_tp_plan.py),
then `fully_shard` of each decoder layer and the root over "dp_shard"; the loss is computed from
the vocabulary-sharded logits under `loss_parallel()`. The batches are gpt_train --tp's: (W / N) x
--batch rows a step, read by dp rank (the rows a 1-D run at W / N ranks reads), so a (2, 2) run
and a 1-D run at W = 2 train on the same global batch. The collective bytes then count FSDP2's
collectives over "dp_shard" only (DTensor's TP collectives go through the functional ops).

`--clip C` clips the global gradient norm with torch.nn.utils.clip_grad_norm_ (DTensor-aware: it
takes the norm over every mesh dimension), as gpt_train --clip; each step's metrics carry the
norm before clipping as `grad_norm`.

With `--optimizer muon` the optimizer is `torch.optim.Muon` on the blocks' matrices and the fused
AdamW on the rest (gpt_train --optimizer muon's split and options, `--muon-lr`, `--adjust-lr`).
FSDP2 hands Muon row-sharded DTensors: it runs, but its weights are not those of Muon on the
unsharded model (issue 51); bench/muon_bench.py reports it with that caveat. Every step's metrics
also carry `optimizer_ms`, the time of its `optimizer.step()`.

The GPT model mirrors examples/gpt/gpt.cpp exactly (names, pre-LN blocks, tanh-GELU, causal SDPA, head
tied to wte, LayerNorm eps 1e-5); the training step mirrors examples/gpt/step.cpp (zero_grad,
forward, cross-entropy, backward, AdamW step) and trainer.cpp (all-reduce of the loss for the
global mean), and it is timed over the same span.

`--param-dtype bf16 --reduce-dtype fp32` is gpt_train's mixed precision policy of the same flags:
`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` on every unit (fp32 sharded masters and
optimizer, bf16 all-gather and compute, fp32 reduce-scatter); the loss is computed in fp32 from the
bf16 logits, as gpt_train's.

Metrics are JSON lines with gpt_train's keys where the meaning is the same (step, loss, step_ms,
tokens_per_s, bytes_all_gather, bytes_reduce_scatter, bytes_all_reduce) and differently named keys
where it is not: PyTorch exposes no exact tensor-byte counter on CPU (gpt_train's mem_peak_bytes
comes from its own counting allocator), so memory is reported as
  rss_peak_bytes         the process's lifetime peak resident set (getrusage ru_maxrss: includes the
                         Python interpreter and libtorch), and
  rss_peak_growth_bytes  that peak minus the peak before the first step (after the model, weights
                         and batches were loaded and sharded).
On CUDA, memory is the caching allocator's, under gpt_train's keys: mem_current_bytes,
mem_peak_bytes (the peak since the step began) and mem_reserved_bytes.
Collective bytes count what FSDP2 hands to c10d, in gpt_train's convention (bytes a rank sends in a
ring algorithm: (W-1)/W of the unsharded buffer). Gloo's own reduce-scatter moves more than that.
"""

import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # fp16 would need gpt_train's gradient scaler


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = MLP(dim)

    def forward(self, x):
        y = x + self.attn(self.ln_1(x))
        return y + self.mlp(self.ln_2(y))


class GPT(nn.Module):
    def __init__(self, layers, dim, heads, max_seq, vocab_size=256):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, dim)
        self.wpe = nn.Embedding(max_seq, dim)
        self.h = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, idx):
        positions = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return torch.matmul(self.ln_f(x), self.wte.weight.t())  # head tied to wte


def build_model(args, device):
    """The model with its weights, and its blocks (one FSDP unit each, as gpt_train's)."""
    if args.model == "llama":
        from transformers import LlamaForCausalLM
        model = LlamaForCausalLM.from_pretrained(args.init_from, dtype=torch.float32,
                                                 attn_implementation="sdpa").to(device)
        return model, list(model.model.layers)
    with device:
        model = GPT(args.layers, args.dim, args.heads, args.seq)
    model.load_state_dict(torch.load(args.init_from), strict=True)
    return model, list(model.h)


def logits_of(model, inputs):
    out = model(inputs)
    return out if torch.is_tensor(out) else out.logits


def sequence_parallel_logits(model, inputs):
    """The vocabulary-sharded logits (a DTensor) of the tensor-parallel Llama: the positions are
    the whole sequence's (the decoder layers see s / T of it), no cache (peer_tp_plan.py)."""
    positions = torch.arange(inputs.size(1), device=inputs.device).unsqueeze(0)
    return model(inputs, position_ids=positions, use_cache=False).logits


def forward_backward(model, inputs, targets, tp):
    """This rank's mean loss over its rows (a plain tensor), its gradients accumulated."""
    if tp == 1:
        loss = lm_loss(logits_of(model, inputs), targets)
        loss.backward()
        return loss.detach()
    with loss_parallel():  # cross-entropy over Shard(-1) logits, and its backward, without a gather
        loss = lm_loss(sequence_parallel_logits(model, inputs), targets)
        loss.backward()
    loss = loss.detach()
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def clip_gradients(model, max_norm):
    """torch's clip_grad_norm_, the norm before clipping as a float (0: no clipping)."""
    if max_norm <= 0:
        return None
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return (norm.full_tensor() if isinstance(norm, DTensor) else norm).item()


def lm_loss(logits, targets):
    # In fp32 even when the model computes in bf16, as gpt_train's lm_loss (a no-op in fp32).
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def make_optimizer(model, lr, weight_decay, fused=False):
    """gpt_train's AdamW: weight decay on matrices and embeddings, none on norms and biases (the
    1-D parameters); fused=True: PyTorch's fused kernel (gpt_train --optimizer fused), else its
    default, the foreach implementation."""
    return make_optimizer_of(model.parameters(), lr, weight_decay, fused)


def make_optimizer_of(params, lr, weight_decay, fused=False):
    decay, no_decay = [], []
    for p in params:
        (no_decay if p.dim() < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay,
                             fused=fused or None)


def split_for_muon(model, blocks):
    """gpt_train --optimizer muon's split (Keller Jordan's recipe, fsdp::optim::split_for_muon):
    the blocks' matrices for Muon; embeddings, an untied head, norms and biases for AdamW."""
    matrices = [p for block in blocks for p in block.parameters() if p.dim() == 2]
    chosen = {id(p) for p in matrices}
    return matrices, [p for p in model.parameters() if id(p) not in chosen]


class MuonAndAdamW:
    """torch.optim.Muon on the blocks' matrices and the fused AdamW on the rest, stepped as one
    (gpt_train --optimizer muon: AdamW first, then Muon). Under FSDP2 each Muon parameter is a
    DTensor sharded by rows: torch.optim.Muon runs as it is, without a word, but its weights are
    not those of Muon on the unsharded model (issue 51; tests/muon_reference_e2e.py)."""

    def __init__(self, model, blocks, lr, muon_lr, weight_decay, adjust_lr_fn):
        matrices, others = split_for_muon(model, blocks)
        self.adamw = make_optimizer_of(others, lr, weight_decay, fused=True)
        self.muon = torch.optim.Muon(matrices, lr=muon_lr, weight_decay=weight_decay,
                                     adjust_lr_fn=adjust_lr_fn)

    def zero_grad(self):
        self.adamw.zero_grad()
        self.muon.zero_grad()

    def step(self):
        self.adamw.step()
        self.muon.step()


class CommCounter:
    """Counts the bytes FSDP2 hands to c10d, in the ring convention of gpt_train's counters."""

    def __init__(self, world):
        self.world = world
        self.all_gather = self.reduce_scatter = self.all_reduce = 0
        self._install()

    # The names FSDP2 calls, newest first: torch 2.13 has all_gather_single / reduce_scatter_single
    # (the older names forward to them); torch 2.11 has only the older ones. Wrapping one name of
    # each pair counts every collective once.
    ALL_GATHER_NAMES = ("all_gather_single", "all_gather_into_tensor")
    REDUCE_SCATTER_NAMES = ("reduce_scatter_single", "reduce_scatter_tensor")

    def _install(self):
        counter = self
        ag_name = next(n for n in self.ALL_GATHER_NAMES if hasattr(dist, n))
        rs_name = next(n for n in self.REDUCE_SCATTER_NAMES if hasattr(dist, n))
        orig_ag, orig_rs, orig_ar = getattr(dist, ag_name), getattr(dist, rs_name), dist.all_reduce

        def all_gather(output_tensor, input_tensor, *a, **kw):
            counter.all_gather += input_tensor.numel() * input_tensor.element_size() * (counter.world - 1)
            return orig_ag(output_tensor, input_tensor, *a, **kw)

        def reduce_scatter(output, input, *a, **kw):
            counter.reduce_scatter += output.numel() * output.element_size() * (counter.world - 1)
            return orig_rs(output, input, *a, **kw)

        def all_reduce(tensor, *a, **kw):
            # gpt_train counts the payload of an all-reduce (its loss all-reduce is 4 bytes).
            counter.all_reduce += tensor.numel() * tensor.element_size()
            return orig_ar(tensor, *a, **kw)

        setattr(dist, ag_name, all_gather)
        setattr(dist, rs_name, reduce_scatter)
        dist.all_reduce = all_reduce
        self.names = (ag_name, rs_name)

    def snapshot(self):
        return (self.all_gather, self.reduce_scatter, self.all_reduce)


def leave_together():
    """Ends a worker: every rank's last collective is done before any rank leaves, and then it
    leaves without tearing the process group down. Gloo's teardown aborts a process now and then
    ("terminate called without an active exception": 1 run in 10 of the W = 3 DCP test here, on
    CPUs with and without AVX-512, with destroy_process_group() after a barrier too), and nothing
    after the barrier needs the group: results are written, metrics closed."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def rss_peak_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def cuda_memory():
    """The caching allocator's statistics, in gpt_train's metrics keys."""
    return {"mem_current_bytes": torch.cuda.memory_allocated(),
            "mem_peak_bytes": torch.cuda.max_memory_allocated(),
            "mem_reserved_bytes": torch.cuda.memory_reserved()}


def save_full(model, path):
    """Rank 0 writes the trained parameters whole ({name: tensor}, torch.load), each gathered over
    every mesh dimension (a collective: every rank calls it)."""
    full = {}
    for name, p in model.named_parameters():
        whole = p.full_tensor() if isinstance(p, DTensor) else p
        full[name] = whole.detach().cpu().clone()
    if dist.get_rank() == 0:
        torch.save(full, path)


def make_meshes(device, world, tp):
    """(dp mesh, tp mesh or None): 1-D over the world, or ("dp_shard", "tp") = (W / tp, tp) with
    the ranks of one TP group consecutive (world rank = dp rank * tp + tp rank)."""
    if tp == 1:
        return init_device_mesh(device.type, (world,)), None
    if world % tp != 0:
        raise SystemExit(f"--tp {tp} does not divide the world size {world}: launch a multiple of it")
    mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp_shard", "tp"))
    return mesh["dp_shard"], mesh["tp"]


def setup_device(name):
    """The process group and this rank's device: Gloo on CPU, NCCL on cuda:LOCAL_RANK."""
    if name == "cpu":
        dist.init_process_group("gloo")
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return device


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="sequences per dp rank per step")
    ap.add_argument("--steps", type=int, default=None, help="default: every dumped step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--param-dtype", choices=DTYPES, default="fp32", help="mixed precision: compute dtype")
    ap.add_argument("--reduce-dtype", choices=DTYPES, default=None,
                    help="mixed precision: gradient reduction dtype (default: --param-dtype)")
    ap.add_argument("--model", choices=["gpt2", "llama"], default="gpt2",
                    help="llama: transformers' own LlamaForCausalLM, loaded from --init-from (a "
                         "Hugging Face folder, gpt_train --init-from-hf's)")
    ap.add_argument("--init-from", required=True,
                    help="gpt2: full params (gpt_train --save-full); llama: a Hugging Face folder")
    ap.add_argument("--batches", required=True, help="gpt_train --dump-batches output")
    ap.add_argument("--metrics", default="", help="JSON lines per step; {rank} becomes the rank")
    ap.add_argument("--log-every", type=int, default=0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--fused", action="store_true",
                    help="AdamW(fused=True), as gpt_train --optimizer fused (default: foreach)")
    ap.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw",
                    help="muon: torch.optim.Muon on the blocks' matrices and the fused AdamW on the "
                         "rest, as gpt_train --optimizer muon (FSDP2's weights then differ from "
                         "unsharded Muon's: each rank orthogonalizes its own rows)")
    ap.add_argument("--muon-lr", type=float, default=0.02, help="gpt_train's --muon-lr")
    ap.add_argument("--adjust-lr", choices=["original", "match_rms_adamw"], default="original",
                    help="torch.optim.Muon's adjust_lr_fn (gpt_train's --adjust-lr)")
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor-parallel size (Llama only): 2-D mesh (W / tp, tp), torchtitan's plan")
    ap.add_argument("--clip", type=float, default=0.0,
                    help="clip the global gradient norm to this (torch.nn.utils.clip_grad_norm_); 0: off")
    ap.add_argument("--save-full", default="",
                    help="rank 0 writes the trained parameters here, whole ({name: tensor}, torch.load)")
    args = ap.parse_args()
    if args.tp > 1 and (args.model != "llama" or args.optimizer != "adamw"):
        raise SystemExit("--tp needs --model llama and --optimizer adamw (the plan is the Llama's)")

    device = setup_device(args.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    dp_mesh, tp_mesh = make_meshes(device, world, args.tp)
    dp_size, dp_rank = dp_mesh.size(), dp_mesh.get_local_rank()
    comm = CommCounter(dp_size)  # FSDP2's collectives run over the dp mesh
    if rank == 0:
        print(f"counting FSDP2's collectives through dist.{comm.names[0]} and dist.{comm.names[1]}",
              flush=True)

    batches = torch.load(args.batches)
    inputs_all, targets_all = batches["inputs"], batches["targets"]
    steps = inputs_all.size(0) if args.steps is None else args.steps
    if steps > inputs_all.size(0):
        raise SystemExit(f"--steps {steps} but {args.batches} holds {inputs_all.size(0)} steps")
    if inputs_all.size(1) != dp_size * args.batch or inputs_all.size(2) != args.seq:
        raise SystemExit(f"{args.batches}: shape {tuple(inputs_all.shape)} does not match "
                         f"dp size {dp_size} x --batch {args.batch}, --seq {args.seq}")
    rows = slice(dp_rank * args.batch, (dp_rank + 1) * args.batch)

    model, blocks = build_model(args, device)
    if tp_mesh is not None:
        from peer_tp_plan import parallelize_llama  # the sibling file: transformers only here
        parallelize_llama(model, tp_mesh)
    param_dtype = DTYPES[args.param_dtype]
    reduce_dtype = DTYPES[args.reduce_dtype or args.param_dtype]
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    if args.optimizer == "muon":
        optimizer = MuonAndAdamW(model, blocks, args.lr, args.muon_lr, args.weight_decay, args.adjust_lr)
    else:
        optimizer = make_optimizer(model, args.lr, args.weight_decay, fused=args.fused)

    metrics = None
    if args.metrics:
        metrics = open(args.metrics.replace("{rank}", str(rank)), "w")
    global_tokens = dp_size * args.batch * args.seq
    rss_before = rss_peak_bytes()

    for step in range(steps):
        comm_before = comm.snapshot()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()

        inputs, targets = inputs_all[step, rows].to(device), targets_all[step, rows].to(device)
        optimizer.zero_grad()
        loss = forward_backward(model, inputs, targets, args.tp)
        grad_norm = clip_gradients(model, args.clip)
        optimizer_start = time.perf_counter()
        optimizer.step()
        optimizer_ms = (time.perf_counter() - optimizer_start) * 1000.0

        global_loss = loss.clone()
        dist.all_reduce(global_loss, group=dp_mesh.get_group())  # every tp rank holds the same loss
        loss_value = global_loss.item() / dp_size
        step_ms = (time.perf_counter() - start) * 1000.0

        ag, rs, ar = (now - before for now, before in zip(comm.snapshot(), comm_before))
        record = {"step": step, "loss": loss_value, "step_ms": step_ms,
                  "tokens_per_s": global_tokens / (step_ms / 1000.0),
                  "rss_peak_bytes": rss_peak_bytes(),
                  "rss_peak_growth_bytes": rss_peak_bytes() - rss_before,
                  "bytes_all_gather": ag, "bytes_reduce_scatter": rs, "bytes_all_reduce": ar,
                  "optimizer_ms": optimizer_ms}
        if grad_norm is not None:
            record["grad_norm"] = grad_norm
        if device.type == "cuda":
            record.update(cuda_memory())
        if metrics:
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
        if rank == 0 and args.log_every > 0 and ((step + 1) % args.log_every == 0 or step + 1 == steps):
            print(f"step {step + 1:5d}/{steps} | loss {loss_value:.4f} | "
                  f"{record['tokens_per_s']:8.0f} tok/s | {step_ms:6.1f} ms/step", flush=True)

    if metrics:
        metrics.close()
    if args.save_full:
        save_full(model, args.save_full)
    leave_together()


if __name__ == "__main__":
    main()
