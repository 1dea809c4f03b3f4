"""The GPU benchmark: a 1.3 B-parameter GPT in bf16 on one GPU, interleaved with its peers.

    python3 bench/gpu_bench.py [--build build-gpu] [--out bench/results/gpu-bench.json]
    python3 bench/gpu_bench.py --dry-run                # print the commands, run nothing
    python3 bench/gpu_bench.py --initial-weights-only   # only FSDP2's starting weights
    python3 bench/gpu_bench.py --rehearse --build build --out DIR/gpu-bench.json
                                                        # all of it on the CPU, a tiny model (CI)

scripts/device_check.sh runs it after the GPU checks (and the last form during them: writing the
weights takes a minute of CPU work, which must not overlap a timed run). The model: 26 layers x
2048, 16 heads (head dim 128), seq 2048, the byte vocabulary: 1.314e9 parameters (GPT-3 XL's
shape, whose 1.3 B count includes a 50k-token vocabulary; 26 layers instead of 24 make up for our
256). Every run trains it in bf16 with fp32 masters, AdamW and fp32 gradient reduction, from the
same weights (the seed's, which gpt_train builds; FSDP2 loads them from a file that
gpt_train --reference --steps 0 --save-full writes) on the same batches (the first fsdp-cpp run's
--dump-batches):
  fsdp_cpp         fsdprun --nproc-per-node 1 gpt_train --device cuda --param-dtype bf16
                   --reduce-dtype fp32 (FULL_SHARD, W = 1, NCCL; the fused AdamW)
  plain_libtorch   gpt_train --reference --device cuda, same flags and the same fused AdamW: no
                   FSDP, mixed precision emulated (bf16 copies of the fp32 masters for forward and
                   backward, gradients added to the masters in fp32)
  fsdp2_foreach    bench/peer_fsdp2.py --device cuda under torchrun (W = 1, NCCL), the same
                   policy, PyTorch's default AdamW (foreach)
  fsdp2_fused      the same with AdamW(fused=True), FSDP2's best
  fsdp_cpp_offload the fsdp-cpp run with --cpu-offload (one run after the rounds: its steps take
                   seconds)
  fsdp_cpp_keep    the fsdp-cpp run with --no-reshard-after-forward (one run after the rounds, for
                   information, no goal: what keeping each unit's bf16 parameters from forward to
                   backward saves in casts at W = 1, and what it costs in memory)
and, beside the offload run, bench/host_adamw.py: one AdamW step of the whole model on the host's
CPU (the part of an offloaded step that only backward can hide).

The rehearsal (ctest device_check_rehearsal, every `make test`) runs this whole script on a CPU build:
a 2-layer model, CPU ranks over Gloo, the same contenders, rounds, measurements, reports and goals,
and the multi-GPU step as if there were two GPUs, so that a mistake of the script's own costs
seconds of CI, not a device run. Its numbers mean nothing.

Device machines differ by ~10% from one start to the next, and a GPU's clock moves with its
temperature and power, so the four are compared only interleaved: ROUNDS rounds, each running all
four once in a rotating order (A B C D, B C D A, ...); each run's nvidia-smi SM clock and power
(sampled every 500 ms) are logged with it. Per contender: the median over rounds of each run's
median step time, with the rounds' min and max. Batch: --batch (16), or the largest power of two
below it that fsdp-cpp fits in the first round. On a machine with more than one GPU, fsdp-cpp also
runs at W = GPU count (NCCL, batch / W per rank: the same global rows), for parity with W = 1 and
tokens/s per GPU.

Metrics, over the timed steps: tokens/s = batch x seq / median step time; model FLOP/s =
tokens/s x (6 N + 12 L d seq), with N the parameters less wpe's (a lookup, no matmul; wte counts,
as the tied head) and 12 L d seq the attention scores and values, forward and backward (PaLM's
and nanoGPT's convention: the causal mask's skipped half is counted); MFU = model FLOP/s / 989.4
TFLOP/s, the H100/H200 SXM datasheet's dense bf16 peak. Memory: the caching allocator's peak
allocated bytes in a step (mem_peak_bytes) and its reserved bytes, the maximum over all steps.

The losses must agree (same weights, rows and policy; bf16 rounding and kernels that accumulate
with atomics let them drift): relative difference <= 2e-2 at every step against fsdp-cpp. A
mismatch or a failed run exits 1 (after writing the results); the goals (GOALS) are reported, not
enforced. Writes --out (JSON) and the same name with .md.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_check import REPO, VOCAB, Model, Run, Runner, ensure_corpus, environment, relative_differences, say  # noqa: E402

BENCH_MODEL = Model(layers=26, dim=2048, heads=16, seq=2048)
REHEARSAL_MODEL = Model(layers=2, dim=64, heads=2, seq=32)
REHEARSAL_BATCH, REHEARSAL_GPUS = 4, 2
BF16 = ["--param-dtype", "bf16", "--reduce-dtype", "fp32"]
LR, SEED = "3e-4", "1234"
PEAK_TFLOPS = 989.4
BATCH = 16
ROUNDS = 2  # 3 before bench/gpu_models.py joined the device check: its 8 minutes hold both
WARMUP, TIMED = 2, 6
OFFLOAD_WARMUP, OFFLOAD_TIMED = 1, 3
LOSS_TOLERANCE = 2e-2
GIB = 1 << 30
CONTENDERS = ("fsdp_cpp", "plain_libtorch", "fsdp2_foreach", "fsdp2_fused")
LABELS = {"fsdp_cpp": "fsdp-cpp FULL_SHARD W=1", "plain_libtorch": "plain LibTorch (fused AdamW)",
          "fsdp2_foreach": "PyTorch FSDP2 W=1 (foreach)", "fsdp2_fused": "PyTorch FSDP2 W=1 (fused)",
          "fsdp_cpp_offload": "fsdp-cpp + CPU offload",
          "fsdp_cpp_keep": "fsdp-cpp, no reshard after forward (once)"}
GOALS = {"cpp_vs_fsdp2_fused_tokens_per_s": 1.02, "cpp_vs_plain_tokens_per_s": 1.0, "cpp_mfu": 0.58,
         "cpp_peak_vs_fsdp2_fused": 1.0, "offload_vs_cpp_tokens_per_s": 0.5,
         "offload_peak_vs_cpp_peak": 0.75}
LOWER_IS_BETTER = {"cpp_peak_vs_fsdp2_fused", "offload_peak_vs_cpp_peak"}


def flops_per_token(model):
    matmul_params = model.params() - model.seq * model.dim  # less wpe
    return 6 * matmul_params + 12 * model.layers * model.dim * model.seq


def gpu_count(dry_run):
    """GPUs visible, asked in a child process: this one holds no CUDA context."""
    if dry_run:
        return 1
    return int(subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                              capture_output=True, text=True, check=True).stdout)


class Telemetry:
    """nvidia-smi's SM clock (MHz) and power (W) of GPU 0, every 500 ms while a run lasts."""

    def __init__(self, path, dry_run):
        self.path, self.process = path, None
        if dry_run or not shutil.which("nvidia-smi"):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "w")
        self.process = subprocess.Popen(
            ["nvidia-smi", "--id=0", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
             "-lms", "500"], stdout=self.file, stderr=subprocess.DEVNULL)

    def stop(self):
        if self.process is None:
            return {"sm_clock_mhz": None, "power_w": None}
        self.process.terminate()
        self.process.wait()
        self.file.close()
        rows = []
        for line in self.path.read_text().splitlines():
            try:
                rows.append([float(x) for x in line.split(",")])
            except ValueError:
                continue
        if not rows:
            return {"sm_clock_mhz": None, "power_w": None}
        return {"sm_clock_mhz": statistics.median(r[0] for r in rows),
                "power_w": statistics.median(r[1] for r in rows), "samples": len(rows)}


