"""A Llama trained by `gpt_train --optimizer muon` (fsdp::optim::Muon on the blocks' matrices, each
orthogonalized whole by one rank; the fused AdamW on the rest) against the unsharded
transformers LlamaForCausalLM trained by torch.optim.Muon + torch.optim.AdamW in this process:
the same random Llama (grouped-query attention, an untied head, Llama 3's rope scaling, random
norms) saved with save_pretrained, the same global batches (gpt_train's --dump-batches), the same
split (Muon: the decoder layers' 2-D weights; AdamW: the embedding, the head and the norms, with
weight decay on the 2-D ones only) and the same schedule (linear warm-up, then cosine decay,
scaling both optimizers' learning rates alike). 10 steps at W = 2 (Muon's defaults: lr 0.02,
adjust_lr_fn "original") and W = 3 (lr 3e-3, "match_rms_adamw"); the losses agree within the
tolerances of the FSDP2 parity tests (tests/llama_fsdp2_e2e.py; bench/run_bench.py's fp32
LOSS_TOLERANCE).

    llama_muon_e2e.py BIN_DIR"""
import math
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is made here: nothing to download

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM
from transformers.utils import logging as hf_logging

# The FSDP2 parity test's model (GQA, untied head, Llama 3 rope, random norms), tokens, runner and
# fp32 tolerance (first step, any step).
from llama_fsdp2_e2e import TOLERANCE, losses, make_model, run, write_tokens  # noqa: E402

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
GPT, FSDPRUN = str(BIN / "gpt_train"), str(BIN / "fsdprun")
SEQ, BATCH, STEPS, WARMUP = 32, 2, 10, 3
ADAMW_LR, WEIGHT_DECAY = 3e-3, 0.1
# Per world size: Muon's lr and adjust_lr_fn; None: gpt_train's defaults, which must be these.
MUON = {2: (None, None), 3: (3e-3, "match_rms_adamw")}
MUON_DEFAULTS = (0.02, "original")  # Keller Jordan's recipe


def schedule(step):
    """gpt_train's schedule factor: linear warm-up over WARMUP steps, then cosine decay to 0.1."""
    if step < WARMUP:
        return (step + 1) / WARMUP
    progress = min(1.0, (step - WARMUP) / max(1, STEPS - WARMUP))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def split(model):
    """Keller Jordan's split, as gpt_train's: Muon for the decoder layers' matrices; AdamW for the
    rest (embedding, head: weight decay; norms: none)."""
    matrices = [p for p in model.model.layers.parameters() if p.dim() == 2]
    chosen = {id(p) for p in matrices}
    others = [p for p in model.parameters() if id(p) not in chosen]
    decay = [p for p in others if p.dim() >= 2]
    no_decay = [p for p in others if p.dim() < 2]
    return matrices, decay, no_decay


def reference_losses(folder, batches, muon_lr, adjust_lr_fn):
    """The unsharded model trained by torch.optim.Muon + torch.optim.AdamW on the global batches."""
    torch.set_num_threads(1)
    model = LlamaForCausalLM.from_pretrained(folder)  # fp32, as saved
    model.train()
    matrices, decay, no_decay = split(model)
    muon = torch.optim.Muon(matrices, lr=muon_lr, weight_decay=WEIGHT_DECAY, adjust_lr_fn=adjust_lr_fn)
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=ADAMW_LR, betas=(0.9, 0.95), eps=1e-8, fused=True)
    data = torch.load(batches)
    out = []
    for step in range(STEPS):
        for group in muon.param_groups:
            group["lr"] = muon_lr * schedule(step)
        for group in adamw.param_groups:  # gpt_train's learning_rate: lr * (step + 1) / warm-up
            group["lr"] = (ADAMW_LR * (step + 1) / WARMUP if step < WARMUP else ADAMW_LR * schedule(step))
        muon.zero_grad()
        adamw.zero_grad()
        logits = model(data["inputs"][step]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), data["targets"][step].reshape(-1))
        loss.backward()
        muon.step()
        adamw.step()
        out.append(loss.item())
    return out


def compare(world, tmp, folder, tokens):
    batches = tmp / f"batches-{world}.pt"
    ours = tmp / f"ours-{world}-{{rank}}.jsonl"
    muon_lr, adjust_lr_fn = MUON[world]
    muon_flags = [] if muon_lr is None else ["--muon-lr", muon_lr, "--adjust-lr", adjust_lr_fn]
    run([FSDPRUN, "--nproc-per-node", world, GPT, "--model", "llama", "--init-from-hf", folder,
         "--data-tokens", tokens, "--seq", SEQ, "--batch", BATCH, "--steps", STEPS, "--lr", ADAMW_LR,
         "--warmup-steps", WARMUP, "--weight-decay", WEIGHT_DECAY, "--seed", 5,
         "--optimizer", "muon", *muon_flags, "--dump-batches", batches, "--metrics", ours])
    if muon_lr is None:
        muon_lr, adjust_lr_fn = MUON_DEFAULTS
    a = losses(str(ours).replace("{rank}", "0"))
    b = reference_losses(folder, batches, muon_lr, adjust_lr_fn)
    assert len(a) == len(b) == STEPS, f"W = {world}: {len(a)} and {len(b)} steps, expected {STEPS}"
    worst = 0.0
    for step, (x, y) in enumerate(zip(a, b)):
        relative = abs(x - y) / abs(y)
        worst = max(worst, relative)
        bound = TOLERANCE[0] if step == 0 else TOLERANCE[1]
        assert relative <= bound, (f"W = {world}, step {step}: gpt_train's loss {x} vs torch.optim.Muon + "
                                   f"AdamW's {y} (relative {relative:.2e} > {bound:.0e}); all: {a} vs {b}")
    assert a[-1] < a[0], f"W = {world}: the loss did not fall over {STEPS} steps: {a}"
    print(f"W = {world} (Muon lr {muon_lr}, {adjust_lr_fn}): {STEPS} steps, losses {a[0]:.4f} -> "
          f"{a[-1]:.4f}, worst relative difference to torch.optim.Muon + AdamW {worst:.2e}")


def main():
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="llama_muon_") as tmp:
        tmp = Path(tmp)
        folder, tokens = tmp / "llama", tmp / "tokens.bin"
        make_model(folder)
        write_tokens(tokens)
        for world in (2, 3):
            compare(world, tmp, folder, tokens)
    print("llama_muon_e2e: ok")


if __name__ == "__main__":
    main()
