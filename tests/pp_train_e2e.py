"""gpt_train --pp against the unsharded model: `fsdprun --nproc-per-node W gpt_train --pp P
--microbatches M --batch B` trains what `gpt_train --reference --world-size W/P --grad-accum M
--batch B` trains (micro-batch m of dp rank d is the reference's micro-batch m's rows d·B..). For
6 steps in fp32 the loss every rank reports (the last stage's, averaged over dp) is within 1e-5 of
the reference's at every step, and each rank's bytes_pp_send is docs/pipeline-parallel.md's
formula for its stages (M micro-batches of B rows: a wrong micro-batch count shows there). Layouts:
GPT-2 (its head tied to wte across the first and last stage) and Llama under 1F1B at pp 2 x dp 1
with 3 blocks (split 2 + 1); Llama under GPipe at pp 2 x dp 2 (each stage sharded over dp);
interleaved 1F1B (2 stages per rank) and ZBV at pp 2 on 4 blocks; Qwen3 under 1F1B at pp 2 x dp 2
on 3 blocks; --clip (fsdp::pp::clip_grad_norm_) on GPT-2 at pp 2 and Llama at pp 2 x dp 2, the norm
before clipping equal to the reference's. bf16 (--param-dtype bf16, each stage sharded, over a dp
group of one at dp 1) against the reference under the same policy: Llama under 1F1B and Qwen3
under GPipe at pp 2 x dp 1 (within 1e-5: the held gradient is the fp32 sum of the micro-batches'
bf16 gradients, as the reference's), Llama under GPipe and Qwen3 under 1F1B at pp 2 x dp 2 (within
BF16_DP2_TOLERANCE, bf16 rounding of each rank's gradient); --activation-checkpointing (each part of
a stage recomputed) at pp 2 x dp 1 under 1F1B and pp 2 x dp 2 under GPipe (Llama) and 1F1B (GPT-2)
within 1e-5, and at dp 2 every rank's step peak below the same run's without it. FSDP inside the
stages at pp 2 x dp 2: Llama under ZBV, GPT-2's tie across sharded stages under 1F1B (also with
--clip) and interleaved 1F1B, within 1e-5; GPT-2 in bf16 at dp 1 within BF16_TIE_TOLERANCE and at
dp 2 within BF16_DP2_TOLERANCE.

The trainer's other flags under --pp, each against the reference given the same flag (FEATURES):
--init-from (GPT-2, its tie) and --init-from-hf (Llama at pp 2 x dp 2) from a file and a folder
that a 2-step reference run wrote (not --seed's model); --eval-tokens (Pipeline::evaluate, forward
only) under ZBV and at pp 2 x dp 2: the initial and final eval losses within 1e-5; --sample: the
same text as the reference's with the same seed; --grad-accum 2 with --microbatches 2 against
--grad-accum 4 (GPT-2's tie at dp 1, Llama's sharded stages at dp 2); --dump-batches: the
reference's (--world-size dp --grad-accum A·M) batches, equal.

    pp_train_e2e.py BIN_DIR [--only NAME,...]"""
import array
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
ONLY = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv else set()
GPT, FSDPRUN = str(BIN / "gpt_train"), str(BIN / "fsdprun")
COMMON = ["--dim", 32, "--heads", 4, "--seq", 16, "--batch", 2, "--steps", 6, "--lr", 3e-3, "--seed", 5]
FAMILIES = {"gpt2": ["--model", "gpt2"], "llama": ["--model", "llama", "--kv-heads", 2, "--ffn-dim", 64],
            "qwen3": ["--model", "qwen3", "--kv-heads", 2, "--ffn-dim", 64]}