def slice_batches(source, rows, destination):
    """The first `rows` rows of every step of a --dump-batches file (what gpt_train trains on at
    batch `rows`: a step's rows are a pure function of seed, step and row)."""
    import torch
    batches = torch.load(source)
    torch.save({key: value[:, :rows].contiguous() for key, value in batches.items()}, destination)


class Bench:
    def __init__(self, args):
        self.rehearsal = args.rehearse
        self.model = REHEARSAL_MODEL if args.rehearse else BENCH_MODEL
        self.device = "cpu" if args.rehearse else "cuda"
        work = Path(args.work) if args.work else Path(args.build) / "gpu-bench"
        self.runner = Runner(args.build, work, dry_run=args.dry_run, fixed_ports=not args.rehearse)
        self.work = self.runner.work
        self.dry_run = args.dry_run
        corpus = ensure_corpus(args.build, args.dry_run)
        m = self.model  # named for what determines them: a file of another model is not reused
        self.init = self.work / f"init-{m.layers}x{m.dim}-seq{m.seq}-seed{SEED}.pt"
        self.common = [*m.flags(), "--lr", LR, "--seed", SEED, "--data", str(corpus)]
        self.steps = WARMUP + TIMED

    def gpus(self):
        return REHEARSAL_GPUS if self.rehearsal else gpu_count(self.dry_run)

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

    def initial_weights_current(self):
        """Whether the weights file was written by this gpt_train (a rebuilt one may initialise
        differently: the file is named by model and seed only)."""
        gpt_train = self.runner.bin / "gpt_train"
        return (self.init.exists() and gpt_train.exists()
                and self.init.stat().st_mtime >= gpt_train.stat().st_mtime)

    def gpt_args(self, batch, steps):
        return ["--device", self.device, *self.common, *BF16, "--batch", str(batch), "--steps", str(steps),
                "--optimizer", "fused"]

    def make(self, kind, batch, tag, world=1):
        """The run of `kind` at `batch` (per rank), named with `tag`."""
        name = f"{kind}_b{batch}_{tag}"
        if kind == "fsdp_cpp":
            dump = ["--dump-batches", str(self.batches_file(batch))] if tag == "r1" else []
            return self.runner.fsdp(name, world, [*self.gpt_args(batch, self.steps), *dump])
        if kind == "plain_libtorch":
            return self.runner.reference(name, 1, self.gpt_args(batch, self.steps))
        if kind == "fsdp_cpp_offload":
            return self.runner.fsdp(name, 1, [*self.gpt_args(batch, OFFLOAD_WARMUP + OFFLOAD_TIMED),
                                              "--cpu-offload"])
        if kind == "fsdp_cpp_keep":
            return self.runner.fsdp(name, 1, [*self.gpt_args(batch, self.steps), "--no-reshard-after-forward"])
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
               "--log-dir", self.work / name / "torchrun", REPO / "bench" / "peer_fsdp2.py",
               "--device", self.device, *self.model.flags(), *BF16,
               "--batch", str(batch), "--steps", str(self.steps), "--lr", LR,
               "--init-from", self.init, "--batches", self.batches_file(batch),
               "--metrics", self.runner.metrics_pattern(name)]
        return Run(name, cmd + (["--fused"] if kind == "fsdp2_fused" else []))

    def execute(self, run, timeout_s=240):
        telemetry = Telemetry(self.work / run.name / "nvidia-smi.csv", self.dry_run)
        self.runner.execute(run, timeout_s)
        run.telemetry = telemetry.stop()
        return run


