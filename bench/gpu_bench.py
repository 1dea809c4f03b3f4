"""The GPU benchmark of issue 10: a 1.3 B-parameter GPT in bf16 on one GPU, four ways.

    python3 bench/gpu_bench.py [--build build-gpu] [--out bench/results/gpu-bench.json]
    python3 bench/gpu_bench.py --dry-run                # print the commands, run nothing
    python3 bench/gpu_bench.py --initial-weights-only   # only FSDP2's starting weights

scripts/device_check.sh runs it after the GPU checks (and the last form during them: writing the
weights takes a minute of CPU work, which must not overlap a timed run). The model: 26 layers x
2048, 16 heads (head dim 128), seq 2048, the byte vocabulary: 1.314e9 parameters (GPT-3 XL's
shape, whose 1.3 B count includes a 50k-token vocabulary; 26 layers instead of 24 make up for our
256). All four runs train it in bf16 with fp32 masters, AdamW and fp32 gradient reduction, from the
same weights (the seed's, which gpt_train builds; FSDP2 loads them from a file that
gpt_train --reference --steps 0 --save-full writes) on the same batches (the fsdp-cpp run's
--dump-batches):
  fsdp-cpp          fsdprun --nproc-per-node 1 gpt_train --device cuda --param-dtype bf16
                    --reduce-dtype fp32 (FULL_SHARD, W = 1, NCCL)
  plain LibTorch    gpt_train --reference --device cuda, same flags: no FSDP, the same model and
                    step, mixed precision emulated (bf16 copies of the fp32 masters for forward and
                    backward, gradients added to the masters in fp32)
  PyTorch FSDP2     bench/peer_fsdp2.py --device cuda under torchrun (W = 1, NCCL), the same policy
  fsdp-cpp offload  the fsdp-cpp run with --cpu-offload (shards and AdamW on the CPU)

Batch: the largest power of two that fits fsdp-cpp, tried from the largest that the estimate
below puts under 90% of the GPU's memory downwards until a run does not run out of memory; the
others start at that batch (and go down only if they run out of memory there). Steps, kept small
for the device check's 8 minutes: 3 warm-up + 10 timed (offload: 1 + 3, its steps take seconds).

Metrics, over the timed steps: tokens/s = batch x seq / median step time; model FLOP/s =
tokens/s x (6 N + 12 L d seq), with N the parameters less wpe's (a lookup, no matmul; wte counts,
as the tied head) and 12 L d seq the attention scores and values, forward and backward (PaLM's
and nanoGPT's convention: the causal mask's skipped half is counted); MFU = model FLOP/s / 989.4
TFLOP/s, the H100/H200 SXM datasheet's dense bf16 peak (a large bf16 matmul measured ~790 TFLOP/s
on the device tool's H200, so 80% MFU is about the ceiling). Memory: the caching allocator's peak
allocated bytes in a step (mem_peak_bytes) and its reserved bytes (mem_reserved_bytes), the
maximum over all steps.

The losses must agree (same weights, rows and policy; bf16 rounding and kernels that accumulate
with atomics let them drift): relative difference <= 2e-2 at every step against fsdp-cpp, for runs
of the same batch. A mismatch or a failed run exits 1 (after writing the results); the issue's
goals (fsdp-cpp >= 0.97 x plain LibTorch's tokens/s, >= 45% MFU, >= FSDP2's tokens/s) are
reported, not enforced.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_check import REPO, VOCAB, Model, Run, Runner, ensure_corpus, environment, relative_differences, say  # noqa: E402

BENCH_MODEL = Model(layers=26, dim=2048, heads=16, seq=2048)
BF16 = ["--param-dtype", "bf16", "--reduce-dtype", "fp32"]
LR, SEED = "3e-4", "1234"
PEAK_TFLOPS = 989.4
BATCHES = (32, 16, 8, 4, 2, 1)
FITS_FRACTION = 0.9
WARMUP, TIMED = 3, 10
OFFLOAD_WARMUP, OFFLOAD_TIMED = 1, 3
LOSS_TOLERANCE = 2e-2
H200_BYTES = 143771 << 20  # nvidia-smi's total on the device tool's H200 (for --dry-run)
GIB = 1 << 30

GOALS = {"cpp_vs_plain_tokens_per_s": 0.97, "cpp_mfu": 0.45, "cpp_vs_fsdp2_tokens_per_s": 1.0}


def flops_per_token(model):
    matmul_params = model.params() - model.seq * model.dim  # less wpe
    return 6 * matmul_params + 12 * model.layers * model.dim * model.seq


def estimated_bytes(model, batch):
    """A rough peak: fp32 masters, gradients and AdamW's moments (16 N), bf16 copies of the
    parameters (2 N, plain LibTorch's), and per sequence the bf16 activations a block keeps for
    backward (17 tensors of seq x dim: Korthikanti et al.'s 34 s h bytes without dropout, flash
    attention keeping no seq x seq scores) plus the logits in bf16 and fp32 and their gradient."""
    per_sequence = model.layers * 34 * model.seq * model.dim + 12 * model.seq * VOCAB
    return 18 * model.params() + batch * per_sequence


def gpu_memory_bytes(dry_run):
    """The GPU's memory, asked in a child process: this one holds no CUDA context."""
    if dry_run:
        return H200_BYTES
    return int(subprocess.run([sys.executable, "-c", "import torch; "
                               "print(torch.cuda.get_device_properties(0).total_memory)"],
                              capture_output=True, text=True, check=True).stdout)


def candidate_batches(gpu_bytes):
    fitting = [b for b in BATCHES if estimated_bytes(BENCH_MODEL, b) <= FITS_FRACTION * gpu_bytes]
    return fitting or [1]


def search(runner, make_run, batches, timeout_s):
    """Runs make_run(batch) for each batch in turn until one does not run out of memory; returns
    that run (or the failed one) and the batches tried."""
    tried = []
    for batch in batches:
        run = runner.execute(make_run(batch), timeout_s)
        tried.append({"batch": batch, "rc": run.rc, "out_of_memory": run.out_of_memory})
        if runner.dry_run or not run.out_of_memory:
            break
    return run, batch, tried


def slice_batches(source, rows, destination):
    """The first `rows` rows of every step of a --dump-batches file (what gpt_train trains on at
    batch `rows`: a step's rows are a pure function of seed, step and row)."""
    import torch
    batches = torch.load(source)
    torch.save({key: value[:, :rows].contiguous() for key, value in batches.items()}, destination)


class Bench:
    def __init__(self, args):
        self.runner = Runner(args.build, Path(args.build) / "gpu-bench", dry_run=args.dry_run)
        self.work = self.runner.work
        self.dry_run = args.dry_run
        corpus = ensure_corpus(args.build, args.dry_run)
        m = BENCH_MODEL  # named for what determines them: a file of another model is not reused
        self.init = self.work / f"init-{m.layers}x{m.dim}-seq{m.seq}-seed{SEED}.pt"
        self.common = [*BENCH_MODEL.flags(), "--lr", LR, "--seed", SEED, "--data", str(corpus)]
        self.steps = WARMUP + TIMED

    def batches_file(self, batch):
        return self.work / f"batches-b{batch}.pt"

    def write_initial_weights(self):
        """For FSDP2: the seed's initial parameters, which every gpt_train run builds (on the CPU,
        then moved), written by the reference on the CPU (no GPU needed; a minute's work)."""
        self.work.mkdir(parents=True, exist_ok=True)
        run = Run("init", [self.runner.bin / "gpt_train", "--reference", *self.common, "--steps", "0",
                           "--save-full", self.init], writes_metrics=False)
        self.runner.execute(run, timeout_s=300)
        if not (self.dry_run or run.rc == 0):
            raise SystemExit(f"gpu_bench: writing {self.init} failed; see {run.log}")

    def gpt_args(self, batch, steps):
        return ["--device", "cuda", *self.common, *BF16, "--batch", str(batch), "--steps", str(steps)]

    def fsdp_cpp(self, batch):
        return self.runner.fsdp(f"fsdp_cpp_b{batch}", 1, [*self.gpt_args(batch, self.steps),
                                                          "--dump-batches", str(self.batches_file(batch))])

    def plain(self, batch):
        return self.runner.reference(f"plain_b{batch}", 1, self.gpt_args(batch, self.steps))

    def offload(self, batch):
        steps = OFFLOAD_WARMUP + OFFLOAD_TIMED
        return self.runner.fsdp(f"offload_b{batch}", 1, [*self.gpt_args(batch, steps), "--cpu-offload"])

    def fsdp2(self, batch, dumped_batch):
        if batch != dumped_batch and not self.dry_run:
            slice_batches(self.batches_file(dumped_batch), batch, self.batches_file(batch))
        name = f"fsdp2_b{batch}"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
               REPO / "bench" / "peer_fsdp2.py", "--device", "cuda", *BENCH_MODEL.flags(), *BF16,
               "--batch", str(batch), "--steps", str(self.steps), "--lr", LR,
               "--init-from", self.init, "--batches", self.batches_file(batch),
               "--metrics", self.runner.metrics_pattern(name)]
        return Run(name, cmd)