# (name, family, world, pp, layers, microbatches, flags of the pipeline run)
LAYOUTS = [("gpt2-1f1b-uneven", "gpt2", 2, 2, 3, 4, ["--pp-schedule", "1f1b"]),
           ("llama-1f1b-uneven", "llama", 2, 2, 3, 4, ["--pp-schedule", "1f1b"]),
           ("llama-gpipe-dp2", "llama", 4, 2, 2, 2, ["--pp-schedule", "gpipe"]),
           ("gpt2-interleaved", "gpt2", 2, 2, 4, 4, ["--pp-schedule", "interleaved-1f1b",
                                                     "--stages-per-rank", 2]),
           ("llama-zbv", "llama", 2, 2, 4, 3, ["--pp-schedule", "zbv"]),
           ("qwen3-1f1b-dp2-uneven", "qwen3", 4, 2, 3, 2, ["--pp-schedule", "1f1b"]),
           # --clip below the norm (about 1.5 at the start), so every step clips: the norm over
           # every stage, dp's pieces summed, GPT-2's tied weight counted once.
           ("gpt2-1f1b-clip", "gpt2", 2, 2, 3, 4, ["--pp-schedule", "1f1b", "--clip", 0.3]),
           ("llama-gpipe-dp2-clip", "llama", 4, 2, 2, 2, ["--pp-schedule", "gpipe", "--clip", 0.3]),
           # Muon on the stages' matrices: whole at one owner among a sharded stage's dp ranks.
           ("llama-1f1b-muon", "llama", 2, 2, 3, 4, ["--pp-schedule", "1f1b", "--optimizer", "muon"]),
           ("llama-gpipe-dp2-muon", "llama", 4, 2, 2, 2, ["--pp-schedule", "gpipe", "--optimizer", "muon"]),
           # Frozen parameters: a block of the first stage; every parameter of the first stage
           # (wte, h.0: its backward has nothing to compute), here sharded over dp.
           ("gpt2-1f1b-freeze", "gpt2", 2, 2, 3, 4, ["--pp-schedule", "1f1b", "--freeze", "h.0."]),
           ("llama-gpipe-dp2-freeze-stage", "llama", 4, 2, 2, 2, ["--pp-schedule", "gpipe", "--freeze", "wte",
                                                                   "--freeze", "h.0."]),
           # Hybrid sharding inside each stage: dp 4 as 2 replicas of shard groups of 2 (W = 8).
           ("llama-gpipe-dp4-hybrid", "llama", 8, 2, 2, 2, ["--pp-schedule", "gpipe", "--strategy", "hybrid",
                                                             "--shard-group-size", 2]),
           # FSDP inside ZBV's stages: W adds into the held unsharded sum, reduced after the last W.
           ("llama-zbv-dp2", "llama", 4, 2, 4, 3, ["--pp-schedule", "zbv"]),
           # GPT-2's tie across sharded stages: each copy's gradient the sum of both stages' (the
           # stages' reduced gradients made whole over dp, then exchanged over pp).
           ("gpt2-1f1b-dp2", "gpt2", 4, 2, 3, 2, ["--pp-schedule", "1f1b"]),
           ("gpt2-interleaved-dp2", "gpt2", 4, 2, 4, 4, ["--pp-schedule", "interleaved-1f1b",
                                                         "--stages-per-rank", 2]),
           ("gpt2-1f1b-dp2-clip", "gpt2", 4, 2, 3, 2, ["--pp-schedule", "1f1b", "--clip", 0.3]),
           # bf16 compute (each stage sharded, over a dp group of one at dp 1), against the
           # reference under the same policy.
           ("gpt2-1f1b-bf16", "gpt2", 2, 2, 3, 4, ["--pp-schedule", "1f1b", "--param-dtype", "bf16"]),
           ("gpt2-1f1b-dp2-bf16", "gpt2", 4, 2, 3, 2, ["--pp-schedule", "1f1b", "--param-dtype", "bf16"]),
           ("llama-1f1b-bf16", "llama", 2, 2, 3, 4, ["--pp-schedule", "1f1b", "--param-dtype", "bf16"]),
           ("qwen3-gpipe-bf16", "qwen3", 2, 2, 3, 4, ["--pp-schedule", "gpipe", "--param-dtype", "bf16"]),
           ("llama-gpipe-dp2-bf16", "llama", 4, 2, 2, 2, ["--pp-schedule", "gpipe", "--param-dtype", "bf16"]),
           ("qwen3-1f1b-dp2-bf16", "qwen3", 4, 2, 3, 2, ["--pp-schedule", "1f1b", "--param-dtype", "bf16"]),
           # Each part of a stage recomputed in backward; its memory against the same run without.
           ("llama-1f1b-recompute", "llama", 2, 2, 3, 4, ["--pp-schedule", "1f1b", "--activation-checkpointing"]),
           ("llama-gpipe-dp2-recompute", "llama", 4, 2, 2, 2, ["--pp-schedule", "gpipe",
                                                               "--activation-checkpointing"]),
           ("gpt2-1f1b-dp2-recompute", "gpt2", 4, 2, 3, 2, ["--pp-schedule", "1f1b",
                                                            "--activation-checkpointing"])]
