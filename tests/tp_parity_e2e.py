"""2-D parallelism against the unsharded model: gpt_train --tp trains a GPT-2 and a Llama
(grouped-query attention, 4 heads over 2 key/value heads, an untied head) at (dp, tp) = (2, 2),
(1, 2), (3, 2) and 3-D (replicate 2 x shard 2 x tp 2: --strategy hybrid --shard-group-size 2,
W = 8) for 10 steps with clipping on, and `gpt_train --reference --world-size dp` trains the
unsharded model on the same global batch. Checked each step, on every rank:
- the loss within the parity tolerances (5e-5 at the first step, 1e-4 after, relative);
- the gradient norm before clipping (--clip 0.05 binds every step) within 1e-4 relative: the norm
  over both dimensions counts every element once;
- a tp group spanning two hosts warns;
- the bytes of every TP collective equal to docs/tensor-parallel.md's formulas, computed here from
  the model's sizes (one with activation checkpointing, which recomputes the blocks' forward).
Also with SHARD_GRAD_OP, and with bf16 mixed precision, two micro-batches under --no-sync and a
frozen replicated parameter (ln_f) on both runs (bf16's roundoff as the tolerance); and with
--deferred-init (each block split, then sharded, as it is built) against FSDP alone at W = dp,
deferred alike (its random order differs from the reference's eager build); and with
--optimizer muon at (1, 2) and (2, 2) (fsdp::optim::Muon orthogonalizing each split matrix whole;
losses within 2e-4 after the first step and gradient norms within 2e-3, the bf16 iteration's
rounding, which FSDP alone shows as much of). At (2, 2) the
trained model written by --save-full and --export-hf (each parameter gathered over the tp ranks)
equals the reference's, name by name.

    tp_parity_e2e.py BIN_DIR [--only NAME,...]"""
import json
import os
import socket

import torch
from safetensors.torch import load_file
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
# Mixed precision, two micro-batches without synchronisation, a frozen replicated parameter: on
# both runs (the reference computes in bf16 too).
FEATURES = ["--param-dtype", "bf16", "--reduce-dtype", "fp32", "--grad-accum", 2, "--freeze", "ln_f"]
# (name, world, tp, flags of the 2-D run only, flags of both runs): dp = world / tp.
LAYOUTS = [("2x2", 4, 2, [], []), ("1x2", 2, 2, [], []), ("3x2", 6, 2, [], []),
           ("2x2x2", 8, 2, ["--strategy", "hybrid", "--shard-group-size", "2"], []),
           ("2x2-ac", 4, 2, ["--activation-checkpointing", "--strategy", "grad_op"], []),
           ("2x2-features", 4, 2, ["--no-sync"], FEATURES),
           ("2x2-deferred", 4, 2, [], ["--deferred-init"]),
           # fsdp::optim::Muon on the split matrices, each orthogonalized whole ([Note: Muon on a
           # tensor-parallel matrix]); the reference's Muon steps the unsplit model's.
           ("1x2-muon", 2, 2, [], ["--optimizer", "muon"]), ("2x2-muon", 4, 2, [], ["--optimizer", "muon"])]
# (first step, any step), relative: the FSDP parity tolerances in fp32; bf16's unit roundoff.
TOLERANCE, BF16_TOLERANCE = (5e-5, 1e-4), (2 ** -8, 2 ** -8)
# Muon: its bf16 iteration rounds differently on inputs 1e-7 apart (issue 58's bound); FSDP alone
# (no --tp) against the same reference drifts as far: gradient norms up to 8e-4 off in 10 steps.
MUON_TOLERANCE, MUON_NORM_TOLERANCE = (5e-5, 2e-4), 2e-3
NORM_TOLERANCE, BF16_NORM_TOLERANCE = 1e-4, 2 ** -6
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FSDP_TIMEOUT_SECONDS": "120"}
for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
    ENV.pop(name, None)


def run(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, timeout=900)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def steps(path):
    return [line for line in map(json.loads, Path(path).read_text().splitlines()) if "step" in line]


def tp_bytes(family, tp, ac, shared):
    """What one rank's TP collectives send per step (docs/tensor-parallel.md): activations and the
    replicated gradients in the compute dtype, the loss's statistics in fp32."""
    e = 2 if "bf16" in shared else 4
    micro = shared[shared.index("--grad-accum") + 1] if "--grad-accum" in shared else 1
    frozen = 2 * DIM if "ln_f" in shared else 0  # ln_f's weight and bias (GPT-2), weight (Llama)
    n, c, f = BATCH * SEQ, DIM, (tp - 1) / tp
    act = f * n * c * e  # one all-gather or reduce-scatter of a [batch, seq, dim] activation
    blocks = LAYERS * (6 if ac else 4) * act  # forward's 2 (+2 recomputed) and backward's 2
    gather = blocks + act + act + (tp - 1) * n * 4  # + embedding bwd, head fwd, loss's row maxima
    scatter = blocks + act + act  # + embedding fwd, head bwd
    if family == "llama":
        replicated = (2 * LAYERS + 1) * c - frozen // 2  # RMSNorm weights
    else:  # LayerNorms (weight, bias), row-wise biases, the positions table
        replicated = (2 * LAYERS + 1) * 2 * c + 2 * LAYERS * c + SEQ * c - frozen
    reduce = 2 * f * (2 * n * 4 + replicated * e)  # the loss's sums, the replicated gradients
    return {"bytes_tp_all_gather": micro * gather, "bytes_tp_reduce_scatter": micro * scatter,
            "bytes_tp_all_reduce": micro * reduce}


