"""2-D parallelism against PyTorch's own: the random Llama of llama_fsdp2_e2e.py (grouped-query
attention: 4 heads, 2 key/value heads; an untied head; vocabulary 512) saved with save_pretrained,
trained 10 steps with clipping on (--clip 1.0, checked to bind: the first step's norm is above 1) by
  - gpt_train --model llama --init-from-hf --tp 2 at W = 4: (dp, tp) = (2, 2),
  - gpt_train --model llama --init-from-hf at W = 2 (1-D FSDP, dp = 2), and
  - bench/peer_fsdp2.py --tp 2 at W = 4: transformers' LlamaForCausalLM under torchtitan's plan
    (`parallelize_module`, sequence parallelism, loss_parallel) and `fully_shard` over the dp
    dimension, (dp, tp) = (2, 2), Gloo, torch.nn.utils.clip_grad_norm_,
on the same global batches (gpt_train's --dump-batches: the --tp run's equal the 1-D run's, rows by
dp rank) with the same AdamW. Each gpt_train run agrees with the peer in
  - the losses, within the FSDP2 parity tolerances (bench/run_bench.py's fp32 LOSS_TOLERANCE),
  - the gradient norm before clipping, every step (NORM_TOLERANCE), and
  - the trained weights (gpt_train's --export-hf, the peer's --save-full): per tensor, the
    difference is at most WEIGHT_TOLERANCE of the peer's own change from the initial weights.
Losses alone cannot see a gradient error that AdamW's normalized step hides (a sequence-parallel
norm's gradient summed over half the tokens; clipping that counts a replicated norm twice, which
moves the norm by 1e-4): the norms and weights do (tests/tp_fsdp2_mutations.py).

The peer itself can fail: a copy of it with the head's loss parallelism forgotten (the logits
handed to the loss as each rank's local vocabulary shard) and the peer without clipping both leave
the loss tolerances.

    tp_fsdp2_e2e.py BIN_DIR"""
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is made here: nothing to download

import torch
from safetensors.torch import load_file
from transformers.utils import logging as hf_logging

# The FSDP2 parity test's model (GQA, untied head, Llama 3 rope, random norms), tokens, runner and
# fp32 tolerance (first step, any step).
from llama_fsdp2_e2e import TOLERANCE, make_model, run, write_tokens

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
GPT, FSDPRUN = str(BIN / "gpt_train"), str(BIN / "fsdprun")
BENCH = Path(__file__).resolve().parents[1] / "bench"
SEQ, BATCH, STEPS, LR, WEIGHT_DECAY, CLIP = 32, 2, 10, 3e-3, 0.1, 1.0
DP, TP = 2, 2
TRAINING = ["--seq", SEQ, "--batch", BATCH, "--steps", STEPS, "--lr", LR, "--weight-decay", WEIGHT_DECAY]
# Measured here: the norms within 1.7e-6 relative, the weights' differences within 1.2e-5 of their
# change. The mutations seen: the norm 3.5e-5 (norm gradient over half the tokens) and 9.4e-5
# (a replicated norm counted twice) apart at step 0; the weights 0.70 and 2.7e-4 of their change.
NORM_TOLERANCE, WEIGHT_TOLERANCE = 1e-5, 1e-4

# The head's loss parallelism forgotten: its logits come out as each rank's local vocabulary shard
# (a plain tensor), and the cross-entropy treats that shard as the whole vocabulary.
LOSS_PARALLEL_FORGOTTEN = ("""output_layouts=Shard(-1),
                                   use_local_output=False)""", """output_layouts=Shard(-1),
                                   use_local_output=True)""")


def metrics_of(pattern):
    """(losses, gradient norms) of rank 0's step lines."""
    lines = [json.loads(line) for line in Path(str(pattern).replace("{rank}", "0")).read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    return [s["loss"] for s in steps], [s.get("grad_norm") for s in steps]


def train_ours(tmp, folder, tokens, tp):
    """gpt_train at (dp, tp) = (DP, tp): (losses, norms, trained weights, the batches it dumped)."""
    batches, metrics, export = tmp / f"batches-tp{tp}.pt", tmp / f"ours-tp{tp}-{{rank}}.jsonl", tmp / f"export-tp{tp}"
    run([FSDPRUN, "--nproc-per-node", DP * tp, GPT, "--model", "llama", "--init-from-hf", folder,
         "--tp", tp, "--data-tokens", tokens, *TRAINING, "--warmup-steps", 0, "--seed", 5,
         "--clip", CLIP, "--dump-batches", batches, "--metrics", metrics, "--export-hf", export])
    return (*metrics_of(metrics), load_file(export / "model.safetensors"), batches)


def train_peer(tmp, name, folder, batches, peer=BENCH / "peer_fsdp2.py", clip=CLIP):
    """The PyTorch peer at (dp, tp) = (DP, TP): (losses, norms, trained weights)."""
    metrics, full = tmp / f"{name}-{{rank}}.jsonl", tmp / f"{name}-full.pt"
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", DP * TP,
         "--log-dir", tmp / f"torchrun-{name}", peer, "--model", "llama", "--init-from", folder,
         "--tp", TP, "--batches", batches, *TRAINING, "--fused", "--clip", clip, "--metrics", metrics,
         "--save-full", full])
    return (*metrics_of(metrics), torch.load(full))