# The split rank 0 prints: 3 blocks over 2 stages are 2 + 1, the embeddings first, the head last.
SPLITS = {"gpt2-1f1b-uneven": "stage 0 [wte wpe h.0 h.1] stage 1 [h.2 ln_f head]",
          "gpt2-interleaved": "stage 0 [wte wpe h.0] stage 1 [h.1] stage 2 [h.2] stage 3 [h.3 ln_f head]",
          "qwen3-1f1b-dp2-uneven": "stage 0 [wte h.0 h.1] stage 1 [h.2 ln_f lm_head]"}
TOLERANCE = 1e-5
# bf16 at dp 1: each stage computes the reference's ops on the reference's rows, and its gradient
# held across the micro-batches is, as the reference's, the fp32 sum of their bf16 gradients: the
# fp32 tolerance. At dp 2 each rank's gradient is rounded to bf16 over its own rows and reduced
# in bf16, the reference's over both ranks' rows at once: bf16's unit roundoff (3.9e-3) on a
# gradient moves the loss (~5.5) by ~1e-4 in 6 steps (tests/gpu_check.py's same-policy bound is 1e-3
# relative).
BF16_DP2_TOLERANCE = 2e-3
# (name, family, world, pp, layers, microbatches, flags of the pipeline run, flags of both runs:
# INIT/HF/EVAL/DUMP stand for the files the test writes). The reference runs --grad-accum A·M.
FEATURES = [("gpt2-1f1b-init-from", "gpt2", 2, 2, 3, 2, ["--pp-schedule", "1f1b"], ["--init-from", "INIT"]),
            ("llama-gpipe-dp2-init-from-hf", "llama", 4, 2, 2, 2, ["--pp-schedule", "gpipe"],
             ["--init-from-hf", "HF"]),
            ("llama-zbv-eval", "llama", 2, 2, 4, 3, ["--pp-schedule", "zbv"], ["--eval-tokens", "EVAL"]),
            ("llama-gpipe-dp2-eval-sample", "llama", 4, 2, 2, 2, ["--pp-schedule", "gpipe"],
             ["--eval-tokens", "EVAL", "--sample", 48]),
            ("gpt2-1f1b-sample", "gpt2", 2, 2, 3, 2, ["--pp-schedule", "1f1b"], ["--sample", 48]),
            ("gpt2-1f1b-accum", "gpt2", 2, 2, 3, 2, ["--pp-schedule", "1f1b", "--grad-accum", 2], []),
            # the tie across sharded stages accumulated over schedules: each step's own sum added
            ("gpt2-1f1b-dp2-accum", "gpt2", 4, 2, 3, 2, ["--pp-schedule", "1f1b", "--grad-accum", 2], []),
            ("llama-gpipe-dp2-accum-dump", "llama", 4, 2, 2, 2, ["--pp-schedule", "gpipe", "--grad-accum", 2],
             ["--dump-batches", "DUMP"])]
# GPT-2 in bf16 at dp 1: the reference's tied tensor sums its two uses' bf16 gradients in bf16
# (one leaf), the pipeline casts each stage's to fp32 before the tie's sum: one bf16 rounding of
# the tie's gradient apart, ~3e-5 on the loss in 6 steps.
BF16_TIE_TOLERANCE = 2e-4
# Muon's Newton-Schulz iteration runs in bf16: a gradient that differs by float reassociation can
# round differently there (tests/tp_parity_e2e.py's bound for --tp --optimizer muon).
MUON_TOLERANCE = 2e-4
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FSDP_TIMEOUT_SECONDS": "60"}
for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
    ENV.pop(name, None)