def same_tensors(mine, reference, what):
    """Every tensor of `reference` in `mine`, of the same shape, equal within the training's
    roundoff: 10 AdamW steps apart in summation order only, where an element whose gradient is
    near zero may move by up to lr a step either way: the tensor's relative difference
    (||mine - reference|| / ||reference||) measured at 2e-5 at most, within 1e-3; a misplaced
    part (a fused chunk out of order, a tp rank's rows twice) is of order 1."""
    assert sorted(mine) == sorted(reference), f"{what}: names differ: {sorted(set(mine) ^ set(reference))}"
    for name, want in reference.items():
        got = mine[name]
        assert got.shape == want.shape, f"{what} {name}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
        difference = ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()
        assert difference <= 1e-3, f"{what} {name}: relative difference {difference:.3e}"


def tp_group_across_hosts_warns(data):
    """Two ranks launched as two hosts of one rank each (LOCAL_WORLD_SIZE=1, as torchrun sets it
    on two nodes): a tp group of both spans hosts, and rank 0 warns; the run still trains."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for rank in range(2):
        env = {**ENV, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        flags = [str(f) for f in COMMON]
        flags[flags.index("--steps") + 1] = "1"
        ranks.append(subprocess.Popen([GPT, "--tp", "2", "--data", str(data), *flags],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=300)[0] for p in ranks]
    assert all(p.returncode == 0 for p in ranks), outputs
    assert "spans hosts" in outputs[0], outputs[0][-2000:]
    print("a tp group across two hosts: rank 0 warns, the run trains")


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
        for name, world, tp, extra, shared in LAYOUTS:
            if ONLY and f"{family}-{name}" not in ONLY:
                continue
            dp = world // tp
            ref_key = (dp, tuple(shared))
            # The trained model as files, at (2, 2): its whole parameters, and a transformers folder.
            outputs = lambda tag: (["--save-full", work / f"{family}-{tag}.pt", "--export-hf", work / f"{family}-{tag}-hf"]
                                   if name == "2x2" else [])
            if ref_key not in references and "--deferred-init" in shared:
                # Built block by block in another random order than the reference's eager model:
                # the baseline is FSDP alone at W = dp, deferred alike.
                out = work / f"{family}-deferred{dp}-{{rank}}.jsonl"
                run([FSDPRUN, "--nproc-per-node", dp, GPT, "--data", data, *COMMON, *flags, *shared, "--metrics", out])
                references[ref_key] = steps(str(out).replace("{rank}", "0"))
            elif ref_key not in references:
                out = work / f"{family}-ref{dp}{len(references)}.jsonl"
                run([GPT, "--reference", "--world-size", dp, "--data", data, *COMMON, *flags, *shared, "--metrics", out,
                     *outputs(f"ref{dp}")])
                references[ref_key] = steps(out)
            out = work / f"{family}-{name}-{{rank}}.jsonl"
            run([FSDPRUN, "--nproc-per-node", world, GPT, "--tp", tp, "--data", data, *COMMON, *flags,
                 *extra, *shared, "--metrics", out, *outputs(name)])
            if name == "2x2":
                same_tensors(torch.load(work / f"{family}-{name}.pt"), torch.load(work / f"{family}-ref{dp}.pt"),
                             f"{family} --save-full")
                same_tensors(load_file(work / f"{family}-{name}-hf" / "model.safetensors"),
                             load_file(work / f"{family}-ref{dp}-hf" / "model.safetensors"), f"{family} --export-hf")
            expected_bytes = tp_bytes(family, tp, "--activation-checkpointing" in extra, shared)
            bf16 = "bf16" in shared
            tolerance, norm_tolerance = (BF16_TOLERANCE, BF16_NORM_TOLERANCE) if bf16 else (TOLERANCE, NORM_TOLERANCE)
            if "muon" in shared:
                tolerance, norm_tolerance = MUON_TOLERANCE, MUON_NORM_TOLERANCE
            for rank in range(world):
                got = steps(str(out).replace("{rank}", str(rank)))
                for s, (mine, ref) in enumerate(zip(got, references[ref_key], strict=True)):
                    where = f"{family} {name} rank {rank} step {s + 1}"
                    loss_error = relative(mine["loss"], ref["loss"])
                    if loss_error > tolerance[s > 0]:
                        failures.append(f"{where}: loss {mine['loss']} vs the reference's {ref['loss']} ({loss_error:.2e})")
                    norm_error = relative(mine["grad_norm"], ref["grad_norm"])
                    if norm_error > norm_tolerance:
                        failures.append(f"{where}: gradient norm {mine['grad_norm']} vs {ref['grad_norm']} ({norm_error:.2e})")
                    for key, want in expected_bytes.items():
                        if mine[key] != round(want):
                            failures.append(f"{where}: {key} {mine[key]}, the formula gives {want:.0f}")
            worst = max(relative(a["loss"], b["loss"]) for a, b in zip(steps(str(out).replace("{rank}", "0")), references[ref_key]))
            print(f"{family} (dp, tp) = {name}: worst relative loss difference {worst:.2e}", flush=True)
            done += 1
    assert done or "hosts" in ONLY, "no layout ran (--only names none)"
    if not ONLY or "hosts" in ONLY:
        tp_group_across_hosts_warns(data)
    assert not failures, "\n".join(failures[:20])
    print(f"tp_parity_e2e: {done} runs equal to the reference; TP bytes equal to their formulas")


if __name__ == "__main__":
    main()
