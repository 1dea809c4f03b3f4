"""`make bench`: this project's FSDP (gpt_train under fsdprun) against PyTorch FSDP2 (bench/peer_fsdp2.py
under torchrun), against the unsharded floor (gpt_train --reference --world-size 1 on one rank's
batch) and against the concurrent floor (W such one-rank processes at the same time, no
communication), interleaved in one session on W local ranks of this machine (Gloo, CPU, one thread
per process), in fp32 and in bf16 mixed precision.

Run from the repository root:  .venv/bin/python bench/run_bench.py [--quick] [--configs A,B] [--rounds N]
The full run writes bench/results/latest.{json,md,png} and refuses a dirty tree or stale binaries
(--allow-dirty runs anyway and flags the results); a partial run (--quick, --configs, --rounds) writes
to build/bench/results unless --out says otherwise. Exits non-zero when a run fails or when the C++
and the peer loss curves disagree beyond the tolerance (a correctness failure); the performance goals
are reported, never enforced. See bench/README.md.
"""

import argparse
import hashlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_bf16  # noqa: E402
import muon_bench  # noqa: E402
import pipeline_bench  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
GPT_TRAIN = os.path.join(BUILD, "bin", "gpt_train")
FSDPRUN = os.path.join(BUILD, "bin", "fsdprun")
VENV = os.path.join(ROOT, ".venv", "bin")
PEER = os.path.join(ROOT, "bench", "peer_fsdp2.py")
PEER_PIPELINE = os.path.join(ROOT, "bench", "peer_pipeline.py")
RESULTS = os.path.join(ROOT, "bench", "results")

# Each configuration: the model, the per-rank batch, steps per run (the first `warmup` are not
# timed), rounds (each round runs every kind once, in a rotating order) and the compute dtype (bf16:
# --param-dtype bf16 --reduce-dtype fp32 on every side; `fp32_config` is its fp32 twin).
SMALL = dict(layers=4, dim=128, heads=4, seq=128, batch=8, lr=1e-3)
# Medium's goal against the concurrent floor (1.05) is within 1-2 % of what it measures: five
# rounds, where three put single rounds at 1.01-1.09.
MEDIUM = dict(layers=8, dim=512, heads=8, seq=256, batch=4, lr=3e-4, steps=6, warmup=2, rounds=5)
CONFIGS = {
    "small": dict(SMALL, steps=14, warmup=2, rounds=3, dtype="fp32"),
    "medium": dict(MEDIUM, dtype="fp32"),
    "small-bf16": dict(SMALL, steps=6, warmup=2, rounds=3, dtype="bf16", fp32_config="small"),
    # Many units and almost no compute: the step is FSDP's cost per unit (issue 36). Its runs are
    # short (a step is ~18 ms): more steps and rounds than the others, or the machine's drifts
    # between runs move its ratio by ±5 % (bench/README.md, "Measuring deep"; single rounds range
    # 0.95-1.28 × the concurrent floor, so 18 rounds). The peer, 15 times slower and 0.25 × its
    # goal, runs in the first 3 rounds only.
    "deep": dict(layers=48, dim=32, heads=2, seq=16, batch=1, lr=1e-3, steps=60, warmup=5, rounds=18,
                 peer_rounds=3, dtype="fp32"),
    # small's shapes as a Llama (2 key/value heads, SwiGLU, an untied head; issue 36): the peer is
    # FSDP2 on transformers' own LlamaForCausalLM, loaded from gpt_train's --export-hf of init.pt.
    "llama-small": dict(SMALL, model="llama", kv_heads=2, steps=14, warmup=2, rounds=3, dtype="fp32"),
    # medium's shapes as a Llama (2 key/value heads of 8, SwiGLU 1376, untied head).
    "llama-medium": dict(MEDIUM, model="llama", kv_heads=2, dtype="fp32"),
    # The two Llamas with --optimizer muon (issue 51; bench/muon_bench.py): Muon (lr 0.02, Keller
    # Jordan's) on the blocks' matrices, the fused AdamW on the rest; the fused AdamW run of the
    # same model, the Muon floors and FSDP2 + torch.optim.Muon in the same rounds.
    "llama-small-muon": dict(SMALL, model="llama", kv_heads=2, steps=14, warmup=2, rounds=3, dtype="fp32",
                             optimizer="muon", muon_lr=0.02),
    # Three rounds, not medium's five: its goals are far from its noise (five kinds a round).
    "llama-medium-muon": dict(MEDIUM, model="llama", kv_heads=2, dtype="fp32", rounds=3, optimizer="muon",
                              muon_lr=0.02),
    # small's Llama split into 2 pipeline stages (issue 60; bench/pipeline_bench.py) against
    # torch.distributed.pipelining + FSDP2: 1F1B at pp 2 (W = 2), GPipe at pp 2 × dp 2 (W = 4).
    "llama-pp2-1f1b": dict(SMALL, model="llama", kv_heads=2, batch=2, microbatches=4, pp=2, world=2,
                           schedule="1f1b", steps=10, warmup=2, rounds=3, dtype="fp32"),
    "llama-pp2-dp2-gpipe": dict(SMALL, model="llama", kv_heads=2, batch=2, microbatches=4, pp=2, world=4,
                                schedule="gpipe", steps=10, warmup=2, rounds=3, dtype="fp32"),
}
TINY = dict(layers=2, dim=64, heads=4, seq=32, batch=2, lr=1e-3, steps=3, warmup=1, rounds=1)
QUICK_CONFIGS = {
    "tiny": dict(TINY, dtype="fp32"),
    "tiny-wide": dict(TINY, dim=128, seq=64, dtype="fp32"),
    "tiny-bf16": dict(TINY, dtype="bf16", fp32_config="tiny"),
    "tiny-llama": dict(TINY, model="llama", kv_heads=2, dtype="fp32"),
    "tiny-llama-muon": dict(TINY, model="llama", kv_heads=2, dtype="fp32", optimizer="muon", muon_lr=0.02),
    "tiny-llama-pp2": dict(TINY, model="llama", kv_heads=2, microbatches=2, pp=2, world=2, schedule="1f1b",
                           dtype="fp32"),
}
KINDS = ("cpp", "peer", "floor", "concurrent_floor")  # round 0 starts with cpp: it dumps the batches


def kinds_of(c):
    """The runs of a round: a Muon configuration's (bench/muon_bench.py), a pipelined one's
    (bench/pipeline_bench.py), else the four."""
    if pipeline_bench.is_pipeline(c):
        return pipeline_bench.KINDS
    return muon_bench.KINDS if muon_bench.is_muon(c) else KINDS