def measure(run, model, batch, warmup, world=1):
    """Throughput and memory of a run over its timed steps (tokens/s of all ranks together)."""
    base = {"batch": batch, "world": world, "rc": run.rc, "log": str(run.log),
            "telemetry": getattr(run, "telemetry", None)}
    if not run.ok:
        return {**base, "ok": False, "out_of_memory": run.out_of_memory}
    records = run.metrics[0]
    step_ms = statistics.median(r["step_ms"] for r in records[warmup:])
    tokens_per_s = world * batch * model.seq / (step_ms / 1000)
    tflops = tokens_per_s * flops_per_token(model) / 1e12
    return {**base, "ok": True, "step_ms_median": step_ms, "step_ms": [r["step_ms"] for r in records],
            "tokens_per_s": tokens_per_s, "model_tflops": tflops, "mfu": tflops / PEAK_TFLOPS / world,
            "mem_peak_bytes": run.max_over_ranks_and_steps("mem_peak_bytes"),
            "mem_reserved_bytes": run.max_over_ranks_and_steps("mem_reserved_bytes"),
            "losses": run.losses(), "seconds": round(run.seconds, 1)}


def host_adamw(bench):
    """bench/host_adamw.py at the benchmark's model: what the CPU takes for one AdamW step (the
    host's part of the offload run's step); {"ok": False, ...} if it fails."""
    cmd = [sys.executable, str(REPO / "bench" / "host_adamw.py"), *bench.model.flags()]
    if bench.dry_run:
        say(" ".join(cmd))
        return None
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:  # reported as a failed run: the results are still written
        say("gpu_bench: host_adamw took over 300 s")
        return {"ok": False, "rc": None}
    if run.returncode != 0:
        say(f"gpu_bench: host_adamw failed (exit {run.returncode}): {run.stderr[-2000:]}")
        return {"ok": False, "rc": run.returncode}
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    say(f"gpu_bench: host AdamW {measured['step_ms']:.0f} ms/step, {measured['gb_per_s']:.1f} GB/s, "
        f"{measured['threads']} threads")
    return {"ok": True, **measured}


