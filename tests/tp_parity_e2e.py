"""2-D parallelism against the unsharded model: gpt_train --tp trains a GPT-2 and a Llama
(grouped-query attention, 4 heads over 2 key/value heads, an untied head) at (dp, tp) = (2, 2),
(1, 2), (3, 2) and 3-D (replicate 2 x shard 2 x tp 2: --strategy hybrid --shard-group-size 2,
W = 8) for 10 steps with clipping on, and `gpt_train --reference --world-size dp` trains the
unsharded model on the same global batch. Checked each step, on every rank:
- the loss within the parity tolerances (5e-5 at the first step, 1e-4 after, relative);
- the gradient norm before clipping (--clip 0.05 binds every step) within 1e-4 relative: the norm
  over both dimensions counts every element once;
- the bytes of every TP collective equal to docs/tensor-parallel.md's formulas, computed here from
  the model's sizes (one with activation checkpointing, which recomputes the blocks' forward).

    tp_parity_e2e.py BIN_DIR [--only NAME,...]"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
ONLY = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv else set()
GPT, FSDPRUN = str(BIN / "gpt_train"), str(BIN / "fsdprun")
LAYERS, DIM, HEADS, SEQ, BATCH, STEPS, FFN = 2, 64, 4, 32, 2, 10, 160
COMMON = ["--layers", LAYERS, "--dim", DIM, "--heads", HEADS, "--seq", SEQ, "--batch", BATCH,
          "--steps", STEPS, "--clip", 0.05, "--lr", 3e-3, "--seed", 11]
FAMILIES = {"gpt2": ["--model", "gpt2"],
            "llama": ["--model", "llama", "--kv-heads", 2, "--ffn-dim", FFN]}
# (name, world, tp, extra flags): dp = world / tp.
LAYOUTS = [("2x2", 4, 2, []), ("1x2", 2, 2, []), ("3x2", 6, 2, []),
           ("2x2x2", 8, 2, ["--strategy", "hybrid", "--shard-group-size", "2"]),
           ("2x2-ac", 4, 2, ["--activation-checkpointing"])]
TOLERANCE = (5e-5, 1e-4)  # (first step, any step), relative: the FSDP parity tolerances
NORM_TOLERANCE = 1e-4
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FSDP_TIMEOUT_SECONDS": "120"}
for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
    ENV.pop(name, None)


def run(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, timeout=900)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def steps(path):
    return [line for line in map(json.loads, Path(path).read_text().splitlines()) if "step" in line]


def tp_bytes(family, tp, ac):
    """What one rank's TP collectives send per step (docs/tensor-parallel.md), fp32."""
    e, n, c, f = 4, BATCH * SEQ, DIM, (tp - 1) / tp
    act = f * n * c * e  # one all-gather or reduce-scatter of a [batch, seq, dim] activation
    blocks = LAYERS * (6 if ac else 4) * act  # forward's 2 (+2 recomputed) and backward's 2
    gather = blocks + act + act + (tp - 1) * n * 4  # + embedding bwd, head fwd, loss's row maxima
    scatter = blocks + act + act  # + embedding fwd, head bwd
    if family == "llama":
        replicated = (2 * LAYERS + 1) * c  # RMSNorm weights
    else:  # LayerNorms (weight, bias), row-wise biases, the positions table
        replicated = (2 * LAYERS + 1) * 2 * c + 2 * LAYERS * c + SEQ * c
    reduce = 2 * f * (2 * n * 4 + replicated * e)  # the loss's sums, the replicated gradients
    return {"bytes_tp_all_gather": gather, "bytes_tp_reduce_scatter": scatter, "bytes_tp_all_reduce": reduce}


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def main():
    work = Path(tempfile.mkdtemp(prefix="tp_parity_"))
    import random
    rng = random.Random(5)
    data = work / "text.txt"
    data.write_text("".join(rng.choice("abcdefghij klmnop\n") for _ in range(300_000)))
    failures, done = [], 0
    for family, flags in FAMILIES.items():
        references = {}
        for name, world, tp, extra in LAYOUTS:
            if ONLY and f"{family}-{name}" not in ONLY:
                continue
            dp = world // tp
            if dp not in references:
                out = work / f"{family}-ref{dp}.jsonl"
                run([GPT, "--reference", "--world-size", dp, "--data", data, *COMMON, *flags, "--metrics", out])
                references[dp] = steps(out)
            out = work / f"{family}-{name}-{{rank}}.jsonl"
            run([FSDPRUN, "--nproc-per-node", world, GPT, "--tp", tp, "--data", data, *COMMON, *flags,
                 *extra, "--metrics", out])
            expected_bytes = tp_bytes(family, tp, "--activation-checkpointing" in extra)
            for rank in range(world):
                got = steps(str(out).replace("{rank}", str(rank)))
                for s, (mine, ref) in enumerate(zip(got, references[dp], strict=True)):
                    where = f"{family} {name} rank {rank} step {s + 1}"
                    loss_error = relative(mine["loss"], ref["loss"])
                    if loss_error > TOLERANCE[s > 0]:
                        failures.append(f"{where}: loss {mine['loss']} vs the reference's {ref['loss']} ({loss_error:.2e})")
                    norm_error = relative(mine["grad_norm"], ref["grad_norm"])
                    if norm_error > NORM_TOLERANCE:
                        failures.append(f"{where}: gradient norm {mine['grad_norm']} vs {ref['grad_norm']} ({norm_error:.2e})")
                    for key, want in expected_bytes.items():
                        if mine[key] != round(want):
                            failures.append(f"{where}: {key} {mine[key]}, the formula gives {want:.0f}")
            worst = max(relative(a["loss"], b["loss"]) for a, b in zip(steps(str(out).replace("{rank}", "0")), references[dp]))
            print(f"{family} (dp, tp) = {name}: worst relative loss difference {worst:.2e}", flush=True)
            done += 1
    assert done, "no layout ran (--only names none)"
    assert not failures, "\n".join(failures[:20])
    print(f"tp_parity_e2e: {done} runs equal to the reference; TP bytes equal to their formulas")


if __name__ == "__main__":
    main()