SEED = 1234
MAX_DATA_MB = 8
IDLE_WAIT_S = 5

# Loss agreement (see bench/README.md, "Loss agreement"), relative to the peer: (step 0, any step).
# fp32: both sides compute from the same weights on the same rows, so the curves differ only by
# float reassociation: measured ≤ 3e-7 over 14 steps (step 0 bitwise equal), and ~1e-5 is the most
# one should expect early on. A peer with a deliberate architectural or optimizer difference (erf
# GELU, LayerNorm eps 1e-6, weight decay on every parameter, betas (0.9, 0.999)) departs by
# 4e-5..6e-4 within the small run's 14 steps, so the tolerances sit 5-10x above the expected noise
# and below those departures. bf16: same kernels on the same bf16 values, but a reassociated fp32
# sum can flip a bf16 rounding: measured step 0 bitwise equal, ≤ 1.5e-5 over 6 steps; a peer that
# computes in fp32 instead departs by 2.6e-4 at step 2 and 6.4e-4 at step 4.
LOSS_TOLERANCE = {"fp32": (5e-5, 1e-4), "bf16": (5e-5, 2e-4)}

# The benchmark's goals (bench/README.md, "Goals"): step time against the peer and the two floors,
# peak tensor memory against the bound.
# A Llama configuration has the goals of the GPT configuration with its shapes; a Muon
# configuration has its own (muon_bench.GOALS: the optimizer's time, the Newton-Schulz balance).
GOALS = {"ratio_vs_peer": {"small": 0.65, "medium": 0.89, "llama-medium": 0.89, "deep": 0.25},
         "ratio_vs_floor": 1.10,
         "ratio_vs_concurrent_floor": {"small": 1.10, "medium": 1.05, "llama-medium": 1.05, "deep": 1.10},
         "peak_vs_bound": 1.05}


def log(msg):
    print(f"[bench] {msg}", flush=True)


def git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.rstrip("\n")


def binaries_up_to_date():
    """Whether gpt_train and fsdprun are built from the sources: ninja brings them up to date (a
    dry run cannot tell: the build's CONFIGURE_DEPENDS globs always read as re-running CMake in
    one); None without ninja."""
    ninja = shutil.which("ninja")
    if not ninja:
        return None
    return subprocess.run([ninja, "-C", BUILD, "gpt_train", "fsdprun"], capture_output=True,
                          text=True).returncode == 0


def source_state():
    """The commit the results describe and whether the working tree and the binaries match it."""
    porcelain = git("status", "--porcelain").splitlines()
    return {"git_head": git("rev-parse", "HEAD"), "git_dirty": bool(porcelain),
            "git_status_porcelain": porcelain, "binaries_up_to_date": binaries_up_to_date()}


def snapshot_binaries(work):
    """Copies gpt_train and fsdprun (statically linked to the library) into the work folder, so
    that a rebuild while the benchmark runs cannot mix two versions of the code in one report."""
    global GPT_TRAIN, FSDPRUN
    bin_dir = os.path.join(work, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    info = {}
    for name, src in (("gpt_train", GPT_TRAIN), ("fsdprun", FSDPRUN)):
        dst = os.path.join(bin_dir, name)
        shutil.copy2(src, dst)
        with open(dst, "rb") as f:
            info[name] = {"sha256": hashlib.sha256(f.read()).hexdigest()[:16],
                          "built": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(src)))}
    GPT_TRAIN, FSDPRUN = os.path.join(bin_dir, "gpt_train"), os.path.join(bin_dir, "fsdprun")
    return info


def ensure_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log("installing matplotlib into the venv (pip install -q matplotlib)")
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "matplotlib"])
        import importlib
        importlib.invalidate_caches()
    import matplotlib
    matplotlib.use("Agg")


def cpu_busy_seconds():
    """CPU seconds the whole machine (all cores) has been busy since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def idle_wait(seconds):
    """Waits with nothing of the benchmark running; returns how many cores the rest of the machine
    kept busy meanwhile (0 on a quiet machine)."""
    busy, start = cpu_busy_seconds(), time.perf_counter()
    time.sleep(seconds)
    return (cpu_busy_seconds() - busy) / (time.perf_counter() - start)


def stop(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(cmds, logs, timeout):
    """Runs cmds at the same time, one thread per process, each with its own log. Returns their exit
    codes, the wall seconds until the last one ended, the largest peak RSS of any process (wait4 on
    a child reports the max over it and its waited-for descendants), the CPU seconds of all of them
    and the cores the rest of the machine kept busy meanwhile."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    busy, start = cpu_busy_seconds(), time.perf_counter()
    outs = [open(path, "w") for path in logs]
    procs = [subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
             for cmd, out in zip(cmds, outs)]
    pending = {p.pid: p for p in procs}
    maxrss, cpu_s = 0, 0.0
    try:
        while pending:
            for pid in list(pending):
                done, status, usage = os.wait4(pid, os.WNOHANG)
                if done:
                    pending.pop(pid).returncode = os.waitstatus_to_exitcode(status)
                    maxrss = max(maxrss, usage.ru_maxrss * 1024)
                    cpu_s += usage.ru_utime + usage.ru_stime
            if pending and time.perf_counter() - start > timeout:
                raise SystemExit(f"[bench] FAILED: timed out after {timeout}s: {' '.join(cmds[0])}")
            time.sleep(0.05)
    except BaseException:  # timeout, Ctrl-C, SIGTERM: stop the launchers (they stop their ranks)
        stop(list(pending.values()))
        raise
    finally:
        for out in outs:
            out.close()
    wall = time.perf_counter() - start
    others = max(0.0, (cpu_busy_seconds() - busy - cpu_s) / wall)
    return {"exit_codes": [p.returncode for p in procs], "wall_s": wall, "maxrss": maxrss, "cpu_s": cpu_s,
            "others": others}


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def tail(path, lines=20):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def is_llama(c):
    return c.get("model") == "llama"


def model_args(c):
    llama = ["--model", "llama", "--kv-heads", str(c["kv_heads"])] if is_llama(c) else []
    return llama + ["--layers", str(c["layers"]), "--dim", str(c["dim"]), "--heads", str(c["heads"]),
                    "--seq", str(c["seq"])]


def peer_model_args(c, d):
    """The peer's model: the GPT's sizes, or (a Llama) transformers' model from the exported folder."""
    if is_llama(c):
        return ["--model", "llama", "--seq", str(c["seq"]), "--init-from", os.path.join(d, "init-hf")]
    return model_args(c) + ["--init-from", os.path.join(d, "init.pt")]


