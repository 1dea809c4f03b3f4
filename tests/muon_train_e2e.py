"""gpt_train --optimizer muon (fsdp::optim::Muon on the blocks' matrices, each orthogonalized whole
by one rank; the fused AdamW on the rest) against the unsharded model trained by torch.optim.Muon +
torch.optim.AdamW in this process, on the same weights, global batches (gpt_train's
--dump-batches), split and schedule, 10 steps each; the losses agree within the tolerances of the
FSDP2 parity tests (tests/llama_fsdp2_e2e.py; bench/run_bench.py's fp32 LOSS_TOLERANCE):
- the Llama: transformers' own LlamaForCausalLM, the random Llama of llama_fsdp2_e2e.py
  (grouped-query attention, an untied head, Llama 3's rope scaling, random norms), at W = 2
  (gpt_train's Muon defaults, which must be lr 0.02 and adjust_lr_fn "original") and W = 3
  (--muon-lr 3e-3 --adjust-lr match_rms_adamw);
- GPT-2 (bench/peer_fsdp2.py's copy of gpt_train's GPT: its head tied to wte, q, k and v one
  matrix, biases) at W = 2;
- and gpt_train's checkpoints of both optimizers: GPT-2 saved at W = 2, resumed at W = 3, against
  the uninterrupted run (tests/checkpoint_e2e.py's bound); resumed by AdamW alone, refused.
The split is Keller Jordan's: Muon for the decoder blocks' 2-D weights; AdamW for the embeddings,
the head and the norms and biases (weight decay on the 2-D ones only). The schedule (linear
warm-up, then cosine decay) scales both optimizers' learning rates alike.

    muon_train_e2e.py BIN_DIR"""
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is made here: nothing to download

import torch
from transformers import LlamaForCausalLM
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import peer_fsdp2 as peer  # noqa: E402  (gpt_train's GPT-2 in PyTorch, and its loss)
# The FSDP2 parity test's model (GQA, untied head, Llama 3 rope, random norms), tokens, runner and
# fp32 tolerance (first step, any step).
from llama_fsdp2_e2e import ENV, TOLERANCE, losses, make_model, run, write_tokens  # noqa: E402

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
GPT, FSDPRUN = str(BIN / "gpt_train"), str(BIN / "fsdprun")
SEQ, BATCH, STEPS, WARMUP = 32, 2, 10, 3
ADAMW_LR, WEIGHT_DECAY = 3e-3, 0.1
# Per world size: Muon's lr and adjust_lr_fn; None: gpt_train's defaults, which must be these.
MUON = {2: (None, None), 3: (3e-3, "match_rms_adamw")}
MUON_DEFAULTS = (0.02, "original")  # Keller Jordan's recipe
GPT2_LAYERS, GPT2_DIM, GPT2_HEADS = 2, 64, 4
RESUME_TOLERANCE = 1e-4  # tests/checkpoint_e2e.py's LOSS_REL_TOL


def schedule(step):
    """gpt_train's schedule factor: linear warm-up over WARMUP steps, then cosine decay to 0.1."""
    if step < WARMUP:
        return (step + 1) / WARMUP
    progress = min(1.0, (step - WARMUP) / max(1, STEPS - WARMUP))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def split(model, blocks):
    """Keller Jordan's split, as gpt_train's: Muon for the blocks' matrices; AdamW for the rest
    (embeddings, an untied head: weight decay; norms, biases: none)."""
    matrices = [p for p in blocks.parameters() if p.dim() == 2]
    chosen = {id(p) for p in matrices}
    others = [p for p in model.parameters() if id(p) not in chosen]
    decay = [p for p in others if p.dim() >= 2]
    no_decay = [p for p in others if p.dim() < 2]
    return matrices, decay, no_decay


def llama(folder):
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    return model, model.model.layers


def gpt2(init):
    model = peer.GPT(GPT2_LAYERS, GPT2_DIM, GPT2_HEADS, SEQ)
    model.load_state_dict(torch.load(init), strict=True)
    return model, model.h


def reference_losses(model, blocks, batches, muon_lr, adjust_lr_fn):
    """The unsharded model trained by torch.optim.Muon + torch.optim.AdamW on the global batches."""
    torch.set_num_threads(1)
    model.train()
    matrices, decay, no_decay = split(model, blocks)
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
        loss = peer.lm_loss(peer.logits_of(model, data["inputs"][step]), data["targets"][step])
        loss.backward()
        muon.step()
        adamw.step()
        out.append(loss.item())
    return out


def check_losses(what, a, b):
    assert len(a) == len(b) == STEPS, f"{what}: {len(a)} and {len(b)} steps, expected {STEPS}"
    worst = 0.0
    for step, (x, y) in enumerate(zip(a, b)):
        relative = abs(x - y) / abs(y)
        worst = max(worst, relative)
        bound = TOLERANCE[0] if step == 0 else TOLERANCE[1]
        assert relative <= bound, (f"{what}, step {step}: gpt_train's loss {x} vs torch.optim.Muon + "
                                   f"AdamW's {y} (relative {relative:.2e} > {bound:.0e}); all: {a} vs {b}")
    assert a[-1] < a[0], f"{what}: the loss did not fall over {STEPS} steps: {a}"
    print(f"{what}: {STEPS} steps, losses {a[0]:.4f} -> {a[-1]:.4f}, worst relative difference to "
          f"torch.optim.Muon + AdamW {worst:.2e}")