def measure(run, batch, warmup):
    """Throughput and memory of a run over its timed steps."""
    if not run.ok:
        return {"batch": batch, "ok": False, "rc": run.rc, "out_of_memory": run.out_of_memory,
                "log": str(run.log)}
    records = run.metrics[0]
    step_ms = statistics.median(r["step_ms"] for r in records[warmup:])
    tokens_per_s = batch * BENCH_MODEL.seq / (step_ms / 1000)
    tflops = tokens_per_s * flops_per_token(BENCH_MODEL) / 1e12
    return {"batch": batch, "ok": True, "warmup_steps": warmup, "timed_steps": len(records) - warmup,
            "step_ms_median": step_ms, "step_ms": [r["step_ms"] for r in records],
            "tokens_per_s": tokens_per_s, "model_tflops": tflops, "mfu": tflops / PEAK_TFLOPS,
            "mem_peak_bytes": run.max_over_ranks_and_steps("mem_peak_bytes"),
            "mem_reserved_bytes": run.max_over_ranks_and_steps("mem_reserved_bytes"),
            "losses": run.losses(), "seconds": round(run.seconds, 1), "log": str(run.log)}


def ratio(results, a, b, key):
    if results[a]["ok"] and results[b]["ok"]:
        return results[a][key] / results[b][key]
    return None