def precision_args(c):
    """gpt_train's and the peer's mixed precision flags (none in fp32)."""
    return [] if c["dtype"] == "fp32" else ["--param-dtype", c["dtype"], "--reduce-dtype", "fp32"]


def optimizer_args(optimizer, c):
    """gpt_train's: the fused AdamW, or (muon) Muon on the blocks' matrices and it on the rest."""
    return ["--optimizer", optimizer] + (["--muon-lr", str(c["muon_lr"])] if optimizer == "muon" else [])


def train_args(c, data, optimizer=None):
    # gpt_train and its floors step the fused AdamW (or the configuration's Muon); the peer the
    # same kernel (AdamW(fused=True)), and torch.optim.Muon for Muon.
    return model_args(c) + precision_args(c) + [
        "--lr", str(c["lr"]), "--seed", str(SEED), "--data", data, "--max-data-mb", str(MAX_DATA_MB),
        "--steps", str(c["steps"]), "--batch", str(c["batch"])] + optimizer_args(
        optimizer or c.get("optimizer", "fused"), c)


def peer_optimizer_args(c):
    """The peer's torch.optim.Muon on gpt_train's split, for a Muon configuration."""
    return ["--optimizer", "muon", "--muon-lr", str(c["muon_lr"])] if muon_bench.is_muon(c) else []


def commands(kind, r, c, d, world, data):
    """The commands of one run of `kind` in round r and the metrics files they write (one per rank,
    or per process of the concurrent floor)."""
    if pipeline_bench.is_pipeline(c):
        tools = {"fsdprun": FSDPRUN, "gpt_train": GPT_TRAIN, "torchrun": os.path.join(VENV, "torchrun"),
                 "peer_pipeline": PEER_PIPELINE}
        return pipeline_bench.commands(kind, r, c, d, tools, train_args(c, data))
    init, batches = os.path.join(d, "init.pt"), os.path.join(d, "batches.pt")
    metrics = os.path.join(d, f"{kind}-r{r}-rank{{rank}}.jsonl")
    paths = [metrics.format(rank=k) for k in range(world)]
    if kind in ("cpp", "cpp_adamw", "cpp_overlap"):  # a Muon configuration's (bench/muon_bench.py)
        dump = ["--dump-batches", batches] if r == 0 and kind == "cpp" else []
        optimizer = "fused" if kind == "cpp_adamw" else None
        overlap = ["--step-in-backward"] if kind == "cpp_overlap" else []
        return [[FSDPRUN, "--nproc-per-node", str(world), GPT_TRAIN] + train_args(c, data, optimizer) + [
            "--init-from", init, "--metrics", metrics] + overlap + dump], paths
    if kind == "peer":
        return [[os.path.join(VENV, "torchrun"), "--standalone", "--nproc-per-node", str(world),
                 "--log-dir", os.path.join(d, "torchrun"), PEER]
                + peer_model_args(c, d) + precision_args(c) + [
            "--batch", str(c["batch"]), "--steps", str(c["steps"]), "--lr", str(c["lr"]),
            "--batches", batches, "--metrics", metrics, "--fused"] + peer_optimizer_args(c)], paths
    floor = [GPT_TRAIN, "--reference", "--world-size", "1"] + train_args(c, data) + ["--init-from", init]
    if kind == "floor":
        return [floor + ["--metrics", paths[0]]], paths[:1]
    return [floor + ["--metrics", p] for p in paths], paths  # concurrent_floor: W processes at once


def run_kind(kind, r, c, d, world, data, timeout):
    """One run: returns the per-rank metrics and the run's record. A peer that exits non-zero after
    every rank wrote every step's metrics (PyTorch's Gloo teardown has aborted so: "terminate
    called without an active exception") keeps its round, with the failure noted."""
    cmds, paths = commands(kind, r, c, d, world, data)
    logs = [os.path.join(d, f"{kind}-r{r}.log")] if len(cmds) == 1 else [
        os.path.join(d, f"{kind}-r{r}-p{k}.log") for k in range(len(cmds))]
    res = launch(cmds, logs, timeout)
    ranks = [read_jsonl(p) for p in paths]
    complete = all(len(m) == c["steps"] for m in ranks)
    failed = [(code, log_path) for code, log_path in zip(res["exit_codes"], logs) if code != 0]
    if not complete or (failed and kind != "peer"):
        shown = failed or list(zip(res["exit_codes"], logs))
        detail = "".join(f"exit {code}, log {path}:\n{tail(path)}" for code, path in shown)
        raise SystemExit(f"[bench] FAILED: {kind} round {r}: metric lines per rank "
                         f"{[len(m) for m in ranks]} (expected {c['steps']}); {' '.join(cmds[0])}\n{detail}")
    med = statistics.median(max(m[s]["step_ms"] for m in ranks) for s in range(c["warmup"], c["steps"]))
    record = {"round": r, "kind": kind, "wall_s": round(res["wall_s"], 2), "cpu_s": round(res["cpu_s"], 2),
              "others_busy_cores": round(res["others"], 2), "median_step_ms": med,
              "rss_peak_bytes": res["maxrss"]}
    if kind == "peer":  # the ranks' own getrusage (wait4 on torchrun also sees its agent)
        record["rss_peak_bytes"] = max(m[-1]["rss_peak_bytes"] for m in ranks)
    if failed:
        record["teardown_failure"] = {"exit_code": failed[0][0], "log_tail": tail(failed[0][1])}
        log(f"NOTE: peer round {r} exited {failed[0][0]} after writing all {c['steps']} steps' "
            f"metrics (teardown); the round is kept. Log: {failed[0][1]}")
    return ranks, record


