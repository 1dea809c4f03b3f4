"""The GPU checks: gpt_train sharded by fsdp-cpp against plain LibTorch on one GPU.

    python3 tests/gpu_check.py [--build build-gpu] [--out bench/results/gpu-check.json]
    python3 tests/gpu_check.py --dry-run           # print the commands, run nothing
    python3 tests/gpu_check.py --device cpu        # the same checks, bar offload, on a CPU build

scripts/device_check.sh runs it after building. Plain Python (no pytest); every check prints PASS
or FAIL with its numbers, the summary goes to --out as JSON, and the exit status is 1 if any check
failed. The runs are independent processes and run a few at a time (none is timed).

What is compared. One small GPT (4 layers x 256, 4 heads, seq 128, 4 sequences per rank, 8 AdamW
steps, lr 1e-3, same seed, hence the same weights and batches everywhere) trained by:
  - fsdprun --nproc-per-node W gpt_train --device cuda ...     fsdp-cpp, W ranks
  - gpt_train --reference --world-size W --device cuda ...      plain LibTorch, no FSDP, one process
                                                                on the same global batch of W x 4
The checks:
  (a) W = 1 over NCCL: losses against the reference; peak GPU memory (the caching allocator's
      allocated bytes, metrics key mem_peak_bytes) against the bound below;
  (b) W = 2 ranks sharing the GPU, FSDP_CUDA_COLLECTIVES=staged (NCCL refuses two ranks on one
      device): FULL_SHARD and SHARD_GRAD_OP against the W = 2 reference; W = 4, HYBRID_SHARD with
      shard groups of 2, against the W = 4 reference;
  (c) --cpu-offload at W = 1 (NCCL) and W = 2 (staged) against the references, and the GPU memory
      it saves;
  (d) bf16 mixed precision (--param-dtype bf16 --reduce-dtype fp32) at W = 1 against the reference
      with the same policy (gpt_train --reference emulates it unsharded) and against fp32.

Tolerances (relative difference of the losses, |a - b| / |b|, at step 0 and at every step):
  fp32: step 0 <= 5e-5, every step <= 1e-4. Both sides compute in true fp32: TF32 stays off
    (LibTorch's default, and NVIDIA_TF32_OVERRIDE=0 in every run), so they differ only by summation
    order (the gradient of W ranks' rows reduced across ranks instead of in one batch; the CPU
    optimizer under offload) and by CUDA kernels that accumulate with atomics (embedding and
    attention backward), ~1e-7 per step, which AdamW can grow over a few steps. These are the
    CPU benchmark's tolerances (bench/README.md), there measured at ~300x the noise.
  bf16 against the same policy: step 0 <= 5e-5 (same bf16 weights and kernels), every step <=
    1e-3: an atomics-order difference in an fp32 gradient can flip the bf16 rounding of a
    parameter at the next step, a difference of bf16's unit roundoff (3.9e-3) on that element.
  bf16 against fp32: every step <= 2e-2: bf16's 8-bit mantissa moves the loss by ~1e-3 at step 0;
    a model that stopped learning or a policy that broke the masters departs by far more.

Memory bound at W = 1 (the FULL_SHARD bound of bench/README.md, "Bound", with W = 1; psi: element counts from the
model's shapes, Psi = sum over units):
  bound = 16 Psi                   fp32 parameters, gradients and AdamW's two moments
        + 8 psi_root               the root unit's unsharded parameters and gradients
        + 8 (psi_a + psi_b)        the two largest blocks' (the rate limiter's two in flight)
        + activations              the reference's peak minus its step-start level (its current
                                   bytes after a step less the 4 Psi of gradients zero_grad frees)
  and the check is peak <= 1.05 x bound + 64 MiB (cuBLAS and attention workspaces).
"""

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VOCAB = 256  # byte-level GPT
MIB = 1 << 20


@dataclass(frozen=True)
class Model:
    layers: int
    dim: int
    heads: int
    seq: int

    def flags(self):
        return ["--layers", str(self.layers), "--dim", str(self.dim), "--heads", str(self.heads),
                "--seq", str(self.seq)]

    def block_params(self):
        """One block: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj (weights and biases)."""
        d = self.dim
        return 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)

    def root_params(self):
        """The root unit: wte (the head shares it), wpe, ln_f."""
        return VOCAB * self.dim + self.seq * self.dim + 2 * self.dim

    def params(self):
        return self.root_params() + self.layers * self.block_params()


CHECK_MODEL = Model(layers=4, dim=256, heads=4, seq=128)
CHECK_TRAINING = ["--batch", "4", "--steps", "8", "--lr", "1e-3", "--seed", "1234"]
BF16 = ["--param-dtype", "bf16", "--reduce-dtype", "fp32"]