def loss_agreement(results):
    """Each run's losses against fsdp-cpp's, where the batch is the same."""
    base = results["fsdp_cpp"]
    agreement = {}
    for name in ("plain_libtorch", "fsdp2", "fsdp_cpp_offload"):
        other = results[name]
        if not (base["ok"] and other["ok"]) or other["batch"] != base["batch"]:
            continue
        diffs = relative_differences(other["losses"], base["losses"])
        agreement[name] = {"max_rel_diff": max(diffs), "step0_rel_diff": diffs[0],
                           "passed": max(diffs) <= LOSS_TOLERANCE}
    return agreement


def goals(results, ratios):
    values = {"cpp_vs_plain_tokens_per_s": ratios["cpp_vs_plain_tokens_per_s"],
              "cpp_mfu": results["fsdp_cpp"].get("mfu"),
              "cpp_vs_fsdp2_tokens_per_s": ratios["cpp_vs_fsdp2_tokens_per_s"]}
    return {name: {"value": value, "goal": GOALS[name], "met": value is not None and value >= GOALS[name]}
            for name, value in values.items()}


LABELS = {"fsdp_cpp": "fsdp-cpp FULL_SHARD W=1", "plain_libtorch": "plain LibTorch (no FSDP)",
          "fsdp2": "PyTorch FSDP2 W=1", "fsdp_cpp_offload": "fsdp-cpp + CPU offload"}