def run(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="surrogateescape", env=ENV,
                       timeout=300)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def steps(path):
    return [line for line in map(json.loads, Path(path).read_text().splitlines()) if "step" in line]


def rank_of_stage(stage, pp, stages, schedule):
    """docs/pipeline-parallel.md: loop placement (stage s on rank s % P), ZBV's V (r and 2P-1-r)."""
    if schedule == "zbv":
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def pp_bytes(pp_rank, pp, family, micro, flags):
    """What pp rank `pp_rank` sends a step (docs/pipeline-parallel.md, "Bytes sent"): M·(a + h)
    for each boundary of its stages with another rank (a: one micro-batch's activation, fp32;
    h: the 80-byte header), and GPT-2's tied head when the first and last stage are on two ranks."""
    schedule = flags[flags.index("--pp-schedule") + 1]
    per_rank = flags[flags.index("--stages-per-rank") + 1] if "--stages-per-rank" in flags else 1
    stages = pp * (2 if schedule == "zbv" else per_rank)
    dim, batch, seq = COMMON[1], COMMON[COMMON.index("--batch") + 1], COMMON[COMMON.index("--seq") + 1]
    element = 2 if "--param-dtype" in flags else 4  # a bf16 stage sends its bf16 output
    a, h = batch * seq * dim * element, 80
    place = lambda s: rank_of_stage(s, pp, stages, schedule)
    crossings = sum((s + 1 < stages and place(s + 1) != pp_rank) + (s > 0 and place(s - 1) != pp_rank)
                    for s in range(stages) if place(s) == pp_rank)
    tie = 256 * dim * 4 if family == "gpt2" and place(0) != place(stages - 1) else 0
    return micro * (a + h) * crossings + tie