def first_fitting_cpp(bench, batch):
    """Round 1's fsdp-cpp run at `batch`, halved while it runs out of memory."""
    while True:
        run = bench.execute(bench.make("fsdp_cpp", batch, "r1"))
        if bench.dry_run or not run.out_of_memory or batch == 1:
            return run, batch
        batch //= 2


def interleaved_rounds(bench, batch):
    """ROUNDS rounds of the four contenders in rotating order; returns the runs' measurements per
    contender and the batch (fsdp-cpp's, after the first round's search)."""
    runs = {kind: [] for kind in CONTENDERS}
    for r in range(ROUNDS):
        order = CONTENDERS[r % len(CONTENDERS):] + CONTENDERS[:r % len(CONTENDERS)]
        for kind in order:
            if kind == "fsdp_cpp" and r == 0:
                run, batch = first_fitting_cpp(bench, batch)  # first: it dumps the batches
            else:
                run = bench.execute(bench.make(kind, batch, f"r{r + 1}"))
            runs[kind].append(measure(run, bench.model, batch, WARMUP))
            m = runs[kind][-1]
            if not bench.dry_run:
                say(f"gpu_bench round {r + 1} {kind}: " + (
                    f"{m['step_ms_median']:.0f} ms/step, {m['tokens_per_s']:.0f} tokens/s, "
                    f"SM {m['telemetry'].get('sm_clock_mhz')} MHz, {m['telemetry'].get('power_w')} W"
                    if m["ok"] else f"failed (exit {m['rc']})"))
    return runs, batch


def summarize(model, measurements):
    """Median over rounds of the runs' median step times, with the rounds' min and max."""
    ok = [m for m in measurements if m["ok"]]
    if len(ok) < len(measurements) or not ok:
        return {"ok": False, "runs": measurements}
    tokens = [m["tokens_per_s"] for m in ok]
    median = statistics.median(tokens)
    return {"ok": True, "batch": ok[0]["batch"], "world": ok[0]["world"], "tokens_per_s": median,
            "tokens_per_s_per_gpu": median / ok[0]["world"], "tokens_per_s_min": min(tokens),
            "tokens_per_s_max": max(tokens),
            "step_ms": ok[0]["batch"] * ok[0]["world"] * model.seq / median * 1000,
            "mfu": median * flops_per_token(model) / 1e12 / PEAK_TFLOPS / ok[0]["world"],
            "mem_peak_bytes": max(m["mem_peak_bytes"] for m in ok),
            "mem_reserved_bytes": max(m["mem_reserved_bytes"] for m in ok),
            "losses": ok[0]["losses"], "runs": measurements}


def ratio(a, b, key):
    """a[key] / b[key]; None where either run failed or b has no value (e.g. a peer that reports
    no memory on the CPU): a report with a gap beats no report."""
    if a and b and a.get("ok") and b.get("ok") and b.get(key):
        return a[key] / b[key]
    return None


