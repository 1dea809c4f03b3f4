"""A Llama trained by gpt_train against PyTorch FSDP2 training transformers' own LlamaForCausalLM:
a random Llama (grouped-query attention with fewer key/value heads than heads, an untied head,
Llama 3's rope scaling) saved with save_pretrained is trained for 10 steps by
`gpt_train --model llama --init-from-hf` and by bench/peer_fsdp2.py --model llama (FSDP2 over Gloo,
one unit per decoder layer) from the same folder, on the same batches (gpt_train's
--dump-batches), with the same AdamW, at W = 2 and W = 3. Their losses agree within the
tolerances of the GPT's peer (bench/run_bench.py's LOSS_TOLERANCE, fp32).

    llama_fsdp2_e2e.py BIN_DIR"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is made here: nothing to download

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
GPT, FSDPRUN = str(BIN / "gpt_train"), str(BIN / "fsdprun")
PEER = Path(__file__).resolve().parents[1] / "bench" / "peer_fsdp2.py"
VOCAB, SEQ, BATCH, STEPS, LR, WEIGHT_DECAY = 512, 32, 2, 10, 3e-3, 0.1
# (first step, any step), relative to the peer: bench/run_bench.py's fp32 LOSS_TOLERANCE.
TOLERANCE = (5e-5, 1e-4)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FSDP_TIMEOUT_SECONDS": "60"}
for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
    ENV.pop(name, None)


def make_model(folder):
    """A random Llama whose norms are random too (a name mistake cannot hide behind ones)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rms_norm_eps=1e-5, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 16})
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder)


def write_tokens(path):
    rng = np.random.default_rng(7)
    # A quarter of the vocabulary, so that the loss has somewhere to fall in 10 steps.
    rng.integers(0, VOCAB // 4, size=200_000, dtype=np.uint16).tofile(path)


def run(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout + r.stderr


def losses(metrics):
    return [json.loads(line)["loss"] for line in Path(metrics).read_text().splitlines()
            if "loss" in json.loads(line)]


def compare(world, tmp, folder, tokens):
    batches = tmp / f"batches-{world}.pt"
    ours = tmp / f"ours-{world}-{{rank}}.jsonl"
    run([FSDPRUN, "--nproc-per-node", world, GPT, "--model", "llama", "--init-from-hf", folder,
         "--data-tokens", tokens, "--seq", SEQ, "--batch", BATCH, "--steps", STEPS, "--lr", LR,
         "--warmup-steps", 0, "--weight-decay", WEIGHT_DECAY, "--seed", 5,
         "--dump-batches", batches, "--metrics", ours])
    peer = tmp / f"peer-{world}-{{rank}}.jsonl"
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", world,
         "--log-dir", tmp / f"torchrun-{world}", PEER, "--model", "llama", "--init-from", folder,
         "--batches", batches, "--seq", SEQ, "--batch", BATCH, "--steps", STEPS, "--lr", LR,
         "--weight-decay", WEIGHT_DECAY, "--fused", "--metrics", peer])
    a, b = losses(str(ours).replace("{rank}", "0")), losses(str(peer).replace("{rank}", "0"))
    assert len(a) == len(b) == STEPS, f"W = {world}: {len(a)} and {len(b)} steps, expected {STEPS}"
    worst = 0.0
    for step, (x, y) in enumerate(zip(a, b)):
        relative = abs(x - y) / abs(y)
        worst = max(worst, relative)
        bound = TOLERANCE[0] if step == 0 else TOLERANCE[1]
        assert relative <= bound, (f"W = {world}, step {step}: gpt_train's loss {x} vs FSDP2's {y} "
                                   f"(relative {relative:.2e} > {bound:.0e})")
    assert a[-1] < a[0], f"W = {world}: the loss did not fall over {STEPS} steps: {a}"
    print(f"W = {world}: {STEPS} steps, losses {a[0]:.4f} -> {a[-1]:.4f}, worst relative difference "
          f"to FSDP2 {worst:.2e}")


def main():
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="llama_fsdp2_") as tmp:
        tmp = Path(tmp)
        folder, tokens = tmp / "llama", tmp / "tokens.bin"
        make_model(folder)
        write_tokens(tokens)
        for world in (2, 3):
            compare(world, tmp, folder, tokens)
    print("llama_fsdp2_e2e: ok")


if __name__ == "__main__":
    main()
