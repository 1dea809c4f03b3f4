"""`make bench`: this project's FSDP (gpt_train under fsdprun) against PyTorch FSDP2 (bench/peer_fsdp2.py
under torchrun) and against the unsharded floor (gpt_train --reference --world-size 1 on one rank's
batch), interleaved in one session on W local ranks of this machine (Gloo, CPU, one thread per rank).

Run from the repository root:  .venv/bin/python bench/run_bench.py [--quick] [--out DIR] [--rounds N]
Writes DIR/latest.json, DIR/latest.md and DIR/latest.png (default DIR: bench/results). Exits non-zero
when a run fails or when the C++ and the peer loss curves disagree beyond the tolerance (a
correctness failure); the performance goals are reported, never enforced. See bench/README.md.
"""

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
GPT_TRAIN = os.path.join(BUILD, "bin", "gpt_train")
FSDPRUN = os.path.join(BUILD, "bin", "fsdprun")
VENV = os.path.join(ROOT, ".venv", "bin")
PEER = os.path.join(ROOT, "bench", "peer_fsdp2.py")

# Each configuration: the model, the per-rank batch, steps per run (the first `warmup` are not
# timed) and rounds (each round runs C++, peer and floor once, in a rotating order).
CONFIGS = {
    "small": dict(layers=4, dim=128, heads=4, seq=128, batch=8, steps=14, warmup=2, rounds=3, lr=1e-3),
    "medium": dict(layers=8, dim=512, heads=8, seq=256, batch=4, steps=6, warmup=2, rounds=3, lr=3e-4),
}
QUICK_CONFIGS = {
    "tiny": dict(layers=2, dim=64, heads=4, seq=32, batch=2, steps=3, warmup=1, rounds=1, lr=1e-3),
    "tiny-wide": dict(layers=2, dim=128, heads=4, seq=64, batch=2, steps=3, warmup=1, rounds=1, lr=1e-3),
}
SEED = 1234
MAX_DATA_MB = 8

# Loss agreement (see bench/README.md, "Loss agreement"). Both sides compute in fp32 from the same
# weights on the same rows, so the curves differ only by float reassociation: measured ≤ 3e-7 over
# 14 steps (step 0 bitwise equal), and ~1e-5 is the most one should expect early on. A peer with a
# deliberate architectural or optimizer difference (erf GELU, LayerNorm eps 1e-6, weight decay on
# every parameter, betas (0.9, 0.999)) departs by 4e-5..6e-4 within the small run's 14 steps, so
# the tolerances sit 5-10x above the expected noise and below those departures.
TOL_FIRST_STEP = 5e-5
TOL_ANY_STEP = 1e-4

GOALS = {"ratio_vs_peer": {"small": 0.80, "medium": 0.95}, "ratio_vs_floor": 1.10,
         "peak_vs_bound": 1.05}


def log(msg):
    print(f"[bench] {msg}", flush=True)


def snapshot_binaries(work):
    """Copies gpt_train and fsdprun (statically linked to the library) into the work folder, so
    that a rebuild while the benchmark runs cannot mix two versions of the code in one report."""
    import hashlib
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