def loss_agreement(results, base_name="fsdp_cpp"):
    """Each run's losses against fsdp-cpp's (same batch, same rows)."""
    base = results[base_name]
    agreement = {}
    for name, other in results.items():
        if name == base_name or not (base.get("ok") and other.get("ok")) or other["batch"] * other.get(
                "world", 1) != base["batch"]:
            continue
        diffs = relative_differences(other["losses"], base["losses"][:len(other["losses"])])
        agreement[name] = {"max_rel_diff": max(diffs), "step0_rel_diff": diffs[0],
                           "passed": max(diffs) <= LOSS_TOLERANCE}
    return agreement


def goals(results):
    cpp, fused = results["fsdp_cpp"], results["fsdp2_fused"]
    offload = results.get("fsdp_cpp_offload")
    values = {"cpp_vs_fsdp2_fused_tokens_per_s": ratio(cpp, fused, "tokens_per_s"),
              "cpp_vs_plain_tokens_per_s": ratio(cpp, results["plain_libtorch"], "tokens_per_s"),
              "cpp_mfu": cpp.get("mfu"),
              "cpp_peak_vs_fsdp2_fused": ratio(cpp, fused, "mem_peak_bytes"),
              "offload_vs_cpp_tokens_per_s": ratio(offload, cpp, "tokens_per_s"),
              "offload_peak_vs_cpp_peak": ratio(offload, cpp, "mem_peak_bytes")}
    met = lambda n, v: v is not None and (v <= GOALS[n] if n in LOWER_IS_BETTER else v >= GOALS[n])
    return {n: {"value": v, "goal": GOALS[n], "lower_is_better": n in LOWER_IS_BETTER, "met": met(n, v)}
            for n, v in values.items()}