def first_difference(ours, peer):
    """(step, relative difference, bound) of the first loss outside the tolerances, or None."""
    assert len(ours) == len(peer) == STEPS, f"{len(ours)} and {len(peer)} steps, expected {STEPS}"
    for step, (x, y) in enumerate(zip(ours, peer)):
        relative, bound = abs(x - y) / abs(y), TOLERANCE[0] if step == 0 else TOLERANCE[1]
        if relative > bound:
            return step, relative, bound
    return None


def worst_relative(ours, peer):
    return max(abs(x - y) / abs(y) for x, y in zip(ours, peer))


def weight_differences(ours, peer, initial):
    """{name: |ours - peer| / |peer - initial|}: each tensor's difference against its training."""
    assert set(ours) == set(peer), f"names differ: {sorted(set(ours) ^ set(peer))}"
    return {name: ((ours[name] - w).norm() / (w - initial[name]).norm()).item() for name, w in peer.items()}


def check_agreement(name, ours, peer, initial):
    (losses, norms, weights), (peer_losses, peer_norms, peer_weights) = ours, peer
    difference = first_difference(losses, peer_losses)
    assert difference is None, (f"step {difference[0]}: {name}'s loss vs PyTorch's FSDP2 + TP at "
                                f"({DP}, {TP}): relative {difference[1]:.2e} > {difference[2]:.0e}\n"
                                f"ours {losses}\npeer {peer_losses}")
    assert losses[-1] < losses[0], f"{name}: the loss did not fall over {STEPS} steps: {losses}"
    norm_difference = worst_relative(norms, peer_norms)
    assert norm_difference <= NORM_TOLERANCE, (f"{name}: the gradient norms before clipping differ from "
                                               f"PyTorch's by {norm_difference:.2e} relative > "
                                               f"{NORM_TOLERANCE:.0e}\nours {norms}\npeer {peer_norms}")
    differences = weight_differences(weights, peer_weights, initial)
    tensor = max(differences, key=differences.get)
    assert differences[tensor] <= WEIGHT_TOLERANCE, (f"{name}: the trained {tensor} differs from PyTorch's "
                                                     f"by {differences[tensor]:.2e} of its change > "
                                                     f"{WEIGHT_TOLERANCE:.0e}")
    print(f"{name} vs PyTorch FSDP2 + TP at ({DP}, {TP}): {STEPS} steps, losses {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}, worst relative difference {worst_relative(losses, peer_losses):.2e}; "
          f"gradient norms {norm_difference:.2e}; weights {differences[tensor]:.2e} of their change ({tensor})")


def broken_peer(tmp, name, original, mutated):
    """A copy of the peer (both of its files) with one line of its TP plan changed."""
    folder = tmp / name
    folder.mkdir()
    for file in ("peer_fsdp2.py", "peer_tp_plan.py"):
        shutil.copy(BENCH / file, folder / file)
    plan = folder / "peer_tp_plan.py"
    text = plan.read_text()
    assert text.count(original) == 1, f"{name}: the text to change occurs {text.count(original)} times"
    plan.write_text(text.replace(original, mutated))
    return folder / "peer_fsdp2.py"


def check_the_peer_can_fail(tmp, folder, batches, losses):
    for name, peer, clip in (
            ("loss-parallel-forgotten", broken_peer(tmp, "loss-parallel-forgotten", *LOSS_PARALLEL_FORGOTTEN), CLIP),
            ("clip-skipped", BENCH / "peer_fsdp2.py", 0)):
        difference = first_difference(losses, train_peer(tmp, name, folder, batches, peer, clip)[0])
        assert difference is not None, f"the peer with {name} still agrees with gpt_train: the test could not fail"
        print(f"the peer with {name} differs at step {difference[0]} (relative {difference[1]:.2e} > "
              f"{difference[2]:.0e})")


def main():
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="tp_fsdp2_") as tmp:
        tmp = Path(tmp)
        folder, tokens = tmp / "llama", tmp / "tokens.bin"
        make_model(folder)
        write_tokens(tokens)
        initial = load_file(folder / "model.safetensors")
        *ours, batches = train_ours(tmp, folder, tokens, TP)
        *ours_1d, batches_1d = train_ours(tmp, folder, tokens, 1)
        dumped, dumped_1d = torch.load(batches), torch.load(batches_1d)
        assert all(torch.equal(dumped[k], dumped_1d[k]) for k in ("inputs", "targets")), \
            f"gpt_train --tp {TP} at W = {DP * TP} trains on other batches than at W = {DP} without it"
        peer = train_peer(tmp, "peer", folder, batches)
        assert peer[1][0] > CLIP, f"--clip {CLIP} does not bind (first gradient norm {peer[1][0]}): raise the lr"
        check_agreement(f"gpt_train --tp {TP} at W = {DP * TP}", ours, peer, initial)
        check_agreement(f"gpt_train at W = {DP} (1-D)", ours_1d, peer, initial)
        check_the_peer_can_fail(tmp, folder, batches, ours[0])
    print("tp_fsdp2_e2e: ok")


if __name__ == "__main__":
    main()