def quantile(xs, q):
    xs = sorted(xs)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def unit_sizes(init_path, world):
    """Elements per FSDP unit from the initial parameters: the root holds every parameter outside
    h.{i} (wte, which the head shares, wpe, ln_f); each block h.{i} is one unit. Each unit is padded
    to a multiple of W, as the FlatParameter is."""
    import torch
    params = torch.load(init_path)
    units = {}
    for name, t in params.items():
        unit = ".".join(name.split(".")[:2]) if name.startswith("h.") else "root"
        units[unit] = units.get(unit, 0) + t.numel()
    psi = sum(units.values())
    padded = {u: -(-n // world) * world for u, n in units.items()}
    return psi, units, padded


def timing(runs, warmup, key="step_ms"):
    """runs: one list of per-rank (or per-process) metric lists per round. The time of a step is the
    slowest rank's (the loss all-reduce ends every step in lock-step anyway); for the concurrent
    floor, the slowest process's at that step. key: the metric timed (step_ms, optimizer_ms)."""
    per_round, pooled = [], []
    for ranks in runs:
        steps = [max(r[s][key] for r in ranks) for s in range(warmup, len(ranks[0]))]
        per_round.append(statistics.median(steps))
        pooled += steps
    return {"median": statistics.median(pooled), "p25": quantile(pooled, 0.25),
            "p75": quantile(pooled, 0.75), "min": min(pooled), "max": max(pooled),
            "round_medians": per_round, "samples": len(pooled)}


def bench_config(name, c, world, data, work, timeout):
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    log(f"{name}: {c}")
    pipelined = pipeline_bench.is_pipeline(c)
    world = c["world"] if pipelined else world
    hf = ["--export-hf", os.path.join(d, "init-hf")] if is_llama(c) else []  # the Llama peer's weights
    res = launch([[GPT_TRAIN, "--reference", "--steps", "0", "--save-full", os.path.join(d, "init.pt")]
                  + hf + model_args(c) + ["--seed", str(SEED), "--data", data, "--max-data-mb", str(MAX_DATA_MB)]],
                 [os.path.join(d, "init.log")], timeout)
    if res["exit_codes"] != [0]:
        raise SystemExit(f"[bench] FAILED: writing {name}'s init.pt:\n{tail(os.path.join(d, 'init.log'))}")
    if pipelined:  # its batches (gpt_train --pp refuses --dump-batches)
        res = launch([pipeline_bench.batches_command(c, d, GPT_TRAIN, train_args(c, data))],
                     [os.path.join(d, "batches.log")], timeout)
        if res["exit_codes"] != [0]:
            raise SystemExit(f"[bench] FAILED: {name}'s batches:\n{tail(os.path.join(d, 'batches.log'))}")
    plan = planned(c, world, data, d, timeout)
    kinds = kinds_of(c)
    metrics = {k: [] for k in kinds}
    runs, idle = [], []
    for r in range(c["rounds"]):
        idle.append(round(idle_wait(IDLE_WAIT_S), 2))
        log(f"{name} round {r + 1}/{c['rounds']}: other processes kept {idle[-1]:.2f} cores busy "
            f"in a {IDLE_WAIT_S} s idle wait")
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            if kind == "peer" and r >= c.get("peer_rounds", c["rounds"]):
                continue
            ranks, record = run_kind(kind, r, c, d, world, data, timeout)
            metrics[kind].append(ranks)
            runs.append(record)
            log(f"{name} round {r + 1}/{c['rounds']} {kind:16s}: median {record['median_step_ms']:8.1f} "
                f"ms/step ({record['wall_s']:.1f} s wall, {record['cpu_s']:.1f} s CPU, others "
                f"{record['others_busy_cores']:.2f} cores)")
    if pipelined:
        summary = dict(config=c, world_size=world, **pipeline_bench.summarize(c, metrics, timing,
                                                                            LOSS_TOLERANCE[c["dtype"]]))
        summary.update(pipeline_bench.plan_vs_measured(plan, summary))
    else:
        summary = summarize(c, world, os.path.join(d, "init.pt"), metrics)
        summary.update(plan_vs_measured(plan, summary))
    summary.update(runs=runs, idle_busy_cores_before_rounds=idle,
                   peer_teardown_failures=sum("teardown_failure" in r for r in runs),
                   rss_peak_bytes={k: max(r["rss_peak_bytes"] for r in runs if r["kind"] == k) for k in kinds})
    return summary


def planned(c, world, data, d, timeout):
    """gpt_train --plan --json for the configuration (W ranks on this host, the device probed at
    the model's shapes with one thread, as the ranks run), before the timed runs, on an idle machine."""
    path = os.path.join(d, "plan.json")
    res = launch([[GPT_TRAIN, "--plan", "--json", "--ranks", str(world), "--ranks-per-host", str(world)]
                  + train_args(c, data) + pipeline_bench.plan_args(c)], [path], timeout)
    if res["exit_codes"] != [0]:
        raise SystemExit(f"[bench] FAILED: gpt_train --plan:\n{tail(path)}")
    with open(path) as f:
        return json.load(f)


def plan_vs_measured(plan, summary):
    """The planner's step time and peak beside the C++ runs' (docs/planner.md)."""
    step_ms = plan["time"]["step_s"] * 1000
    return {"planned_step_ms": step_ms, "planned_peak_bytes": plan["peak_bytes"],
            "planned_vs_measured_step": step_ms / summary["cpp_step_ms"],
            "planned_vs_measured_peak": plan["peak_bytes"] / summary["cpp_peak_bytes"]}


def summarize(c, world, init, metrics):
    t = {k: timing(v, c["warmup"]) for k, v in metrics.items()}
    tokens_global = world * c["batch"] * c["seq"]
    psi, units, padded = unit_sizes(init, world)
    summary = {
        "config": c, "world_size": world, "seed": SEED, "psi": psi, "unit_elements": units,
        "cpp_step_ms": t["cpp"]["median"], "peer_step_ms": t["peer"]["median"],
        "floor_step_ms": t["floor"]["median"], "concurrent_floor_step_ms": t["concurrent_floor"]["median"],
        "step_ms": t,
        "cpp_tokens_per_s": tokens_global / (t["cpp"]["median"] / 1000),
        "peer_tokens_per_s": tokens_global / (t["peer"]["median"] / 1000),
        "floor_tokens_per_s": c["batch"] * c["seq"] / (t["floor"]["median"] / 1000),
        "concurrent_floor_tokens_per_s": tokens_global / (t["concurrent_floor"]["median"] / 1000),
        "ratio_vs_peer": t["cpp"]["median"] / t["peer"]["median"],
        "ratio_vs_floor": t["cpp"]["median"] / t["floor"]["median"],
        "ratio_vs_concurrent_floor": t["cpp"]["median"] / t["concurrent_floor"]["median"],
        "cpp_loss": [m["loss"] for m in metrics["cpp"][0][0]],
        "peer_loss": [m["loss"] for m in metrics["peer"][0][0]],
        "floor_loss": [m["loss"] for m in metrics["floor"][0][0]],
        "cpp_peak_bytes": max(m["mem_peak_bytes"] for ranks in metrics["cpp"] for r in ranks for m in r),
        "cpp_peak_bytes_per_rank": [max(m["mem_peak_bytes"] for ranks in metrics["cpp"] for m in ranks[k])
                                    for k in range(world)],
        "floor_peak_bytes": max(m["mem_peak_bytes"] for ranks in metrics["floor"] for r in ranks for m in r),
        "peer_rss_peak_growth_bytes": max(m["rss_peak_growth_bytes"] for ranks in metrics["peer"]
                                          for r in ranks for m in r),
    }
    summary.update(loss_agreement(c, metrics))
    summary.update(collective_bytes(world, padded, metrics))
    if muon_bench.is_muon(c):
        summary.update(muon_bench.summarize(c, world, init, metrics, t,
                                            {k: timing(v, c["warmup"], "optimizer_ms") for k, v in metrics.items()}))
    elif c["dtype"] == "fp32":  # the bound is specified for fp32 parameters, gradients and AdamW's state
        summary.update(memory_bound(world, psi, padded, metrics, summary["cpp_peak_bytes"],
                                    summary["floor_peak_bytes"]))
    return summary


def loss_agreement(c, metrics):
    """C++ against the peer, round by round (every round trains from the same weights on the same
    batches), relative to the peer's loss."""
    rel = [[abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(cpp_ranks[0], peer_ranks[0])]
           for cpp_ranks, peer_ranks in zip(metrics["cpp"], metrics["peer"])]
    first_cpp = [m["loss"] for m in metrics["cpp"][0][0]]
    tol_first, tol_any = LOSS_TOLERANCE[c["dtype"]]
    if muon_bench.is_muon(c):  # FSDP2 + torch.optim.Muon is not Muon after step 0: step 0 only
        tol_any = None
    return {"loss_first_rel_diff": max(r[0] for r in rel), "loss_max_rel_diff": max(max(r) for r in rel),
            "loss_rel_diff_per_step": [max(r[s] for r in rel) for s in range(c["steps"])],
            "loss_tolerance": {"first_step": tol_first, "any_step": tol_any},
            "cpp_runs_bitwise_identical": all([m["loss"] for m in ranks[0]] == first_cpp
                                              for ranks in metrics["cpp"])}


def collective_bytes(world, padded, metrics):
    def per_step(kind, key):
        vals = {m[key] for ranks in metrics[kind] for r in ranks for m in r}
        return max(vals) if len(vals) == 1 else sorted(vals)

    keys = {"all_gather": "bytes_all_gather", "reduce_scatter": "bytes_reduce_scatter",
            "all_reduce": "bytes_all_reduce"}
    blocks = [n for u, n in padded.items() if u != "root"]
    ring = (world - 1) / world
    return {"cpp_bytes_per_step": {k: per_step("cpp", v) for k, v in keys.items()},
            "peer_bytes_per_step": {k: per_step("peer", v) for k, v in keys.items()},
            "expected_bytes_per_step_fp32": {"all_gather": 4 * ring * (padded["root"] + 2 * sum(blocks)),
                                             "reduce_scatter": 4 * ring * sum(padded.values())}}


def memory_bound(world, psi, padded, metrics, cpp_peak, floor_peak):
    """The bound of bench/README.md ("Bound") for the C++ peak tensor bytes per rank, fp32."""
    floor_current = metrics["floor"][0][0][-1]["mem_current_bytes"]  # after a step: 16Ψ + corpus
    blocks = sorted((n for u, n in padded.items() if u != "root"), reverse=True)
    persistent = 16 * sum(padded.values()) // world
    root_unsharded = 8 * padded["root"]                # fp32 params + grads, unsharded
    blocks_unsharded = 8 * sum(blocks[:2])             # the two largest blocks, params + grads
    floor_extra = floor_peak - 16 * psi                # activations + corpus + temporaries
    bound = persistent + root_unsharded + blocks_unsharded + floor_extra
    # gpt_train's zero_grad frees the gradients (set_to_none), so a step starts with 12Ψ + corpus
    # live and the floor's peak holds only part of its 4Ψ of gradients: floor_peak - 16Ψ
    # underestimates the activations by up to 4Ψ. Activations measured from the step's start:
    floor_step_start = floor_current - 4 * psi
    bound_grad_aware = persistent + root_unsharded + blocks_unsharded + (floor_current - 16 * psi) + (
        floor_peak - floor_step_start)
    return {"floor_current_bytes": floor_current, "bound_bytes": bound,
            "bound_terms": {"persistent_16psi_over_w": persistent, "root_unsharded_params_grads": root_unsharded,
                            "two_blocks_unsharded_params_grads": blocks_unsharded,
                            "floor_peak_minus_16psi": floor_extra,
                            "resident_non_model_floor_current_minus_16psi": floor_current - 16 * psi,
                            "activations_floor_peak_minus_floor_current": floor_peak - floor_current},
            "peak_vs_bound": cpp_peak / bound,
            "bound_bytes_grad_aware": bound_grad_aware,
            "peak_vs_bound_grad_aware": cpp_peak / bound_grad_aware}


def bf16_vs_fp32(results, configs):
    """For each bf16 configuration whose fp32 twin ran too: step time bf16 / fp32 of every kind."""
    for name, s in results.items():
        twin = results.get(configs[name].get("fp32_config"))
        if twin:
            s["bf16_vs_fp32_step_ratio"] = {k: s["step_ms"][k]["median"] / twin["step_ms"][k]["median"]
                                            for k in KINDS}


def goals(name, s):
    if pipeline_bench.is_pipeline(s["config"]):
        return pipeline_bench.goals(s)
    if muon_bench.is_muon(s["config"]):
        return muon_bench.goals(s)
    if s["config"]["dtype"] != "fp32":
        return []
    def goal(key):  # per configuration; the quick ones take small's
        return GOALS[key].get(name, GOALS[key]["small"])
    return [("step time vs peer", s["ratio_vs_peer"], goal("ratio_vs_peer")),
            ("step time vs concurrent floor", s["ratio_vs_concurrent_floor"], goal("ratio_vs_concurrent_floor")),
            ("step time vs floor", s["ratio_vs_floor"], GOALS["ratio_vs_floor"]),
            ("peak memory vs bound", s["peak_vs_bound"], GOALS["peak_vs_bound"]),
            ("peak memory vs grad-aware bound", s["peak_vs_bound_grad_aware"], GOALS["peak_vs_bound"])]


def loss_failures(results):
    failures = []
    for n, s in results.items():
        tol = s["loss_tolerance"]
        any_step_off = tol["any_step"] is not None and s["loss_max_rel_diff"] > tol["any_step"]
        if s["loss_first_rel_diff"] > tol["first_step"] or any_step_off:
            failures.append(f"{n}: loss rel. diff step 0 {s['loss_first_rel_diff']:.2e} "
                            f"(tol {tol['first_step']:g}), max {s['loss_max_rel_diff']:.2e} (tol {tol['any_step']})")
        if pipeline_bench.is_pipeline(s["config"]):
            failures += pipeline_bench.failures(n, s)
    return failures


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def spread(t):
    return f"{t['median']:.1f} [{t['p25']:.1f}–{t['p75']:.1f}]"


def when(key, fmt):
    """A table cell from s[key] formatted by fmt, or – where the configuration has no such field."""
    return lambda s: fmt(s[key]) if key in s else "–"


def cpu_lines(cpu):
    g = cpu["matmul_1thread_gflops"]
    return [f"CPU: {cpu['cpu_model']}; ISA flags {', '.join(cpu['isa_flags']) or 'none'}; native bf16: "
            f"{'yes (' + ', '.join(cpu['native_bf16_flags']) + ')' if cpu['native_bf16'] else 'no'}; "
            f"torch.ops.mkldnn._is_mkldnn_bf16_supported(): {cpu['torch_mkldnn_bf16_supported']}; "
            f"torch CPU capability {cpu['torch_cpu_capability']}.",
            f"One thread, {cpu['matmul_n']}×{cpu['matmul_n']} matmul: fp32 {g['fp32']:.1f} GFLOP/s, "
            f"bf16 {g['bf16']:.2f} GFLOP/s (bf16 / fp32 = {cpu['matmul_bf16_speedup']:.3f}); other "
            f"processes kept {cpu['idle_busy_cores_before']:.2f} cores busy just before."]


def source_line(meta):
    src = meta["source"]
    state = "clean tree" if not src["git_dirty"] else (
        f"**DIRTY TREE** ({len(src['git_status_porcelain'])} changed or untracked paths): these "
        "numbers do not describe that commit")
    stale = {True: "", False: "; **binaries older than the sources**", None: "; binaries' freshness unknown"}
    return (f"git HEAD {src['git_head'][:12]}, {state}{stale[src['binaries_up_to_date']]}; gpt_train "
            f"{meta['binaries']['gpt_train']['sha256']} built {meta['binaries']['gpt_train']['built']}.")


TABLE_ROWS = [
    ("model (layers × dim, heads, seq, batch/rank)",
     lambda s: f"{s['config']['layers']}×{s['config']['dim']}, {s['config']['heads']}, "
               f"{s['config']['seq']}, {s['config']['batch']}"),
    ("compute dtype", lambda s: s["config"]["dtype"] + (" (reduce fp32)" if s["config"]["dtype"] != "fp32" else "")),
    ("parameters Ψ", lambda s: f"{s['psi']:,}"),
    ("AdamW lr (constant)", lambda s: f"{s['config']['lr']:g}"),
    ("steps (warm-up) × rounds",
     lambda s: f"{s['config']['steps']} ({s['config']['warmup']}) × {s['config']['rounds']}" +
               (f" (peer {s['config']['peer_rounds']})" if "peer_rounds" in s["config"] else "")),
    ("C++ step ms", lambda s: spread(s["step_ms"]["cpp"])),
    ("FSDP2 peer step ms", lambda s: spread(s["step_ms"]["peer"])),
    ("floor step ms (1 rank alone, no comm)", lambda s: spread(s["step_ms"]["floor"])),
    ("concurrent floor step ms (W ranks, no comm)", lambda s: spread(s["step_ms"]["concurrent_floor"])),
    ("ratio C++ / peer", lambda s: f"{s['ratio_vs_peer']:.3f}"),
    ("ratio C++ / floor", lambda s: f"{s['ratio_vs_floor']:.3f}"),
    ("ratio C++ / concurrent floor", lambda s: f"{s['ratio_vs_concurrent_floor']:.3f}"),
    ("bf16 / fp32 step time: C++ / peer", when("bf16_vs_fp32_step_ratio", lambda r: f"{r['cpp']:.2f} / {r['peer']:.2f}")),
    ("bf16 / fp32 step time: floor / concurrent floor",
     when("bf16_vs_fp32_step_ratio", lambda r: f"{r['floor']:.2f} / {r['concurrent_floor']:.2f}")),
    ("tokens/s C++ / peer / concurrent floor (global)",
     lambda s: f"{s['cpp_tokens_per_s']:.0f} / {s['peer_tokens_per_s']:.0f} / {s['concurrent_floor_tokens_per_s']:.0f}"),
    ("tokens/s floor (one rank)", lambda s: f"{s['floor_tokens_per_s']:.0f}"),
    ("loss rel. diff C++ vs peer: step 0 / max (tolerance)",
     lambda s: f"{s['loss_first_rel_diff']:.2e} / {s['loss_max_rel_diff']:.2e} "
               f"({s['loss_tolerance']['first_step']:g} / {s['loss_tolerance']['any_step']:g})"),
    ("C++ peak tensor bytes per rank", lambda s: mib(s["cpp_peak_bytes"])),
    ("planned step ms / measured (gpt_train --plan)",
     when("planned_step_ms", lambda v: f"{v:.1f}")),
    ("planned / measured step time", when("planned_vs_measured_step", lambda v: f"{v:.3f}")),
    ("planned peak per rank / measured", when("planned_vs_measured_peak", lambda v: f"{v:.3f}")),
    ("bound per rank", when("bound_bytes", mib)),
    ("peak / bound", when("peak_vs_bound", lambda v: f"{v:.3f}")),
    ("grad-aware bound per rank", when("bound_bytes_grad_aware", mib)),
    ("peak / grad-aware bound", when("peak_vs_bound_grad_aware", lambda v: f"{v:.3f}")),
    ("CPU s per run C++ / peer / floor / concurrent floor (median)", lambda s: " / ".join(
        f"{statistics.median(r['cpu_s'] for r in s['runs'] if r['kind'] == k):.1f}" for k in KINDS)),
    ("cores kept busy by other processes: idle wait before rounds / during runs (max)",
     lambda s: f"{max(s['idle_busy_cores_before_rounds']):.2f} / {max(r['others_busy_cores'] for r in s['runs']):.2f}"),
    ("peer runs that failed at teardown after writing every step", lambda s: str(s["peer_teardown_failures"])),
    ("peak RSS C++ / peer / floor", lambda s: " / ".join(mib(s["rss_peak_bytes"][k]) for k in ("cpp", "peer", "floor"))),
    ("all-gather bytes/step C++ / peer", lambda s: f"{s['cpp_bytes_per_step']['all_gather']:,} / {s['peer_bytes_per_step']['all_gather']:,}"),
    ("reduce-scatter bytes/step C++ / peer", lambda s: f"{s['cpp_bytes_per_step']['reduce_scatter']:,} / {s['peer_bytes_per_step']['reduce_scatter']:,}"),
    ("all-reduce bytes/step C++ / peer", lambda s: f"{s['cpp_bytes_per_step']['all_reduce']:,} / {s['peer_bytes_per_step']['all_reduce']:,}"),
]


def verdict(bf16, fp32):
    """What bf16 does to gpt_train's step time, claimed only where the interquartile ranges part."""
    if bf16["p75"] < fp32["p25"]:
        return "makes gpt_train faster"
    if bf16["p25"] > fp32["p75"]:
        return "makes gpt_train slower"
    return "makes no clear difference to gpt_train (the interquartile ranges overlap)"


def bf16_lines(results, cpu):
    L = ["## What bf16 buys on this CPU", ""] + cpu_lines(cpu) + [""]
    for n, s in results.items():
        r = s.get("bf16_vs_fp32_step_ratio")
        if r:
            twin = s["config"]["fp32_config"]
            L.append(f"- {n} against {twin}, step time bf16 / fp32: {r['cpp']:.2f} in gpt_train, "
                     f"{r['peer']:.2f} in the FSDP2 peer, {r['floor']:.2f} on the floor, "
                     f"{r['concurrent_floor']:.2f} on the concurrent floor: on this CPU bf16 "
                     f"{verdict(s['step_ms']['cpp'], results[twin]['step_ms']['cpp'])}.")
    return L + [""]


def write_markdown(path, results, meta):
    names = [n for n, s in results.items()  # Muon's and the pipeline's: their own tables
             if not muon_bench.is_muon(s["config"]) and not pipeline_bench.is_pipeline(s["config"])]
    L = ["# fsdp-cpp vs PyTorch FSDP2 (CPU, Gloo)", "",
         f"{meta['date']}, W = {meta['world_size']} local ranks, OMP_NUM_THREADS=1 per process, "
         f"{meta['cpus']} CPUs, torch {meta['torch']}, {meta['seconds']:.0f} s. Step times: median "
         "[p25–p75] over the timed steps of all rounds (slowest rank, or concurrent process, per "
         "step); warm-up steps excluded. " + source_line(meta), ""]
    if names:
        L.append("| | " + " | ".join(names) + " |")
        L.append("|---|" + "---|" * len(names))
        for label, f in TABLE_ROWS:
            L.append(f"| {label} | " + " | ".join(f(results[n]) for n in names) + " |")
    L += [""] + bf16_lines(results, meta["cpu"]) + muon_bench.markdown_lines(results)
    L += pipeline_bench.markdown_lines(results)
    L += ["## Goals (fp32; reported, not enforced)", "", "| configuration | goal | measured | target | met |",
          "|---|---|---|---|---|"]
    for n in results:
        for label, value, target in goals(n, results[n]):
            L.append(f"| {n} | {label} | {value:.3f} | ≤ {target:.2f} | {'yes' if value <= target else 'NO'} |")
    L += ["", "## Bound terms (bytes per rank)", ""]
    for n in names:
        if "bound_terms" in results[n]:
            terms = ", ".join(f"{k} {v:,}" for k, v in results[n]["bound_terms"].items())
            L.append(f"- {n}: {terms}")
    teardown = [f"{n} round {r['round']}: exit {r['teardown_failure']['exit_code']}"
                for n, s in results.items() for r in s["runs"] if "teardown_failure" in r]
    if teardown:
        L += ["", "Peer runs that exited non-zero after writing every step's metrics (kept; log tails "
              "in latest.json): " + "; ".join(teardown) + "."]
    L += ["", "Loss tolerance (relative to the peer): see bench/README.md.", ""]
    with open(path, "w") as f:
        f.write("\n".join(L))


PLOT_KINDS = {"cpp": ("fsdp-cpp", "tab:blue"), "peer": ("FSDP2 peer", "tab:orange"),
              "cpp_adamw": ("fsdp-cpp\nAdamW", "lightskyblue"),
              "cpp_overlap": ("fsdp-cpp\nin backward", "navy"),
              "cpp_1d": ("fsdp-cpp\nno pipeline", "lightskyblue"),
              "floor": ("floor\n(1 rank)", "tab:gray"), "concurrent_floor": ("concurrent\nfloor", "darkgray")}


def plot_step_time(ax, n, s):
    kinds = list(s["step_ms"])
    for i, k in enumerate(kinds):
        t = s["step_ms"][k]
        ax.bar(i, t["median"], color=PLOT_KINDS[k][1])
        ax.errorbar(i, t["median"], yerr=[[t["median"] - t["p25"]], [t["p75"] - t["median"]]],
                    color="black", capsize=6)
        ax.plot([i] * len(t["round_medians"]), t["round_medians"], "k.", alpha=0.6)
    ax.set_xticks(range(len(kinds)), [PLOT_KINDS[k][0] for k in kinds])
    ax.set_title(f"{n}: step time (ms), median, IQR, round medians")


def plot_tokens(ax, n, s):
    vals = [s["cpp_tokens_per_s"], s["peer_tokens_per_s"], s["concurrent_floor_tokens_per_s"],
            s["floor_tokens_per_s"] * s["world_size"]]
    ax.bar(range(4), vals, color=[PLOT_KINDS[k][1] for k in ("cpp", "peer", "concurrent_floor", "floor")])
    ax.set_xticks(range(4), ["fsdp-cpp", "FSDP2 peer", "concurrent\nfloor", "floor × W"])
    ax.set_title(f"{n}: tokens/s (global)")


def plot_memory(ax, n, s):
    mem = [("C++ tensor peak", s["cpp_peak_bytes"], "tab:blue"), ("bound", s.get("bound_bytes"), "tab:green"),
           ("grad-aware bound", s.get("bound_bytes_grad_aware"), "darkseagreen"),
           ("floor tensor peak", s["floor_peak_bytes"], "tab:gray"),
           ("C++ RSS", s["rss_peak_bytes"]["cpp"], "lightsteelblue"),
           ("peer RSS", s["rss_peak_bytes"]["peer"], "navajowhite"),
           ("floor RSS", s["rss_peak_bytes"]["floor"], "lightgray")]
    mem = [m for m in mem if m[1] is not None]
    ax.bar(range(len(mem)), [m[1] / 2**20 for m in mem], color=[m[2] for m in mem])
    ax.set_xticks(range(len(mem)), [m[0] for m in mem], rotation=25, ha="right")
    ax.set_yscale("log")
    ax.set_title(f"{n}: peak memory per rank (MiB, log)")


def plot_bytes(ax, n, s):
    keys = ["all_gather", "reduce_scatter", "all_reduce"]
    for j, (who, src, col) in enumerate([("fsdp-cpp", "cpp_bytes_per_step", "tab:blue"),
                                         ("FSDP2 peer", "peer_bytes_per_step", "tab:orange"),
                                         ("ring formula, fp32", "expected_bytes_per_step_fp32", "tab:green")]):
        v = [s[src].get(k, 0) for k in keys]
        v = [x if isinstance(x, (int, float)) else max(x) for x in v]
        ax.bar([i + (j - 1) * 0.27 for i in range(3)], [x / 2**20 for x in v], width=0.27, color=col, label=who)
    ax.set_xticks(range(3), keys)
    ax.set_title(f"{n}: MiB sent per rank per step")
    ax.legend()


def plot_loss(ax, n, s):
    ax.plot(s["cpp_loss"], "o-", label="fsdp-cpp", color=PLOT_KINDS["cpp"][1])
    ax.plot(s["peer_loss"], "x--", label="FSDP2 peer", color=PLOT_KINDS["peer"][1])
    ax.set_title(f"{n}: loss (max rel. diff {s['loss_max_rel_diff']:.1e})")
    ax.set_xlabel("step")
    ax.legend(loc="upper right")
    twin = ax.twinx()
    twin.plot(s["loss_rel_diff_per_step"], "g:", label="rel. diff")
    twin.set_yscale("symlog", linthresh=1e-9)
    twin.set_ylim(0, 1e-1)
    twin.set_ylabel("relative difference (green)")


def write_plot(path, results):
    import matplotlib.pyplot as plt
    panels = (plot_step_time, plot_tokens, plot_memory, plot_bytes, plot_loss)
    fig, axes = plt.subplots(len(results), len(panels), figsize=(26, 4.6 * len(results)), squeeze=False)
    for row, (n, s) in zip(axes, results.items()):
        shown = (plot_step_time, plot_loss) if pipeline_bench.is_pipeline(s["config"]) else panels
        for ax, panel in zip(row, shown):
            panel(ax, n, s)
        for ax in row[len(shown):]:
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def parse_args():
    ap = argparse.ArgumentParser(description="fsdp-cpp vs PyTorch FSDP2 vs the unsharded floors")
    ap.add_argument("--quick", action="store_true", help="tiny configurations, 3 steps: a smoke run")
    ap.add_argument("--configs", default=None, help="comma-separated subset of the configurations")
    ap.add_argument("--rounds", type=int, default=None, help="override the rounds per configuration")
    ap.add_argument("--out", default=None, help="where latest.* go (default: bench/results for the full "
                                                "run, build/bench/results for a partial one)")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="run on a dirty tree or stale binaries; the results say so")
    ap.add_argument("--work", default=os.path.join(BUILD, "bench"), help="runs' files (logs, metrics)")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    return ap.parse_args()


def check_source(source, allow_dirty):
    problems = (["the working tree is dirty: " + "; ".join(source["git_status_porcelain"][:10])]
                if source["git_dirty"] else [])
    if source["binaries_up_to_date"] is False:
        problems.append("build/bin/gpt_train or fsdprun is older than its sources: run `make build`")
    if problems and not allow_dirty:
        raise SystemExit("[bench] refusing: the results would not describe HEAD "
                         f"{source['git_head'][:12]}:\n  " + "\n  ".join(problems) +
                         "\n  commit or stash first, or pass --allow-dirty (the results then say DIRTY)")
    for p in problems:
        log(f"WARNING: {p}")


def main():
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that launch() stops its children
    partial = bool(args.quick or args.configs or args.rounds)
    out = os.path.abspath(args.out or (os.path.join(BUILD, "bench", "results") if partial else RESULTS))
    work = os.path.abspath(args.work)
    os.chdir(ROOT)
    for exe in (GPT_TRAIN, FSDPRUN):
        if not os.access(exe, os.X_OK):
            raise SystemExit(f"[bench] {exe} is missing: run `make build` first")
    source = source_state()
    check_source(source, args.allow_dirty)
    ensure_matplotlib()
    import torch
    binaries = snapshot_binaries(work)

    configs = QUICK_CONFIGS if args.quick else CONFIGS
    if args.configs:
        configs = {k: configs[k] for k in args.configs.split(",")}
    configs = {k: dict(c, rounds=args.rounds or c["rounds"]) for k, c in configs.items()}
    data = os.path.dirname(os.__file__)  # the Python standard library's sources
    os.makedirs(out, exist_ok=True)
    began = time.time()
    cpu = dict(idle_busy_cores_before=round(idle_wait(IDLE_WAIT_S), 2), **cpu_bf16.probe())
    log("\n".join(cpu_lines(cpu)))
    results = {name: bench_config(name, c, args.world_size, data, work, args.timeout)
               for name, c in configs.items()}
    bf16_vs_fp32(results, configs)

    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "world_size": args.world_size,
            "cpus": os.cpu_count(), "torch": torch.__version__, "quick": args.quick, "partial": partial,
            "data": data, "max_data_mb": MAX_DATA_MB, "seconds": round(time.time() - began, 1),
            "source": source, "binaries": binaries, "cpu": cpu}
    failures = loss_failures(results)
    for n, s in results.items():
        s["goals"] = {label: {"value": v, "target": t, "met": v <= t} for label, v, t in goals(n, s)}
    report = {"meta": meta, "loss_agreement_ok": not failures, "configs": results}
    with open(os.path.join(out, "latest.json"), "w") as f:
        json.dump(report, f, indent=2)
    write_markdown(os.path.join(out, "latest.md"), results, meta)
    write_plot(os.path.join(out, "latest.png"), results)
    with open(os.path.join(out, "latest.md")) as f:
        print(f.read())
    log(f"wrote {out}/latest.json, latest.md, latest.png in {meta['seconds']} s")
    if failures:
        bar = "!" * 78
        print(f"\n{bar}\n[bench] LOSS MISMATCH between fsdp-cpp and the PyTorch FSDP2 peer:\n  "
              + "\n  ".join(failures) + "\n  same weights and batches, same precision policy, must "
              "agree; one side computes something different.\n" + bar, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