def markdown(summary):
    title = "rehearsal on the CPU (numbers mean nothing)" if summary["rehearsal"] else "GPU benchmark"
    lines = [f"# {title}: {summary['model']['params'] / 1e9:.3f} B GPT, bf16, batch "
             f"{summary['batch']}, {ROUNDS} interleaved rounds", "",
             f"{summary['environment']}", "",
             "| run | tokens/s (median [min-max]) | step ms | MFU | peak GiB | reserved GiB |",
             "|---|---|---|---|---|---|"]
    for name, r in summary["results"].items():
        if not r.get("ok"):
            lines.append(f"| {LABELS.get(name, name)} | failed | | | | |")
            continue
        spread = (f" [{r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}]"
                  if "tokens_per_s_min" in r else "")
        label = LABELS.get(name, name)
        if r["world"] > 1:
            label = f"fsdp-cpp FULL_SHARD W={r['world']} ({r['tokens_per_s_per_gpu']:.0f} tokens/s per GPU)"
        lines.append(f"| {label} | {r['tokens_per_s']:.0f}{spread} | {r['step_ms']:.0f} | "
                     f"{100 * r['mfu']:.1f}% | {r['mem_peak_bytes'] / GIB:.1f} | "
                     f"{r['mem_reserved_bytes'] / GIB:.1f} |")
    host = summary["host_adamw"]
    if host.get("ok"):
        lines += ["", f"Host AdamW (bench/host_adamw.py: the CPU's part of an offloaded step, ATen's fused "
                      f"kernel over every fp32 shard): {host['step_ms']:.1f} ms per step, "
                      f"{host['gb_per_s']:.1f} GB/s at 28 bytes an element, {host['threads']} threads. "
                      f"Backward hides at most its own length of it; an offload step takes about forward "
                      f"plus the longer of backward and this."]
    lines += ["", "| goal | value | target | |", "|---|---|---|---|"]
    for name, g in summary["goals"].items():
        value = "n/a" if g["value"] is None else f"{g['value']:.3f}"
        lines.append(f"| {name} | {value} | {'<=' if g['lower_is_better'] else '>='} {g['goal']} | "
                     f"{'met' if g['met'] else 'NOT met'} |")
    lines += ["", "Runs (round, SM clock MHz, power W, ms/step):"]
    for name, r in summary["results"].items():
        for k, m in enumerate(r.get("runs", [])):
            t = m.get("telemetry") or {}
            lines.append(f"- {name} run {k + 1}: {t.get('sm_clock_mhz')} MHz, {t.get('power_w')} W, "
                         f"{m.get('step_ms_median', 'failed')}")
    for name, a in summary["loss_agreement"].items():
        lines.append(f"- losses {name} vs fsdp-cpp: max rel diff {a['max_rel_diff']:.1e} "
                     f"(<= {LOSS_TOLERANCE}): {'ok' if a['passed'] else 'MISMATCH'}")
    lines += ["", f"Command: `python3 bench/gpu_bench.py` (scripts/device_check.sh); {summary['seconds']} s"]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-gpu", help="the build folder (its bin/ and test-corpus/)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu-bench.json"))
    ap.add_argument("--batch", type=int, default=BATCH, help="sequences per step (halved if fsdp-cpp runs out of memory)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--rehearse", action="store_true",
                    help="run it all on the CPU with a tiny model (a CPU build; CI's device_check_rehearsal)")
    ap.add_argument("--work", help="the runs' folder (default: BUILD/gpu-bench)")
    ap.add_argument("--initial-weights-only", action="store_true",
                    help="only write the starting weights (device_check.sh: during the checks)")
    args = ap.parse_args()

    start = time.monotonic()
    if args.rehearse and args.batch == BATCH:
        args.batch = REHEARSAL_BATCH
    bench = Bench(args)
    if args.initial_weights_only:
        bench.write_initial_weights()
        return 0
    say(f"gpu_bench: {bench.model.params() / 1e9:.3f} B parameters, batch {args.batch}, {ROUNDS} rounds of "
        f"{', '.join(CONTENDERS)}")
    if not bench.initial_weights_current():  # else written during the checks (scripts/device_check.sh)
        bench.write_initial_weights()
    runs, batch = interleaved_rounds(bench, args.batch)
    results = {kind: summarize(bench.model, measurements) for kind, measurements in runs.items()}
    if not bench.rehearsal:  # CPU offload needs a GPU
        offload = bench.execute(bench.make("fsdp_cpp_offload", batch, "once"))
        results["fsdp_cpp_offload"] = summarize(bench.model, [measure(offload, bench.model, batch, OFFLOAD_WARMUP)])
    host = host_adamw(bench)  # beside the offload run: the part of its step the CPU does
    keep = bench.execute(bench.make("fsdp_cpp_keep", batch, "once"))
    results["fsdp_cpp_keep"] = summarize(bench.model, [measure(keep, bench.model, batch, WARMUP)])
    gpus = bench.gpus()
    if gpus > 1 and batch % gpus == 0:  # the first multi-GPU machine measures scaling as it is
        run = bench.execute(bench.make("fsdp_cpp", batch // gpus, f"w{gpus}", world=gpus))
        results[f"fsdp_cpp_w{gpus}"] = summarize(bench.model, [measure(run, bench.model, batch // gpus, WARMUP, world=gpus)])
    if args.dry_run:
        return 0
    m = bench.model
    summary = {"environment": environment(), "seconds": round(time.monotonic() - start, 1), "batch": batch,
               "rehearsal": bench.rehearsal, "device": bench.device,
               "model": {**vars(m), "vocab": VOCAB, "params": m.params(), "flops_per_token": flops_per_token(m)},
               "precision": " ".join(BF16), "lr": LR, "peak_tflops": PEAK_TFLOPS, "rounds": ROUNDS,
               "results": results, "goals": goals(results), "loss_agreement": loss_agreement(results),
               "host_adamw": host}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(markdown(summary))
    say(markdown(summary))
    failed = [name for name, r in {**results, "host_adamw": host}.items() if not r.get("ok")]
    mismatched = [name for name, a in summary["loss_agreement"].items() if not a["passed"]]
    if failed or mismatched:
        say(f"gpu_bench: FAILED: runs {failed or 'none'}, loss mismatch {mismatched or 'none'}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
