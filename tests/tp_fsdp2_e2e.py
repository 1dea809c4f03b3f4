"""2-D parallelism against PyTorch's own: the random Llama of llama_fsdp2_e2e.py (grouped-query
attention: 4 heads, 2 key/value heads; an untied head; vocabulary 512) saved with save_pretrained,
trained 10 steps with clipping on (--clip 1.0, checked to bind: the first step's norm is above 1) by
  - gpt_train --model llama --init-from-hf --tp 2 at W = 4: (dp, tp) = (2, 2),
  - gpt_train --model llama --init-from-hf at W = 2 (1-D FSDP, dp = 2), and
  - bench/peer_fsdp2.py --tp 2 at W = 4: transformers' LlamaForCausalLM under torchtitan's plan
    (`parallelize_module`, sequence parallelism, loss_parallel) and `fully_shard` over the dp
    dimension, (dp, tp) = (2, 2), Gloo, torch.nn.utils.clip_grad_norm_,
on the same global batches (gpt_train's --dump-batches: the --tp run's equal the 1-D run's, rows by
dp rank) with the same AdamW: both gpt_train runs' losses agree with the peer's within the FSDP2
parity tolerances (bench/run_bench.py's fp32 LOSS_TOLERANCE).

The peer itself can fail: a copy of it with the head's loss parallelism forgotten (the logits
handed to the loss as each rank's local vocabulary shard) and the peer without clipping both leave
the tolerances.

    tp_fsdp2_e2e.py BIN_DIR"""
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is made here: nothing to download

import torch
from transformers.utils import logging as hf_logging

# The FSDP2 parity test's model (GQA, untied head, Llama 3 rope, random norms), tokens, runner and
# fp32 tolerance (first step, any step).
from llama_fsdp2_e2e import TOLERANCE, losses, make_model, run, write_tokens

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
GPT, FSDPRUN = str(BIN / "gpt_train"), str(BIN / "fsdprun")
BENCH = Path(__file__).resolve().parents[1] / "bench"
SEQ, BATCH, STEPS, LR, WEIGHT_DECAY, CLIP = 32, 2, 10, 3e-3, 0.1, 1.0
DP, TP = 2, 2
TRAINING = ["--seq", SEQ, "--batch", BATCH, "--steps", STEPS, "--lr", LR, "--weight-decay", WEIGHT_DECAY]

# The head's loss parallelism forgotten: its logits come out as each rank's local vocabulary shard
# (a plain tensor), and the cross-entropy treats that shard as the whole vocabulary.
LOSS_PARALLEL_FORGOTTEN = ("""output_layouts=Shard(-1),
                                   use_local_output=False)""", """output_layouts=Shard(-1),
                                   use_local_output=True)""")


def train_ours(tmp, folder, tokens, tp):
    """gpt_train's losses (rank 0's metrics) at (dp, tp) = (DP, tp), and the batches it dumped."""
    batches, metrics = tmp / f"batches-tp{tp}.pt", tmp / f"ours-tp{tp}-{{rank}}.jsonl"
    run([FSDPRUN, "--nproc-per-node", DP * tp, GPT, "--model", "llama", "--init-from-hf", folder,
         "--tp", tp, "--data-tokens", tokens, *TRAINING, "--warmup-steps", 0, "--seed", 5,
         "--clip", CLIP, "--dump-batches", batches, "--metrics", metrics])
    return losses(str(metrics).replace("{rank}", "0")), batches


def train_peer(tmp, name, folder, batches, peer=BENCH / "peer_fsdp2.py", clip=CLIP):
    """The PyTorch peer's losses at (dp, tp) = (DP, TP), and its gradient norms before clipping."""
    metrics = tmp / f"{name}-{{rank}}.jsonl"
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", DP * TP,
         "--log-dir", tmp / f"torchrun-{name}", peer, "--model", "llama", "--init-from", folder,
         "--tp", TP, "--batches", batches, *TRAINING, "--fused", "--clip", clip, "--metrics", metrics])
    rank0 = str(metrics).replace("{rank}", "0")
    norms = [json.loads(line).get("grad_norm") for line in Path(rank0).read_text().splitlines()]
    return losses(rank0), norms


def first_difference(ours, peer):
    """(step, relative difference, bound) of the first step outside the tolerances, or None."""
    assert len(ours) == len(peer) == STEPS, f"{len(ours)} and {len(peer)} steps, expected {STEPS}"
    for step, (x, y) in enumerate(zip(ours, peer)):
        relative, bound = abs(x - y) / abs(y), TOLERANCE[0] if step == 0 else TOLERANCE[1]
        if relative > bound:
            return step, relative, bound
    return None


def worst_relative(ours, peer):
    return max(abs(x - y) / abs(y) for x, y in zip(ours, peer))


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


def check_the_peer_can_fail(tmp, folder, batches, ours):
    for name, peer, clip in (
            ("loss-parallel-forgotten", broken_peer(tmp, "loss-parallel-forgotten", *LOSS_PARALLEL_FORGOTTEN), CLIP),
            ("clip-skipped", BENCH / "peer_fsdp2.py", 0)):
        difference = first_difference(ours, train_peer(tmp, name, folder, batches, peer, clip)[0])
        assert difference is not None, f"the peer with {name} still agrees with gpt_train: the test could not fail"
        print(f"the peer with {name} differs at step {difference[0]} (relative {difference[1]:.2e} > "
              f"{difference[2]:.0e})")


def check_agreement(name, ours, peer):
    difference = first_difference(ours, peer)
    assert difference is None, (f"step {difference[0]}: {name}'s loss vs PyTorch's FSDP2 + TP at "
                                f"({DP}, {TP}): relative {difference[1]:.2e} > {difference[2]:.0e}\n"
                                f"ours {ours}\npeer {peer}")
    assert ours[-1] < ours[0], f"{name}: the loss did not fall over {STEPS} steps: {ours}"
    print(f"{name} vs PyTorch FSDP2 + TP at ({DP}, {TP}): {STEPS} steps, losses {ours[0]:.4f} -> "
          f"{ours[-1]:.4f}, worst relative difference {worst_relative(ours, peer):.2e}")


def main():
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="tp_fsdp2_") as tmp:
        tmp = Path(tmp)
        folder, tokens = tmp / "llama", tmp / "tokens.bin"
        make_model(folder)
        write_tokens(tokens)
        ours, batches = train_ours(tmp, folder, tokens, TP)
        ours_1d, batches_1d = train_ours(tmp, folder, tokens, 1)
        dumped, dumped_1d = torch.load(batches), torch.load(batches_1d)
        assert all(torch.equal(dumped[k], dumped_1d[k]) for k in ("inputs", "targets")), \
            f"gpt_train --tp {TP} at W = {DP * TP} trains on other batches than at W = {DP} without it"
        peer, norms = train_peer(tmp, "peer", folder, batches)
        assert norms[0] > CLIP, f"--clip {CLIP} does not bind (first gradient norm {norms[0]}): raise the lr"
        check_agreement(f"gpt_train --tp {TP} at W = {DP * TP}", ours, peer)
        check_agreement(f"gpt_train at W = {DP} (1-D)", ours_1d, peer)
        check_the_peer_can_fail(tmp, folder, batches, ours)
    print("tp_fsdp2_e2e: ok")


if __name__ == "__main__":
    main()