def table(summary):
    lines = [f"{'run':26} {'batch':>5} {'step ms':>8} {'tokens/s':>9} {'TFLOP/s':>8} {'MFU':>6} "
             f"{'peak GiB':>9} {'rsvd GiB':>9}"]
    for name, r in summary["results"].items():
        if not r["ok"]:
            lines.append(f"{LABELS[name]:26} {r['batch']:>5} failed (exit {r['rc']}"
                         f"{', out of memory' if r['out_of_memory'] else ''})")
            continue
        lines.append(f"{LABELS[name]:26} {r['batch']:>5} {r['step_ms_median']:8.0f} {r['tokens_per_s']:9.0f} "
                     f"{r['model_tflops']:8.1f} {100 * r['mfu']:5.1f}% {r['mem_peak_bytes'] / GIB:9.1f} "
                     f"{r['mem_reserved_bytes'] / GIB:9.1f}")
    for name, g in summary["goals"].items():
        value = "n/a" if g["value"] is None else f"{g['value']:.3f}"
        lines.append(f"goal {name}: {value} (>= {g['goal']}): {'met' if g['met'] else 'NOT met'}")
    o = summary["offload"]
    if o["tokens_per_s_ratio"] is not None:
        lines.append(f"offload: {o['tokens_per_s_ratio']:.2f} x fsdp-cpp's tokens/s, peak "
                     f"{o['peak_saving_bytes'] / GIB:.1f} GiB lower ({100 * o['peak_saving_fraction']:.0f}%)")
    for name, a in summary["loss_agreement"].items():
        lines.append(f"losses {name} vs fsdp-cpp: max rel diff {a['max_rel_diff']:.1e} "
                     f"(<= {LOSS_TOLERANCE}): {'ok' if a['passed'] else 'MISMATCH'}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-gpu", help="the build folder (its bin/ and test-corpus/)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu-bench.json"))
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--initial-weights-only", action="store_true",
                    help="only write the starting weights (device_check.sh: during the checks)")
    args = ap.parse_args()

    start = time.monotonic()
    bench = Bench(args)
    if args.initial_weights_only:
        bench.write_initial_weights()
        return 0
    gpu_bytes = gpu_memory_bytes(args.dry_run)
    candidates = candidate_batches(gpu_bytes)
    say(f"gpu_bench: {BENCH_MODEL.params() / 1e9:.3f} B parameters; batches to try "
        f"{candidates} (estimate at {candidates[0]}: {estimated_bytes(BENCH_MODEL, candidates[0]) / GIB:.0f} "
        f"GiB of {gpu_bytes / GIB:.0f})")
    if not bench.init.exists():  # else written during the checks (scripts/device_check.sh)
        bench.write_initial_weights()

    run, batch, tried_cpp = search(bench.runner, bench.fsdp_cpp, candidates, 240)
    from_batch = [b for b in candidates if b <= batch]
    runs = {"fsdp_cpp": (measure(run, batch, WARMUP), tried_cpp)}
    run, b, tried = search(bench.runner, bench.plain, from_batch, 240)
    runs["plain_libtorch"] = (measure(run, b, WARMUP), tried)
    run, b, tried = search(bench.runner, lambda b: bench.fsdp2(b, batch), from_batch, 240)
    runs["fsdp2"] = (measure(run, b, WARMUP), tried)
    run, b, tried = search(bench.runner, bench.offload, from_batch, 240)
    runs["fsdp_cpp_offload"] = (measure(run, b, OFFLOAD_WARMUP), tried)
    if args.dry_run:
        return 0

    results = {name: {**result, "batches_tried": tried} for name, (result, tried) in runs.items()}
    ratios = {"cpp_vs_plain_tokens_per_s": ratio(results, "fsdp_cpp", "plain_libtorch", "tokens_per_s"),
              "cpp_vs_fsdp2_tokens_per_s": ratio(results, "fsdp_cpp", "fsdp2", "tokens_per_s")}
    offload_ok = results["fsdp_cpp"]["ok"] and results["fsdp_cpp_offload"]["ok"]
    saving = (results["fsdp_cpp"]["mem_peak_bytes"] - results["fsdp_cpp_offload"]["mem_peak_bytes"]
              if offload_ok else None)
    summary = {
        "environment": environment(), "seconds": None,
        "model": {**vars(BENCH_MODEL), "vocab": VOCAB, "params": BENCH_MODEL.params(),
                  "flops_per_token": flops_per_token(BENCH_MODEL),
                  "flops_formula": "6 N + 12 L d seq, N = parameters less wpe"},
        "precision": " ".join(BF16), "lr": LR, "peak_tflops": PEAK_TFLOPS,
        "peak_note": "H100/H200 SXM dense bf16 datasheet peak", "gpu_memory_bytes": gpu_bytes,
        "estimated_bytes": {b: estimated_bytes(BENCH_MODEL, b) for b in BATCHES},
        "results": results, "ratios": ratios, "goals": goals(results, ratios),
        "offload": {"tokens_per_s_ratio": ratio(results, "fsdp_cpp_offload", "fsdp_cpp", "tokens_per_s"),
                    "peak_saving_bytes": saving,
                    "peak_saving_fraction": saving / results["fsdp_cpp"]["mem_peak_bytes"] if offload_ok else None},
        "loss_agreement": loss_agreement(results),
    }
    summary["seconds"] = round(time.monotonic() - start, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    say(table(summary))
    say(f"gpu_bench: {summary['seconds']:.0f} s; {args.out}")
    failed = [name for name, r in results.items() if not r["ok"]]
    mismatched = [name for name, a in summary["loss_agreement"].items() if not a["passed"]]
    if failed or mismatched:
        say(f"gpu_bench: FAILED: runs {failed or 'none'}, loss mismatch {mismatched or 'none'}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
