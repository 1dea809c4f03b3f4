"""The PyTorch peer of gpt_train --pp: the same Llama, weights and batches, split into the same
stages and run by torch.distributed.pipelining (ScheduleGPipe or Schedule1F1B), each stage sharded
with FSDP2's `fully_shard` over its data-parallel ranks, over Gloo on CPU.

Launch (from the repository root):
    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc-per-node 4 bench/peer_pipeline.py \
        --pp 2 --schedule gpipe --microbatches 4 --batch 2 --steps 8 --lr 1e-3 \
        --init-from init-hf --batches batches.pt --metrics peer-{rank}.jsonl

The model is transformers' own LlamaForCausalLM (read from the Hugging Face folder gpt_train
--export-hf writes). Stage s takes gpt_train's split (examples/gpt/pipeline_model.cpp,
`stage_modules`): the blocks in contiguous runs, the first (layers mod P) stages one more, the
embedding with the first stage, the final norm and the head with the last (torchtitan's
`module_fqns_per_model_part`). The mesh is ("pp", "dp") = (P, W / P), pp outermost, as
gpt_train's (world rank = pp rank * dp + dp rank).

The batches are gpt_train --reference --world-size W/P --grad-accum M --dump-batches's: each step
holds M x (W / P) x --batch rows, micro-batch m of dp rank d being rows [(m·dp + d)·B, +B), the
rows gpt_train --pp gives that rank's micro-batch m. The loss function is the micro-batch's mean
cross-entropy and the schedule divides the gradients by M (scale_grads, torch's default): the
gradient of the mean over the step's tokens, as gpt_train's. Metrics are peer_fsdp2.py's keys
(step, loss: the step's mean over every token, step_ms, optimizer_ms, rss_peak_bytes).
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_fsdp2 import leave_together, make_optimizer, rss_peak_bytes  # noqa: E402

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def stage_layers(layers, stages, stage):
    """gpt_train's split: the blocks of `stage` (the first layers % stages stages one more)."""
    base, extra = divmod(layers, stages)
    first = stage * base + min(stage, extra)
    return list(range(first, first + base + (1 if stage < extra else 0)))


class LlamaStage(nn.Module):
    """Stage `stage` of a LlamaForCausalLM: its decoder layers (keyed by their index in the model),
    the embedding on the first stage, the final norm and the head on the last."""

    def __init__(self, hf, stage, stages):
        super().__init__()
        self.first, self.last = stage == 0, stage == stages - 1
        self.embed_tokens = hf.model.embed_tokens if self.first else None
        ids = stage_layers(len(hf.model.layers), stages, stage)
        self.layers = nn.ModuleDict({str(i): hf.model.layers[i] for i in ids})
        self.rotary_emb = hf.model.rotary_emb
        self.norm = hf.model.norm if self.last else None
        self.lm_head = hf.lm_head if self.last else None

    def forward(self, x):
        h = self.embed_tokens(x) if self.first else x
        positions = torch.arange(h.size(1), device=h.device).unsqueeze(0)
        rotary = self.rotary_emb(h, positions)
        for layer in self.layers.values():
            # No mask: transformers' SDPA attention is then causal. Older releases return a tuple.
            out = layer(h, attention_mask=None, position_ids=positions, position_embeddings=rotary)
            h = out[0] if isinstance(out, tuple) else out
        return self.lm_head(self.norm(h)) if self.last else h


def mean_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def rank_rows(batch, step, microbatches, dp, dp_rank, rows):
    """This dp rank's micro-batches of `step`, one after the other (the schedule's chunks)."""
    return torch.cat([batch[step, (m * dp + dp_rank) * rows:(m * dp + dp_rank + 1) * rows]
                      for m in range(microbatches)])


def build_stage(args, pp_rank, dp_mesh):
    from transformers import LlamaForCausalLM
    hf = LlamaForCausalLM.from_pretrained(args.init_from, dtype=torch.float32, attn_implementation="sdpa")
    if hf.config.tie_word_embeddings:
        raise SystemExit(f"{args.init_from}: a tied head is held by the first and the last stage; "
                         "this peer (as torchtitan) splits untied models only")
    stage = LlamaStage(hf, pp_rank, args.pp)
    del hf
    if dp_mesh.size() > 1:
        fully_shard(stage, mesh=dp_mesh)  # one unit per stage, as gpt_train's sharded stage
    return stage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), required=True)
    ap.add_argument("--microbatches", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True, help="rows per micro-batch per dp rank")
    ap.add_argument("--steps", type=int, default=None, help="default: every dumped step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--init-from", required=True, help="a Hugging Face folder (gpt_train --export-hf)")
    ap.add_argument("--batches", required=True, help="gpt_train --reference --grad-accum M --dump-batches")
    ap.add_argument("--metrics", default="", help="JSON lines per step; {rank} becomes the rank")
    ap.add_argument("--fused", action="store_true", help="AdamW(fused=True), as gpt_train --optimizer fused")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.pp:
        raise SystemExit(f"--pp {args.pp} does not divide the world size {world}")
    mesh = init_device_mesh("cpu", (args.pp, world // args.pp), mesh_dim_names=("pp", "dp"))
    pp_rank, dp_rank, dp = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank(), mesh["dp"].size()

    batches = torch.load(args.batches)
    inputs_all, targets_all = batches["inputs"], batches["targets"]
    steps = inputs_all.size(0) if args.steps is None else args.steps
    if steps > inputs_all.size(0) or inputs_all.size(1) != args.microbatches * dp * args.batch:
        raise SystemExit(f"{args.batches}: shape {tuple(inputs_all.shape)} does not hold --steps {steps} "
                         f"of --microbatches {args.microbatches} x dp {dp} x --batch {args.batch} rows")

    stage_module = build_stage(args, pp_rank, mesh["dp"])
    stage = PipelineStage(stage_module, pp_rank, args.pp, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = SCHEDULES[args.schedule](stage, n_microbatches=args.microbatches, loss_fn=mean_loss)
    optimizer = make_optimizer(stage_module, args.lr, args.weight_decay, fused=args.fused)

    metrics = open(args.metrics.replace("{rank}", str(rank)), "w") if args.metrics else None
    for step in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        losses = []
        if stage_module.first:
            schedule.step(rank_rows(inputs_all, step, args.microbatches, dp, dp_rank, args.batch))
        elif stage_module.last:
            schedule.step(target=rank_rows(targets_all, step, args.microbatches, dp, dp_rank, args.batch),
                          losses=losses)
        else:
            schedule.step()
        optimizer_start = time.perf_counter()
        optimizer.step()
        optimizer_ms = (time.perf_counter() - optimizer_start) * 1000.0
        # The step's mean over every token: the last stages' micro-batch means, averaged over dp.
        loss = torch.stack(losses).mean().detach() if losses else torch.zeros(())
        dist.all_reduce(loss)
        step_ms = (time.perf_counter() - start) * 1000.0
        record = {"step": step, "loss": loss.item() / dp, "step_ms": step_ms, "optimizer_ms": optimizer_ms,
                  "rss_peak_bytes": rss_peak_bytes()}
        if metrics:
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
    if metrics:
        metrics.close()
    leave_together()


if __name__ == "__main__":
    main()