def train(world, tmp, name, model_flags, muon_lr, adjust_lr_fn):
    """gpt_train --optimizer muon at W = world; its losses and its global batches."""
    batches = tmp / f"batches-{name}-{world}.pt"
    ours = tmp / f"ours-{name}-{world}-{{rank}}.jsonl"
    muon_flags = [] if muon_lr is None else ["--muon-lr", muon_lr, "--adjust-lr", adjust_lr_fn]
    run([FSDPRUN, "--nproc-per-node", world, GPT, *model_flags, "--seq", SEQ, "--batch", BATCH,
         "--steps", STEPS, "--lr", ADAMW_LR, "--warmup-steps", WARMUP, "--weight-decay", WEIGHT_DECAY,
         "--seed", 5, "--optimizer", "muon", *muon_flags, "--dump-batches", batches, "--metrics", ours])
    metrics = [json.loads(line) for line in Path(str(ours).replace("{rank}", "0")).read_text().splitlines()]
    # Each step sends matrices' momentum pieces to their owners and updates back: Muon ran sharded.
    assert all(m["bytes_all_to_all"] > 0 for m in metrics if "loss" in m), \
        f"{name}, W = {world}: a step without Muon's exchanges: {metrics}"
    return losses(str(ours).replace("{rank}", "0")), batches


def compare_llama(world, tmp, folder, tokens):
    muon_lr, adjust_lr_fn = MUON[world]
    a, batches = train(world, tmp, "llama", ["--model", "llama", "--init-from-hf", folder,
                                             "--data-tokens", tokens], muon_lr, adjust_lr_fn)
    muon_lr, adjust_lr_fn = (muon_lr, adjust_lr_fn) if muon_lr else MUON_DEFAULTS
    check_losses(f"Llama, W = {world} (Muon lr {muon_lr}, {adjust_lr_fn})", a,
                 reference_losses(*llama(folder), batches, muon_lr, adjust_lr_fn))


def compare_gpt2(world, tmp, text):
    """GPT-2: its head tied to wte (AdamW's), q, k and v one matrix (c_attn), biases."""
    init = tmp / "gpt2-init.pt"
    sizes = ["--layers", GPT2_LAYERS, "--dim", GPT2_DIM, "--heads", GPT2_HEADS]
    run([GPT, "--reference", "--data", text, *sizes, "--seq", SEQ, "--steps", 0, "--seed", 5,
         "--save-full", init])
    a, batches = train(world, tmp, "gpt2", ["--data", text, *sizes, "--init-from", init], None, None)
    check_losses(f"GPT-2, W = {world} (Muon's defaults)", a,
                 reference_losses(*gpt2(init), batches, *MUON_DEFAULTS))


def resume_gpt2(tmp, text):
    """Saved at W = 2 by --optimizer muon after 4 steps, resumed at W = 3 (the same global batch:
    2 x 3 rows = 3 x 2 rows): the last 4 losses equal the uninterrupted run's within the
    checkpoint tests' bound (tests/checkpoint_e2e.py's LOSS_REL_TOL: float reassociation after
    resharding). Resumed with AdamW alone, the checkpoint is refused, naming --optimizer muon."""
    common = ["--data", text, "--layers", GPT2_LAYERS, "--dim", GPT2_DIM, "--heads", GPT2_HEADS,
              "--seq", SEQ, "--lr", ADAMW_LR, "--seed", 5, "--optimizer", "muon"]  # constant lr
    whole, ckpt = tmp / "whole-{rank}.jsonl", tmp / "ckpt"
    run([FSDPRUN, "--nproc-per-node", 2, GPT, *common, "--batch", 3, "--steps", 8, "--metrics", whole])
    run([FSDPRUN, "--nproc-per-node", 2, GPT, *common, "--batch", 3, "--steps", 4, "--save-every", 4,
         "--checkpoint-dir", ckpt])
    resumed = tmp / "resumed-{rank}.jsonl"
    run([FSDPRUN, "--nproc-per-node", 3, GPT, *common, "--batch", 2, "--steps", 8, "--resume",
         "--checkpoint-dir", ckpt, "--metrics", resumed])
    a = losses(str(whole).replace("{rank}", "0"))[4:]
    b = losses(str(resumed).replace("{rank}", "0"))
    assert len(a) == len(b) == 4, f"resumed {len(b)} steps, expected 4"
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    assert worst <= RESUME_TOLERANCE, f"saved at W = 2, resumed at W = 3: losses {b} vs {a} ({worst:.2e})"
    print(f"GPT-2 saved at W = 2 with Muon + AdamW, resumed at W = 3: worst relative difference "
          f"{worst:.2e} to the uninterrupted run")
    fused = [c if c != "muon" else "fused" for c in common]
    r = subprocess.run([str(c) for c in [FSDPRUN, "--nproc-per-node", 2, GPT, *fused, "--batch", 3,
                                         "--steps", 8, "--resume", "--checkpoint-dir", ckpt]],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode != 0 and "pass --optimizer muon" in r.stdout + r.stderr, \
        f"a Muon checkpoint resumed by AdamW alone: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}"


def main():
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="llama_muon_") as tmp:
        tmp = Path(tmp)
        folder, tokens = tmp / "llama", tmp / "tokens.bin"
        make_model(folder)
        write_tokens(tokens)
        for world in (2, 3):
            compare_llama(world, tmp, folder, tokens)
        text = tmp / "text.txt"
        text.write_text(Path(peer.__file__).read_text() * 4)  # bytes to train on
        compare_gpt2(2, tmp, text)
        resume_gpt2(tmp, text)
    print("muon_train_e2e: ok")


if __name__ == "__main__":
    main()
