"""An LSTM language model's port (bench/lstm_port.cpp, issue 49 item 11) against its concurrent floor:
interleaved rounds of {the port at W = 2 under fsdprun, the port with the LSTM and the decoder as
units (--units), W unsharded --reference processes at the same time}, each run timing every
step of the slowest rank (or process); each kind's time is the median over the timed steps of all
rounds. Writes bench/results/lstm_port.{md,json} (--out elsewhere). See bench/README.md, "An LSTM
language model's port".

Run from the repository root:  .venv/bin/python bench/lstm_port.py [--rounds 4] [--steps 10] [--optimizer sgd|adam]
                               [--before OTHER/build/bin]   (adds that build's port: a before/after pair)
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_bench import BUILD, FSDPRUN, RESULTS, ROOT, git, idle_wait, launch, quantile, read_jsonl  # noqa: E402

LSTM_PORT = os.path.join(BUILD, "bin", "lstm_port")
KINDS = ("port", "port_units", "concurrent_floor")
IDLE_WAIT_S = 3


def kinds(args):
    return KINDS + (("port_before",) if args.before else ())


def commands(kind, r, args, d):
    """One run's commands and the metrics files they write (one per rank or process)."""
    train = ["--steps", str(args.steps), "--optimizer", args.optimizer, "--lr", str(args.lr),
             "--world-size", str(args.world_size)]
    metrics = os.path.join(d, f"{kind}-r{r}-rank{{rank}}.jsonl")
    paths = [metrics.format(rank=k) for k in range(args.world_size)]
    if kind == "concurrent_floor":
        return [[LSTM_PORT, "--reference"] + train + ["--metrics", p] for p in paths], paths
    units = ["--units"] if kind == "port_units" else []
    fsdprun, program = FSDPRUN, LSTM_PORT
    if kind == "port_before":
        fsdprun, program = (os.path.join(args.before, name) for name in ("fsdprun", "lstm_port"))
    return [[fsdprun, "--nproc-per-node", str(args.world_size), program] + train + units +
            ["--metrics", metrics]], paths


def run_kind(kind, r, args, d):
    """One run: the slowest rank's time of each timed step, and the run's record."""
    cmds, paths = commands(kind, r, args, d)
    logs = [os.path.join(d, f"{kind}-r{r}-p{k}.log") for k in range(len(cmds))]
    res = launch(cmds, logs, args.timeout)
    ranks = [read_jsonl(p) for p in paths]
    if any(res["exit_codes"]) or any(len(m) != args.steps for m in ranks):
        raise SystemExit(f"[lstm_port] FAILED: {kind} round {r}, exit codes {res['exit_codes']}, logs {logs}")
    steps = [max(m[s]["step_ms"] for m in ranks) for s in range(args.warmup, args.steps)]
    record = {"round": r, "kind": kind, "median_step_ms": round(statistics.median(steps), 1),
              "others_busy_cores": round(res["others"], 2), "losses": [m[-1]["loss"] for m in ranks]}
    print(f"[lstm_port] round {r} {kind}: {record['median_step_ms']} ms "
          f"(others {record['others_busy_cores']} cores)", flush=True)
    return steps, record


def summarize(pooled):
    return {"median": statistics.median(pooled), "p25": quantile(pooled, 0.25), "p75": quantile(pooled, 0.75),
            "samples": len(pooled)}


def write_markdown(path, report):
    t, m = report["step_ms"], report["meta"]
    lines = [f"# LSTM language model port: step time against the concurrent floor (W = {m['world_size']})", "",
             f"`{m['command']}` at {m['git_head'][:12]}{' (DIRTY TREE)' if m['git_dirty'] else ''}, {m['date']}, "
             f"{m['rounds']} interleaved rounds of {m['steps']} steps ({m['warmup']} warm-up), "
             f"{m['optimizer']}; the rest of the machine kept {m['others_busy_cores_median']} cores busy "
             f"(median over runs; {m['idle_busy_cores_before']} before the first round).", "",
             "Ratio: the kind's median step over the concurrent floor's, pooled over every round's timed "
             "steps, and (the load changes from round to round) the median of the rounds' own ratios.", "",
             "| | median step ms [p25–p75] | ratio / concurrent floor: pooled, rounds' median | round medians ms |",
             "|---|---|---|---|"]
    for kind in t:
        s = t[kind]
        rounds = ", ".join(f"{x:.0f}" for x in report["round_medians"][kind])
        lines.append(f"| {kind} | {s['median']:.1f} [{s['p25']:.1f}–{s['p75']:.1f}] | "
                     f"{report['ratios'][kind]:.3f}, {report['round_ratios_median'][kind]:.3f} | {rounds} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10, help="per run, the first --warmup untimed")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    ap.add_argument("--lr", type=float, default=None, help="default: 20 (sgd, as main.py) or 1e-3 (adam)")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--before", default=None, help="another build's bin folder (fsdprun, lstm_port): its port runs too")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--work", default=os.path.join(BUILD, "bench", "lstm_port"))
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run")
    args = ap.parse_args()
    if args.lr is None:
        args.lr = 20.0 if args.optimizer == "sgd" else 1e-3
    return args


def main():
    args = parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    idle_before = round(idle_wait(IDLE_WAIT_S), 2)
    every = kinds(args)
    pooled, round_medians, records = {k: [] for k in every}, {k: [] for k in every}, []
    for r in range(args.rounds):
        for kind in every[r % len(every):] + every[:r % len(every)]:  # rotated: drifts hit every kind alike
            steps, record = run_kind(kind, r, args, args.work)
            pooled[kind] += steps
            round_medians[kind].append(record["median_step_ms"])
            records.append(record)
    step_ms = {k: summarize(v) for k, v in pooled.items()}
    floor = step_ms["concurrent_floor"]["median"]
    meta = {"command": " ".join(["bench/lstm_port.py"] + sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "git_head": git("rev-parse", "HEAD"), "git_dirty": bool(git("status", "--porcelain")),
            "world_size": args.world_size, "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
            "optimizer": args.optimizer, "lr": args.lr, "idle_busy_cores_before": idle_before,
            "others_busy_cores_median": round(statistics.median(x["others_busy_cores"] for x in records), 2)}
    report = {"meta": meta, "step_ms": step_ms, "round_medians": round_medians,
              "ratios": {k: step_ms[k]["median"] / floor for k in every},
              "round_ratios_median": {k: statistics.median(x / f for x, f in zip(round_medians[k], round_medians["concurrent_floor"]))
                                      for k in every}, "runs": records}
    with open(os.path.join(args.out, "lstm_port.json"), "w") as f:
        json.dump(report, f, indent=1)
    write_markdown(os.path.join(args.out, "lstm_port.md"), report)
    with open(os.path.join(args.out, "lstm_port.md")) as f:
        print(f.read())


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