def check(tmp, name, family, world, pp, layers, micro, flags):
    data = ["--data", str(tmp / "text.txt")]
    model = [*FAMILIES[family], "--layers", layers, *COMMON, *data]
    ref = tmp / f"{name}-ref.jsonl"
    same = [f for i, flag in enumerate(flags) if flag in ("--clip", "--optimizer", "--freeze", "--param-dtype")
            for f in flags[i:i + 2]]  # flags the reference runs too
    clip = same[same.index("--clip"):same.index("--clip") + 2] if "--clip" in same else []
    run([GPT, "--reference", "--world-size", world // pp, "--grad-accum", micro, *model, *same, "--metrics", ref])
    metrics = tmp / f"{name}-pp-{{rank}}.jsonl"
    out = run([FSDPRUN, "--nproc-per-node", world, GPT, "--pp", pp, "--microbatches", micro, *flags,
               *model, "--metrics", metrics, "--log-every", 2])
    expected = [s["loss"] for s in steps(ref)]
    if name in SPLITS:
        assert SPLITS[name] in out, f"{name}: the split is not {SPLITS[name]}:\n{out}"
    tolerance = (MUON_TOLERANCE if "muon" in flags else
                 BF16_DP2_TOLERANCE if "--param-dtype" in flags and world > pp else
                 BF16_TIE_TOLERANCE if "--param-dtype" in flags and family == "gpt2" else TOLERANCE)
    shown = re.search(r"step +6/6 \| loss ([0-9.]+)", out)  # rank 0's progress line (4 decimals)
    assert shown and abs(float(shown.group(1)) - expected[-1]) < max(1e-4, tolerance), \
        f"{name}: no progress line of the loss:\n{out}"
    worst = 0.0
    for rank in range(world):
        got = steps(str(metrics).replace("{rank}", str(rank)))
        assert len(got) == len(expected) == 6, f"{name}: {len(got)} steps, reference {len(expected)}"
        diffs = [abs(g["loss"] - e) for g, e in zip(got, expected)]
        worst = max(worst, *diffs)
        assert max(diffs) < tolerance, f"{name} rank {rank}: losses {[g['loss'] for g in got]} vs reference {expected}"
        if clip:  # the norm before clipping, every rank alike: the unsplit model's
            norms = [s["grad_norm"] for s in steps(ref)]
            assert norms[0] > 2 * clip[1], f"{name}: the reference's norm {norms[0]} would not be clipped by {clip[1]}"
            off = [abs(g["grad_norm"] - e) / e for g, e in zip(got, norms)]
            assert max(off) < 1e-5, f"{name} rank {rank}: norms {[g['grad_norm'] for g in got]} vs reference {norms}"
        sent = pp_bytes(rank // (world // pp), pp, family, micro, flags)
        assert all(g["bytes_pp_send"] == sent for g in got), \
            f"{name} rank {rank}: pp bytes {[g['bytes_pp_send'] for g in got]}, expected {sent}"
    print(f"{name}: {world} ranks, pp {pp}: 6 steps, max |loss - reference| = {worst:.2e} "
          f"(first {expected[0]:.6f}, last {expected[-1]:.6f})")
    if "--activation-checkpointing" in flags and world > pp:  # both runs' stages sharded (dp 2)
        check_recompute_memory(tmp, name, world, pp, micro, flags, model, metrics)


def check_recompute_memory(tmp, name, world, pp, micro, flags, model, metrics):
    """Recomputing each part keeps only the parts' inputs between a micro-batch's forward and its
    backward: every rank's step peak (steps 2-6, the optimizer's state there) is below the same
    run's without --activation-checkpointing."""
    plain = tmp / f"{name}-plain-{{rank}}.jsonl"
    without = [f for f in flags if f != "--activation-checkpointing"]
    run([FSDPRUN, "--nproc-per-node", world, GPT, "--pp", pp, "--microbatches", micro, *without, *model,
         "--metrics", plain])
    for rank in range(world):
        peak = lambda path: max(s["mem_peak_bytes"] for s in steps(str(path).replace("{rank}", str(rank)))[1:])
        recomputed, kept = peak(metrics), peak(plain)
        assert recomputed < kept, f"{name} rank {rank}: step peak {recomputed} bytes recomputing, {kept} without"
        print(f"{name} rank {rank}: step peak {recomputed} bytes recomputing each part, {kept} without "
              f"({recomputed / kept:.2f}x)")


def with_flag(args, flag, value):
    """`args` with `flag`'s value replaced."""
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


INPUTS = {}  # (family, layers): write_inputs' files


def write_inputs(tmp, family, layers):
    """INIT (--save-full) and HF (--export-hf) of a 2-step reference run from another seed, and EVAL:
    4 rows of seq + 1 token ids (uint16, nanoGPT's layout)."""
    model = [*FAMILIES[family], "--layers", layers, *with_flag(with_flag(COMMON, "--steps", 2), "--seed", 11),
             "--data", tmp / "text.txt"]
    if (family, layers) in INPUTS:
        return INPUTS[family, layers]
    files = {"INIT": tmp / f"{family}-{layers}-init.pt", "HF": tmp / f"{family}-{layers}-hf",
             "EVAL": tmp / "eval.bin"}
    run([GPT, "--reference", *model, "--save-full", files["INIT"], "--export-hf", files["HF"]])
    rng = random.Random(3)
    seq = COMMON[COMMON.index("--seq") + 1]
    files["EVAL"].write_bytes(array.array("H", [rng.randrange(256) for _ in range(4 * (seq + 1))]).tobytes())
    INPUTS[family, layers] = files
    return files


def eval_losses(out, name):
    found = re.search(r"eval loss: initial ([0-9.]+) final ([0-9.]+)", out)
    assert found, f"{name}: no eval line:\n{out}"
    return float(found.group(1)), float(found.group(2))


def sample_text(out, name):
    if "[rank0]: " in out:  # fsdprun's output: rank 0's lines, unprefixed
        out = "\n".join(line[len("[rank0]: "):] for line in out.split("\n") if line.startswith("[rank0]: "))
    found = re.search(r"--- sample ---\n(.*)\n--------------", out, re.S)
    assert found, f"{name}: no sample:\n{out}"
    return found.group(1)


def check_feature(tmp, name, family, world, pp, layers, micro, flags, both):
    """The pipelined run with a flag of the trainer against the reference with the same flag."""
    files = write_inputs(tmp, family, layers)
    accum = flags[flags.index("--grad-accum") + 1] if "--grad-accum" in flags else 1
    model = [*FAMILIES[family], "--layers", layers, *COMMON, "--data", tmp / "text.txt"]
    if "--init-from-hf" in both:  # the folder's config.json sets the model's sizes
        model = [*COMMON[COMMON.index("--seq"):], "--data", tmp / "text.txt"]
    given = lambda run_name: [files.get(f, tmp / f"{name}-{run_name}-{f}.pt") if f in ("INIT", "HF", "EVAL", "DUMP")
                              else f for f in both]
    ref = tmp / f"{name}-ref.jsonl"
    ref_out = run([GPT, "--reference", "--world-size", world // pp, "--grad-accum", micro * accum, *model,
                   *given("ref"), "--metrics", ref])
    metrics = tmp / f"{name}-pp-{{rank}}.jsonl"
    out = run([FSDPRUN, "--nproc-per-node", world, GPT, "--pp", pp, "--microbatches", micro, *flags, *model,
               *given("pp"), "--metrics", metrics])
    expected = [s["loss"] for s in steps(ref)]
    worst = 0.0
    for rank in range(world):
        got = [s["loss"] for s in steps(str(metrics).replace("{rank}", str(rank)))]
        assert len(got) == len(expected) == 6, f"{name}: {len(got)} steps, reference {len(expected)}"
        worst = max(worst, *[abs(g - e) for g, e in zip(got, expected)])
        assert worst < TOLERANCE, f"{name} rank {rank}: losses {got} vs reference {expected}"
    print(f"{name}: {world} ranks, pp {pp}: max |loss - reference| = {worst:.2e} (first {expected[0]:.6f})")
    if "--eval-tokens" in both:
        (ref_initial, ref_final), (initial, final) = eval_losses(ref_out, name), eval_losses(out, name)
        assert abs(initial - ref_initial) < TOLERANCE and abs(final - ref_final) < TOLERANCE, \
            f"{name}: eval losses {initial}, {final} vs reference {ref_initial}, {ref_final}"
        assert abs(final - initial) > 1e-3, f"{name}: the eval did not see the training ({initial}, {final})"
        print(f"{name}: eval losses {initial:.8f} -> {final:.8f}, reference {ref_initial:.8f} -> {ref_final:.8f}")
    if "--sample" in both:
        text = sample_text(out, name)
        assert text == sample_text(ref_out, name), f"{name}: sample {text!r} vs reference {sample_text(ref_out, name)!r}"
        print(f"{name}: sample {text!r} equal to the reference's")
    if "DUMP" in both:
        import torch
        dumped = [torch.load(tmp / f"{name}-{r}-DUMP.pt") for r in ("ref", "pp")]
        assert all(torch.equal(dumped[0][k], dumped[1][k]) for k in ("inputs", "targets")), \
            f"{name}: --dump-batches differs from the reference's"
        print(f"{name}: --dump-batches {tuple(dumped[1]['inputs'].shape)} equal to the reference's")


def write_corpus(path):
    """20,000 words of a code-like text (the pipeline tests' --data)."""
    words = ["def", "return", "self", "tensor", "rank", "shard", "step", "loss", "(", ")", ":"]
    rng = random.Random(7)
    path.write_text(" ".join(rng.choice(words) for _ in range(20000)))


def main():
    with tempfile.TemporaryDirectory(prefix="pp_train_") as tmp:
        tmp = Path(tmp)
        write_corpus(tmp / "text.txt")
        for layout in LAYOUTS:
            if not ONLY or layout[0] in ONLY:
                check(tmp, *layout)
        for feature in FEATURES:
            if not ONLY or feature[0] in ONLY:
                check_feature(tmp, *feature)
    print(f"pp_train_end_to_end: all layouts within {TOLERANCE} ({MUON_TOLERANCE} with Muon, "
          f"{BF16_DP2_TOLERANCE} in bf16 at dp 2, {BF16_TIE_TOLERANCE} for GPT-2 in bf16 at dp 1)")


if __name__ == "__main__":
    main()