def run(cmd, log_path, timeout):
    """Runs cmd with one thread per process; returns (wall seconds, peak RSS of the largest process
    in the tree: wait4 on the child reports the max over it and its waited-for descendants, CPU
    seconds of the whole tree, the 1-minute load average when it started)."""
    load = os.getloadavg()[0]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    start = time.perf_counter()
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = start + timeout
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() > deadline:
                    raise SystemExit(f"[bench] FAILED: timed out after {timeout}s: {' '.join(cmd)}\n"
                                     f"  log: {log_path}")
                time.sleep(0.05)
        except BaseException:  # timeout, Ctrl-C, SIGTERM: stop the launcher (it stops its ranks)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = "".join(f.readlines()[-20:])
        raise SystemExit(f"[bench] FAILED (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime, load


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def model_args(c):
    return ["--layers", str(c["layers"]), "--dim", str(c["dim"]), "--heads", str(c["heads"]),
            "--seq", str(c["seq"])]


def train_args(c, data):
    return model_args(c) + ["--lr", str(c["lr"]), "--seed", str(SEED), "--data", data,
                            "--max-data-mb", str(MAX_DATA_MB), "--steps", str(c["steps"])]


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


def timing(runs, warmup):
    """runs: one list of per-rank metric lists per round. The time of a step is the slowest rank's
    (the loss all-reduce ends every step in lock-step anyway)."""
    per_round, pooled = [], []
    for ranks in runs:
        steps = [max(r[s]["step_ms"] for r in ranks) for s in range(warmup, len(ranks[0]))]
        per_round.append(statistics.median(steps))
        pooled += steps
    return {"median": statistics.median(pooled), "p25": quantile(pooled, 0.25),
            "p75": quantile(pooled, 0.75), "min": min(pooled), "max": max(pooled),
            "round_medians": per_round, "samples": len(pooled)}


def bench_config(name, c, world, data, work, timeout):
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    init, batches = os.path.join(d, "init.pt"), os.path.join(d, "batches.pt")
    log(f"{name}: {c}")
    run([GPT_TRAIN, "--reference", "--steps", "0", "--save-full", init] + model_args(c) +
        ["--seed", str(SEED), "--data", data, "--max-data-mb", str(MAX_DATA_MB)],
        os.path.join(d, "init.log"), timeout)

    def cpp(r):
        extra = ["--dump-batches", batches] if r == 0 else []
        cmd = [FSDPRUN, "--nproc-per-node", str(world), GPT_TRAIN] + train_args(c, data) + [
            "--batch", str(c["batch"]), "--init-from", init,
            "--metrics", os.path.join(d, f"cpp-r{r}-rank{{rank}}.jsonl")] + extra
        return cmd, [os.path.join(d, f"cpp-r{r}-rank{k}.jsonl") for k in range(world)]

    def peer(r):
        cmd = [os.path.join(VENV, "torchrun"), "--standalone", "--nproc-per-node", str(world),
               PEER] + model_args(c) + [
            "--batch", str(c["batch"]), "--steps", str(c["steps"]), "--lr", str(c["lr"]),
            "--init-from", init, "--batches", batches,
            "--metrics", os.path.join(d, f"peer-r{r}-rank{{rank}}.jsonl")]
        return cmd, [os.path.join(d, f"peer-r{r}-rank{k}.jsonl") for k in range(world)]

    def floor(r):
        cmd = [GPT_TRAIN, "--reference", "--world-size", "1"] + train_args(c, data) + [
            "--batch", str(c["batch"]), "--init-from", init,
            "--metrics", os.path.join(d, f"floor-r{r}.jsonl")]
        return cmd, [os.path.join(d, f"floor-r{r}.jsonl")]

    kinds = {"cpp": cpp, "peer": peer, "floor": floor}
    order = ["cpp", "peer", "floor"]  # round 0 starts with cpp: it dumps the batches
    metrics = {k: [] for k in kinds}
    rss = {k: [] for k in kinds}
    runs = []
    for r in range(c["rounds"]):
        for kind in order[r % 3:] + order[:r % 3]:
            cmd, paths = kinds[kind](r)
            wall, maxrss, cpu_s, load = run(cmd, os.path.join(d, f"{kind}-r{r}.log"), timeout)
            ranks = [read_jsonl(p) for p in paths]
            if any(len(m) != c["steps"] for m in ranks):
                raise SystemExit(f"[bench] FAILED: {kind} round {r} wrote {[len(m) for m in ranks]} "
                                 f"metric lines, expected {c['steps']} per rank")
            metrics[kind].append(ranks)
            if kind == "peer":  # the ranks' own getrusage (wait4 on torchrun also sees its agent)
                maxrss = max(m[-1]["rss_peak_bytes"] for m in ranks)
            rss[kind].append(maxrss)
            med = statistics.median(max(m[s]["step_ms"] for m in ranks)
                                    for s in range(c["warmup"], c["steps"]))
            runs.append({"round": r, "kind": kind, "wall_s": round(wall, 2), "cpu_s": round(cpu_s, 2),
                         "loadavg_1min_at_start": load, "median_step_ms": med})
            log(f"{name} round {r + 1}/{c['rounds']} {kind:5s}: median {med:8.1f} ms/step "
                f"({wall:.1f} s wall, {cpu_s:.1f} s CPU, load {load:.2f} at start)")
    summary = summarize(name, c, world, init, metrics, rss)
    summary["runs"] = runs
    return summary


def summarize(name, c, world, init, metrics, rss):
    t = {k: timing(v, c["warmup"]) for k, v in metrics.items()}
    tokens_global = world * c["batch"] * c["seq"]

    # Loss agreement, round by round (every round trains from the same weights on the same batches).
    rel = []
    for cpp_ranks, peer_ranks in zip(metrics["cpp"], metrics["peer"]):
        rel.append([abs(a["loss"] - b["loss"]) / abs(b["loss"])
                    for a, b in zip(cpp_ranks[0], peer_ranks[0])])
    first_rel = max(r[0] for r in rel)
    max_rel = max(max(r) for r in rel)
    per_step_rel = [max(r[s] for r in rel) for s in range(c["steps"])]
    cpp_runs_identical = all([m["loss"] for m in ranks[0]] == [m["loss"] for m in metrics["cpp"][0][0]]
                             for ranks in metrics["cpp"])

    # Memory: exact tensor bytes (the C++ counting allocator), max over ranks and steps.
    psi, units, padded = unit_sizes(init, world)
    cpp_peak = max(m["mem_peak_bytes"] for ranks in metrics["cpp"] for r in ranks for m in r)
    floor_peak = max(m["mem_peak_bytes"] for ranks in metrics["floor"] for r in ranks for m in r)
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

    def per_step_bytes(kind, key):
        vals = {m[key] for ranks in metrics[kind] for r in ranks for m in r}
        return max(vals) if len(vals) == 1 else sorted(vals)

    ring = (world - 1) / world
    expected_ag = 4 * ring * (padded["root"] + 2 * sum(blocks))
    expected_rs = 4 * ring * sum(padded.values())
    summary = {
        "config": c, "world_size": world, "seed": SEED, "psi": psi, "unit_elements": units,
        "cpp_step_ms": t["cpp"]["median"], "peer_step_ms": t["peer"]["median"],
        "floor_step_ms": t["floor"]["median"],
        "step_ms": t,
        "cpp_tokens_per_s": tokens_global / (t["cpp"]["median"] / 1000),
        "peer_tokens_per_s": tokens_global / (t["peer"]["median"] / 1000),
        "floor_tokens_per_s": c["batch"] * c["seq"] / (t["floor"]["median"] / 1000),
        "ratio_vs_peer": t["cpp"]["median"] / t["peer"]["median"],
        "ratio_vs_floor": t["cpp"]["median"] / t["floor"]["median"],
        "loss_first_rel_diff": first_rel, "loss_max_rel_diff": max_rel,
        "loss_rel_diff_per_step": per_step_rel,
        "loss_tolerance": {"first_step": TOL_FIRST_STEP, "any_step": TOL_ANY_STEP},
        "cpp_runs_bitwise_identical": cpp_runs_identical,
        "cpp_loss": [m["loss"] for m in metrics["cpp"][0][0]],
        "peer_loss": [m["loss"] for m in metrics["peer"][0][0]],
        "floor_loss": [m["loss"] for m in metrics["floor"][0][0]],
        "cpp_peak_bytes": cpp_peak,
        "cpp_peak_bytes_per_rank": [max(m["mem_peak_bytes"] for ranks in metrics["cpp"] for m in ranks[k])
                                    for k in range(world)],
        "floor_peak_bytes": floor_peak, "floor_current_bytes": floor_current,
        "bound_bytes": bound,
        "bound_terms": {"persistent_16psi_over_w": persistent, "root_unsharded_params_grads": root_unsharded,
                        "two_blocks_unsharded_params_grads": blocks_unsharded,
                        "floor_peak_minus_16psi": floor_extra,
                        "resident_non_model_floor_current_minus_16psi": floor_current - 16 * psi,
                        "activations_floor_peak_minus_floor_current": floor_peak - floor_current},
        "peak_vs_bound": cpp_peak / bound,
        "bound_bytes_grad_aware": bound_grad_aware,
        "peak_vs_bound_grad_aware": cpp_peak / bound_grad_aware,
        "rss_peak_bytes": {k: max(v) for k, v in rss.items()},
        "peer_rss_peak_growth_bytes": max(m["rss_peak_growth_bytes"] for ranks in metrics["peer"]
                                          for r in ranks for m in r),
        "cpp_bytes_per_step": {"all_gather": per_step_bytes("cpp", "bytes_all_gather"),
                               "reduce_scatter": per_step_bytes("cpp", "bytes_reduce_scatter"),
                               "all_reduce": per_step_bytes("cpp", "bytes_all_reduce")},
        "peer_bytes_per_step": {"all_gather": per_step_bytes("peer", "bytes_all_gather"),
                                "reduce_scatter": per_step_bytes("peer", "bytes_reduce_scatter"),
                                "all_reduce": per_step_bytes("peer", "bytes_all_reduce")},
        "expected_bytes_per_step": {"all_gather": expected_ag, "reduce_scatter": expected_rs},
    }
    return summary


def goals(name, s):
    peer_goal = GOALS["ratio_vs_peer"].get(name, GOALS["ratio_vs_peer"]["small"])
    return [("step time vs peer", s["ratio_vs_peer"], peer_goal),
            ("step time vs floor", s["ratio_vs_floor"], GOALS["ratio_vs_floor"]),
            ("peak memory vs bound", s["peak_vs_bound"], GOALS["peak_vs_bound"]),
            ("peak memory vs grad-aware bound", s["peak_vs_bound_grad_aware"], GOALS["peak_vs_bound"])]


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def spread(t):
    return f"{t['median']:.1f} [{t['p25']:.1f}–{t['p75']:.1f}]"


def write_markdown(path, results, meta):
    L = ["# fsdp-cpp vs PyTorch FSDP2 (CPU, Gloo)", "",
         f"{meta['date']}, W = {meta['world_size']} local ranks, OMP_NUM_THREADS=1 per process, "
         f"{meta['cpus']} CPUs, torch {meta['torch']}. Step times: median [p25–p75] over the timed "
         "steps of all rounds (slowest rank per step); warm-up steps excluded. gpt_train "
         f"{meta['binaries']['gpt_train']['sha256']} built {meta['binaries']['gpt_train']['built']} "
         f"(git HEAD {meta['git_head']}).", ""]
    names = list(results)
    rows = [
        ("model (layers × dim, heads, seq, batch/rank)",
         lambda s: f"{s['config']['layers']}×{s['config']['dim']}, {s['config']['heads']}, "
                   f"{s['config']['seq']}, {s['config']['batch']}"),
        ("parameters Ψ", lambda s: f"{s['psi']:,}"),
        ("AdamW lr (constant)", lambda s: f"{s['config']['lr']:g}"),
        ("steps (warm-up) × rounds",
         lambda s: f"{s['config']['steps']} ({s['config']['warmup']}) × {s['config']['rounds']}"),
        ("C++ step ms", lambda s: spread(s["step_ms"]["cpp"])),
        ("FSDP2 peer step ms", lambda s: spread(s["step_ms"]["peer"])),
        ("floor step ms (1 rank, no comm)", lambda s: spread(s["step_ms"]["floor"])),
        ("ratio C++ / peer", lambda s: f"{s['ratio_vs_peer']:.3f}"),
        ("ratio C++ / floor", lambda s: f"{s['ratio_vs_floor']:.3f}"),
        ("tokens/s C++ / peer (global)", lambda s: f"{s['cpp_tokens_per_s']:.0f} / {s['peer_tokens_per_s']:.0f}"),
        ("tokens/s floor (one rank)", lambda s: f"{s['floor_tokens_per_s']:.0f}"),
        ("loss rel. diff C++ vs peer: step 0 / max", lambda s: f"{s['loss_first_rel_diff']:.2e} / {s['loss_max_rel_diff']:.2e}"),
        ("C++ peak tensor bytes per rank", lambda s: mib(s["cpp_peak_bytes"])),
        ("bound per rank", lambda s: mib(s["bound_bytes"])),
        ("peak / bound", lambda s: f"{s['peak_vs_bound']:.3f}"),
        ("grad-aware bound per rank", lambda s: mib(s["bound_bytes_grad_aware"])),
        ("peak / grad-aware bound", lambda s: f"{s['peak_vs_bound_grad_aware']:.3f}"),
        ("CPU s per run C++ / peer / floor (median)", lambda s: " / ".join(
            f"{statistics.median(r['cpu_s'] for r in s['runs'] if r['kind'] == k):.1f}" for k in ("cpp", "peer", "floor"))),
        ("1-min load average at run starts", lambda s: f"{min(r['loadavg_1min_at_start'] for r in s['runs']):.2f}–"
                                                        f"{max(r['loadavg_1min_at_start'] for r in s['runs']):.2f}"),
        ("peak RSS C++ / peer / floor", lambda s: " / ".join(mib(s["rss_peak_bytes"][k]) for k in ("cpp", "peer", "floor"))),
        ("all-gather bytes/step C++ / peer", lambda s: f"{s['cpp_bytes_per_step']['all_gather']:,} / {s['peer_bytes_per_step']['all_gather']:,}"),
        ("reduce-scatter bytes/step C++ / peer", lambda s: f"{s['cpp_bytes_per_step']['reduce_scatter']:,} / {s['peer_bytes_per_step']['reduce_scatter']:,}"),
        ("all-reduce bytes/step C++ / peer", lambda s: f"{s['cpp_bytes_per_step']['all_reduce']:,} / {s['peer_bytes_per_step']['all_reduce']:,}"),
    ]
    L.append("| | " + " | ".join(names) + " |")
    L.append("|---|" + "---|" * len(names))
    for label, f in rows:
        L.append(f"| {label} | " + " | ".join(f(results[n]) for n in names) + " |")
    L += ["", "## Goals (reported, not enforced)", "", "| configuration | goal | measured | target | met |",
          "|---|---|---|---|---|"]
    for n in names:
        for label, value, target in goals(n, results[n]):
            L.append(f"| {n} | {label} | {value:.3f} | ≤ {target:.2f} | {'yes' if value <= target else 'NO'} |")
    L += ["", "## Bound terms (bytes per rank)", ""]
    for n in names:
        terms = ", ".join(f"{k} {v:,}" for k, v in results[n]["bound_terms"].items())
        L.append(f"- {n}: {terms}")
    L += ["", f"Loss tolerance: step 0 ≤ {TOL_FIRST_STEP:g}, every step ≤ {TOL_ANY_STEP:g} (relative); "
          "see bench/README.md.", ""]
    with open(path, "w") as f:
        f.write("\n".join(L))


def write_plot(path, results):
    import matplotlib.pyplot as plt
    names = list(results)
    fig, axes = plt.subplots(len(names), 5, figsize=(24, 4.6 * len(names)), squeeze=False)
    kinds, colors = ["cpp", "peer", "floor"], {"cpp": "tab:blue", "peer": "tab:orange", "floor": "tab:gray"}
    labels = {"cpp": "fsdp-cpp", "peer": "FSDP2 peer", "floor": "floor (1 rank)"}
    for row, n in zip(axes, names):
        s = results[n]
        ax = row[0]
        for i, k in enumerate(kinds):
            t = s["step_ms"][k]
            ax.bar(i, t["median"], color=colors[k])
            ax.errorbar(i, t["median"], yerr=[[t["median"] - t["p25"]], [t["p75"] - t["median"]]],
                        color="black", capsize=6)
            ax.plot([i] * len(t["round_medians"]), t["round_medians"], "k.", alpha=0.6)
        ax.set_xticks(range(3), [labels[k] for k in kinds])
        ax.set_title(f"{n}: step time (ms), median, IQR, round medians")
        ax = row[1]
        vals = [s["cpp_tokens_per_s"], s["peer_tokens_per_s"], s["floor_tokens_per_s"] * s["world_size"]]
        ax.bar(range(3), vals, color=[colors[k] for k in kinds])
        ax.set_xticks(range(3), ["fsdp-cpp", "FSDP2 peer", f"floor × W"])
        ax.set_title(f"{n}: tokens/s (global; floor × W = ideal)")
        ax = row[2]
        mem = [("C++ tensor peak", s["cpp_peak_bytes"], "tab:blue"), ("bound", s["bound_bytes"], "tab:green"),
               ("grad-aware bound", s["bound_bytes_grad_aware"], "darkseagreen"),
               ("floor tensor peak", s["floor_peak_bytes"], "tab:gray"),
               ("C++ RSS", s["rss_peak_bytes"]["cpp"], "lightsteelblue"),
               ("peer RSS", s["rss_peak_bytes"]["peer"], "navajowhite"),
               ("floor RSS", s["rss_peak_bytes"]["floor"], "lightgray")]
        ax.bar(range(len(mem)), [m[1] / 2**20 for m in mem], color=[m[2] for m in mem])
        ax.set_xticks(range(len(mem)), [m[0] for m in mem], rotation=25, ha="right")
        ax.set_yscale("log")
        ax.set_title(f"{n}: peak memory per rank (MiB, log)")
        ax = row[3]
        keys = ["all_gather", "reduce_scatter", "all_reduce"]
        for j, (who, src, col) in enumerate([("fsdp-cpp", "cpp_bytes_per_step", "tab:blue"),
                                             ("FSDP2 peer", "peer_bytes_per_step", "tab:orange"),
                                             ("ring formula", "expected_bytes_per_step", "tab:green")]):
            v = [s[src].get(k, 0) for k in keys]
            v = [x if isinstance(x, (int, float)) else max(x) for x in v]
            ax.bar([i + (j - 1) * 0.27 for i in range(3)], [x / 2**20 for x in v], width=0.27, color=col, label=who)
        ax.set_xticks(range(3), keys)
        ax.set_title(f"{n}: MiB sent per rank per step")
        ax.legend()
        ax = row[4]
        ax.plot(s["cpp_loss"], "o-", label="fsdp-cpp", color=colors["cpp"])
        ax.plot(s["peer_loss"], "x--", label="FSDP2 peer", color=colors["peer"])
        ax.set_title(f"{n}: loss (max rel. diff {s['loss_max_rel_diff']:.1e})")
        ax.set_xlabel("step")
        ax.legend(loc="upper right")
        twin = ax.twinx()
        twin.plot(s["loss_rel_diff_per_step"], "g:", label="rel. diff")
        twin.set_yscale("symlog", linthresh=1e-9)
        twin.set_ylim(0, 1e-2)
        twin.set_ylabel("relative difference (green)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main():
    ap = argparse.ArgumentParser(description="fsdp-cpp vs PyTorch FSDP2 vs the unsharded floor")
    ap.add_argument("--quick", action="store_true", help="tiny configurations, 3 steps: a smoke run")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"), help="where latest.* go")
    ap.add_argument("--rounds", type=int, default=None, help="override the rounds per configuration")
    ap.add_argument("--configs", default=None, help="comma-separated subset of the configurations")
    ap.add_argument("--work", default=os.path.join(BUILD, "bench"), help="runs' files (logs, metrics)")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that run() stops its child
    out, work = os.path.abspath(args.out), os.path.abspath(args.work)
    os.chdir(ROOT)
    for exe in (GPT_TRAIN, FSDPRUN):
        if not os.access(exe, os.X_OK):
            raise SystemExit(f"[bench] {exe} is missing: run `make build` first")
    ensure_matplotlib()
    import torch
    binaries = snapshot_binaries(work)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip()
    except OSError:
        commit = ""

    configs = QUICK_CONFIGS if args.quick else CONFIGS
    if args.configs:
        configs = {k: configs[k] for k in args.configs.split(",")}
    data = os.path.dirname(os.__file__)  # the Python standard library's sources
    os.makedirs(out, exist_ok=True)
    began = time.time()
    results = {}
    for name, c in configs.items():
        c = dict(c)
        if args.rounds:
            c["rounds"] = args.rounds
        results[name] = bench_config(name, c, args.world_size, data, work, args.timeout)

    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "world_size": args.world_size,
            "cpus": os.cpu_count(), "torch": torch.__version__, "quick": args.quick, "data": data,
            "max_data_mb": MAX_DATA_MB, "seconds": round(time.time() - began, 1),
            "git_head": commit, "binaries": binaries}
    failures = []
    for n, s in results.items():
        if s["loss_first_rel_diff"] > TOL_FIRST_STEP or s["loss_max_rel_diff"] > TOL_ANY_STEP:
            failures.append(f"{n}: loss rel. diff step 0 {s['loss_first_rel_diff']:.2e} "
                            f"(tol {TOL_FIRST_STEP:g}), max {s['loss_max_rel_diff']:.2e} (tol {TOL_ANY_STEP:g})")
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
              + "\n  ".join(failures) + "\n  same weights and batches in fp32 must agree; "
              "one side computes something different.\n" + bar, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