@dataclass(frozen=True)
class Tolerance:
    step0: float
    every: float


FP32_TOLERANCE = Tolerance(step0=5e-5, every=1e-4)
BF16_SAME_POLICY_TOLERANCE = Tolerance(step0=5e-5, every=1e-3)
BF16_VS_FP32_TOLERANCE = Tolerance(step0=2e-2, every=2e-2)
BOUND_FACTOR, BOUND_SLACK = 1.05, 64 * MIB


# ---- Running the programs (shared with bench/gpu_bench.py) ----

@dataclass
class Run:
    """One program run: its command, and what it left behind once run."""
    name: str
    cmd: list
    world: int = 1
    env: dict = field(default_factory=dict)
    writes_metrics: bool = True  # JSON lines per rank (gpt_train --metrics)
    rc: int = None
    seconds: float = 0.0
    log: Path = None
    metrics: list = field(default_factory=list)  # per rank: that rank's JSON lines
    out_of_memory: bool = False

    @property
    def ok(self):
        return self.rc == 0 and (not self.writes_metrics or all(self.metrics))

    def losses(self):
        return [record["loss"] for record in self.metrics[0]]

    def max_over_ranks_and_steps(self, key):
        return max(record.get(key, 0) for rank in self.metrics for record in rank)

    def summary(self):
        return {"cmd": " ".join(str(c) for c in self.cmd), "env": self.env, "rc": self.rc,
                "seconds": round(self.seconds, 1), "out_of_memory": self.out_of_memory,
                "log": str(self.log), "losses": self.losses() if self.ok else None,
                "mem_peak_bytes": self.max_over_ranks_and_steps("mem_peak_bytes") if self.ok else None}


class Runner:
    """Runs programs of a build with their logs and metrics under one work folder."""

    def __init__(self, build, work, dry_run=False, timeout_s=180, fixed_ports=True):
        self.bin = Path(build).resolve() / "bin"
        self.work = Path(work).resolve()
        self.dry_run = dry_run
        self.timeout_s = timeout_s
        # fsdprun's rendezvous: one port per launch, as launches overlap (on a machine of our own);
        # else (a rehearsal among other tests) fsdprun picks a free one.
        self.next_port = 29600 if fixed_ports else None

    def fsdp(self, name, world, args, env=None):
        """`fsdprun --nproc-per-node world gpt_train args`, metrics per rank."""
        port = []
        if self.next_port is not None:
            port = ["--master-port", str(self.next_port)]
            self.next_port += 1
        cmd = [self.bin / "fsdprun", "--nproc-per-node", str(world), *port,
               self.bin / "gpt_train", *args, "--metrics", self.metrics_pattern(name)]
        return Run(name, cmd, world, dict(env or {}))

    def reference(self, name, world, args):
        """`gpt_train --reference --world-size world args`: one process, the global batch."""
        cmd = [self.bin / "gpt_train", "--reference", "--world-size", str(world), *args,
               "--metrics", self.metrics_pattern(name)]
        return Run(name, cmd)

    def metrics_pattern(self, name):
        return str(self.work / name / "metrics-{rank}.jsonl")

    def execute(self, run, timeout_s=None):
        """Runs `run` to completion (or its timeout) and reads its metrics."""
        folder = self.work / run.name
        run.log = folder / "log.txt"
        say(f"--- {run.name}: {' '.join(f'{k}={v}' for k, v in run.env.items())} "
            f"{' '.join(str(c) for c in run.cmd)}")
        if self.dry_run:
            return run
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("metrics-*.jsonl"):
            old.unlink()
        start = time.monotonic()
        with open(run.log, "w") as log:
            # Its own process group: a timeout ends the launcher and its ranks alike.
            process = subprocess.Popen([str(c) for c in run.cmd], stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, **run.env}, start_new_session=True)
            try:
                run.rc = process.wait(timeout=timeout_s or self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                run.rc = "timeout"
        run.seconds = time.monotonic() - start
        text = run.log.read_text(errors="replace")
        run.out_of_memory = "out of memory" in text.lower()
        if run.writes_metrics:
            run.metrics = [read_jsonl(folder / f"metrics-{rank}.jsonl") for rank in range(run.world)]
        if not run.ok:
            tail = "\n".join(text.splitlines()[-15:])
            say(f"--- {run.name} failed (exit {run.rc}{', out of memory' if run.out_of_memory else ''}):"
                f"\n{tail}")
        return run

    def execute_all(self, runs, parallel):
        with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(self.execute, runs))


def say(text):
    """One line (or block) in one write: the runs' threads do not interleave within it."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def read_jsonl(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ensure_corpus(build, dry_run):
    """The tests' corpus (generated by CMake's configure step; regenerated if missing)."""
    corpus = Path(build).resolve() / "test-corpus" / "corpus.txt"
    if not (corpus.exists() or dry_run):
        subprocess.run([sys.executable, REPO / "tests" / "data" / "make_corpus.py", corpus], check=True)
    return corpus


def environment():
    """What ran: the GPU, PyTorch, the source state (None where unknown, e.g. a tree without .git)."""
    info = {"python": sys.version.split()[0]}
    try:
        import torch
        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        info["torch"] = info["gpu"] = None
    try:
        info["git_head"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                          text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["git_head"] = None
    info["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return info


def relative_differences(losses, reference):
    return [abs(a - b) / abs(b) for a, b in zip(losses, reference)]


# ---- The checks ----

def plan_runs(runner, device, corpus):
    """Every run the checks compare, by name. Offload needs a GPU and is left out on a CPU."""
    common = ["--device", device, *CHECK_MODEL.flags(), *CHECK_TRAINING, "--data", str(corpus)]
    staged = {"FSDP_CUDA_COLLECTIVES": "staged"} if device != "cpu" else {}
    runs = [
        runner.reference("reference_w1", 1, common),
        runner.reference("reference_w2", 2, common),
        runner.reference("reference_w4", 4, common),
        runner.reference("reference_w1_bf16", 1, [*common, *BF16]),
        runner.fsdp("nccl_w1", 1, common),
        runner.fsdp("staged_w2_full", 2, [*common, "--strategy", "full"], staged),
        runner.fsdp("staged_w2_grad_op", 2, [*common, "--strategy", "grad_op"], staged),
        runner.fsdp("staged_w4_hybrid", 4, [*common, "--strategy", "hybrid", "--shard-group-size", "2"],
                    staged),
        runner.fsdp("bf16_w1", 1, [*common, *BF16]),
    ]
    if device != "cpu":
        runs += [runner.fsdp("offload_w1", 1, [*common, "--cpu-offload"]),
                 runner.fsdp("offload_w2_staged", 2, [*common, "--cpu-offload"], staged)]
    for run in runs:
        run.env.update({"OMP_NUM_THREADS": "4",  # a few runs share the machine's cores
                        "FSDP_TIMEOUT_SECONDS": "60",
                        "NVIDIA_TF32_OVERRIDE": "0"})  # cuBLAS: no TF32, whatever the code asks
    return {run.name: run for run in runs}


def parity(name, runs, sharded, reference, tolerance):
    a, b = runs[sharded], runs[reference]
    if not (a.ok and b.ok):
        return failed_runs(name, a, b)
    diffs = relative_differences(a.losses(), b.losses())
    passed = (len(diffs) == len(b.losses()) and diffs[0] <= tolerance.step0
              and max(diffs) <= tolerance.every)
    return {"name": name, "passed": passed, "runs": [sharded, reference],
            "step0_rel_diff": diffs[0], "max_rel_diff": max(diffs), "tolerance": vars(tolerance),
            "bitwise_equal": a.losses() == b.losses(),
            "text": f"step-0 rel diff {diffs[0]:.1e} (<= {tolerance.step0:.0e}), max over "
                    f"{len(diffs)} steps {max(diffs):.1e} (<= {tolerance.every:.0e}), losses "
                    f"{'bitwise equal' if a.losses() == b.losses() else 'not bitwise equal'}; "
                    f"last {a.losses()[-1]:.5f} vs {b.losses()[-1]:.5f}"}


def memory_bound(name, runs, sharded, reference):
    a, b = runs[sharded], runs[reference]
    if not (a.ok and b.ok):
        return failed_runs(name, a, b)
    total, root, block = CHECK_MODEL.params(), CHECK_MODEL.root_params(), CHECK_MODEL.block_params()
    in_flight = 8 * root + 8 * min(2, CHECK_MODEL.layers) * block  # the blocks are alike
    reference_step_start = b.metrics[0][-1]["mem_current_bytes"] - 4 * total
    activations = b.max_over_ranks_and_steps("mem_peak_bytes") - reference_step_start
    bound = 16 * total + in_flight + activations
    limit = BOUND_FACTOR * bound + BOUND_SLACK
    peak = a.max_over_ranks_and_steps("mem_peak_bytes")
    return {"name": name, "passed": peak <= limit, "runs": [sharded, reference], "peak_bytes": peak,
            "bound_bytes": bound, "limit_bytes": limit, "params": total,
            "terms_bytes": {"states_16psi": 16 * total, "unsharded_in_flight": in_flight,
                            "activations_from_reference": activations},
            "reserved_bytes": a.max_over_ranks_and_steps("mem_reserved_bytes"),
            "text": f"peak {peak / MIB:.1f} MiB <= {BOUND_FACTOR} x bound {bound / MIB:.1f} MiB + "
                    f"{BOUND_SLACK // MIB} MiB = {limit / MIB:.1f} MiB (16 Psi {16 * total / MIB:.1f}, "
                    f"in flight {in_flight / MIB:.1f}, activations {activations / MIB:.1f}; "
                    f"ratio {peak / bound:.2f})"}


def offload_saving(name, runs, offloaded, resident):
    """CPU offload keeps the 16 Psi of shards, gradient shards and moments off the GPU: at least
    half of that must show in the peak (the rest may go to copies in flight)."""
    a, b = runs[offloaded], runs[resident]
    if not (a.ok and b.ok):
        return failed_runs(name, a, b)
    peak_off, peak_on = a.max_over_ranks_and_steps("mem_peak_bytes"), b.max_over_ranks_and_steps("mem_peak_bytes")
    required = 8 * CHECK_MODEL.params()
    return {"name": name, "passed": peak_on - peak_off >= required, "runs": [offloaded, resident],
            "peak_offload_bytes": peak_off, "peak_resident_bytes": peak_on, "required_saving_bytes": required,
            "text": f"peak {peak_off / MIB:.1f} MiB with offload vs {peak_on / MIB:.1f} MiB without: "
                    f"saves {(peak_on - peak_off) / MIB:.1f} MiB (>= 8 Psi = {required / MIB:.1f} MiB)"}


def failed_runs(name, *runs):
    bad = [f"{r.name} (exit {r.rc}{', out of memory' if r.out_of_memory else ''}; log {r.log})"
           for r in runs if not r.ok]
    return {"name": name, "passed": False, "runs": [r.name for r in runs],
            "text": "run failed: " + ", ".join(bad)}


def evaluate(runs, device):
    checks = [
        parity("a_w1_nccl_parity", runs, "nccl_w1", "reference_w1", FP32_TOLERANCE),
        memory_bound("a_w1_nccl_memory_bound", runs, "nccl_w1", "reference_w1"),
        parity("b_w2_staged_full_shard_parity", runs, "staged_w2_full", "reference_w2", FP32_TOLERANCE),
        parity("b_w2_staged_shard_grad_op_parity", runs, "staged_w2_grad_op", "reference_w2", FP32_TOLERANCE),
        parity("b_w4_staged_hybrid_parity", runs, "staged_w4_hybrid", "reference_w4", FP32_TOLERANCE),
        parity("d_bf16_w1_vs_bf16_reference", runs, "bf16_w1", "reference_w1_bf16", BF16_SAME_POLICY_TOLERANCE),
        parity("d_bf16_w1_tracks_fp32_reference", runs, "bf16_w1", "reference_w1", BF16_VS_FP32_TOLERANCE),
    ]
    if device != "cpu":
        checks += [
            parity("c_offload_w1_parity", runs, "offload_w1", "reference_w1", FP32_TOLERANCE),
            parity("c_offload_w2_staged_parity", runs, "offload_w2_staged", "reference_w2", FP32_TOLERANCE),
            offload_saving("c_offload_w1_memory_saving", runs, "offload_w1", "nccl_w1"),
        ]
    return sorted(checks, key=lambda check: check["name"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-gpu", help="the build folder (its bin/ and test-corpus/)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu-check.json"))
    ap.add_argument("--parallel", type=int, default=4, help="runs at a time")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--work", help="the runs' folder (default: BUILD/gpu-check)")
    args = ap.parse_args()

    # On a CPU (CI's tests/device_check_rehearsal.py, among other tests) fsdprun picks free ports.
    runner = Runner(args.build, args.work or Path(args.build) / "gpu-check", dry_run=args.dry_run,
                    fixed_ports=args.device == "cuda")
    corpus = ensure_corpus(args.build, args.dry_run)
    runs = plan_runs(runner, args.device, corpus)
    start = time.monotonic()
    runner.execute_all(runs.values(), args.parallel)
    if args.dry_run:
        return 0

    checks = evaluate(runs, args.device)
    for check in checks:
        print(f"{'PASS' if check['passed'] else 'FAIL'} {check['name']}: {check['text']}")
    passed = all(check["passed"] for check in checks)
    summary = {"passed": passed, "device": args.device, "environment": environment(),
               "model": vars(CHECK_MODEL), "training": " ".join(CHECK_TRAINING),
               "params": CHECK_MODEL.params(), "seconds": round(time.monotonic() - start, 1),
               "checks": checks, "runs": {name: run.summary() for name, run in runs.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"gpu_check: {sum(c['passed'] for c in checks)}/{len(checks)} checks passed in "
          f"{summary['seconds']:.0f} s; {args.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
