"""Step time of gpt_train across 2 hosts x 2 ranks when the link between hosts is slow.

Each host's egress (eth0 in its namespace) is limited with tc tbf; traffic between the ranks of
one host goes over loopback and is not limited. FULL_SHARD vs HYBRID_SHARD (shard group = one
host) x --backward-prefetch pre vs none, at each rate. Writes bench/results/hosts-slow-link.md
and .json (or the paths given). Run as root:

    .venv/bin/python tests/hosts/slow_link_bench.py build/bin [OUT_MD]
"""
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster  # noqa: E402
import netns  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LAYERS, DIM, HEADS, SEQ, BATCH, VOCAB = 4, 256, 4, 64, 2, 256
MODEL = ["--layers", str(LAYERS), "--dim", str(DIM), "--heads", str(HEADS), "--seq", str(SEQ),
         "--batch", str(BATCH), "--lr", "1e-3"]
STEPS = 8  # step 0 is warm-up; the median of the rest is reported
ROUNDS = 2
RATES = [None, "1gbit", "200mbit"]
STRATEGIES = {"FULL_SHARD": ["--strategy", "full"],
              "HYBRID_SHARD": ["--strategy", "hybrid", "--shard-group-size", "2"]}
PREFETCH = ["pre", "none"]


def psi():
    d = DIM
    return VOCAB * d + SEQ * d + 2 * d + LAYERS * (12 * d * d + 13 * d)


def formula_bytes(strategy, w=4, per_host=2):
    d = DIM
    root, block = VOCAB * d + SEQ * d + 2 * d, 12 * d * d + 13 * d
    if strategy == "FULL_SHARD":
        return 4 * (w - 1) * (root + 2 * LAYERS * block + psi()) // w
    return per_host * 4 * psi() // per_host


def rate_bits(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for suffix, factor in units.items():
        if rate.endswith(suffix):
            return float(rate[: -len(suffix)]) * factor
    raise ValueError(rate)


def main():
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "build/bin")
    out_md = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "bench/results/hosts-slow-link.md"
    why = netns.unavailable()
    if why:
        print(f"SKIP: network namespaces cannot be made here: {why}")
        return 0
    runs = {}  # (rate, strategy, prefetch) -> list of (round, step_ms list, tx per host per step)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, netns.Hosts(2) as hosts:
        corpus = cluster.make_corpus(f"{tmp}/corpus.txt", size=200_000)
        for round_ in range(ROUNDS):  # rounds interleave, so a burst of load hits every config
            for rate in RATES:
                for h in range(hosts.n):
                    burst = "1mb" if rate is None else f"{max(64_000, int(rate_bits(rate) / 8 / 100))}b"
                    hosts.rate_limit(h, rate, burst=burst)
                for name, flags in STRATEGIES.items():
                    for prefetch in PREFETCH:
                        before = [hosts.counters(h)["tx_bytes"] for h in range(hosts.n)]
                        launch = cluster.Launch(hosts, f"{bin_dir}/gpt_train",
                                                ["--data", corpus, *MODEL, *flags, "--steps",
                                                 str(STEPS), "--backward-prefetch", prefetch],
                                                env={"FSDP_TIMEOUT_SECONDS": "120"})
                        launch.check(300)
                        after = [hosts.counters(h)["tx_bytes"] for h in range(hosts.n)]
                        steps = [m["step_ms"] for m in launch.rank_metrics(0)]
                        tx = max(a - b for a, b in zip(after, before)) / STEPS
                        runs.setdefault((rate or "unlimited", name, prefetch), []).append(
                            {"round": round_, "steps_ms": [round(x, 1) for x in steps],
                             "tx_bytes_per_host_per_step": int(tx)})
                        print(round_, rate, name, prefetch, round(statistics.median(steps[1:]), 1),
                              int(tx), flush=True)
        for h in range(hosts.n):
            hosts.rate_limit(h, None)
    elapsed = time.monotonic() - started
    rows = []
    for (rate, name, prefetch), rs in runs.items():
        measured = [x for r in rs for x in r["steps_ms"][1:]]
        tx = statistics.median(r["tx_bytes_per_host_per_step"] for r in rs)
        formula = formula_bytes(name)
        rows.append({"rate": rate, "strategy": name, "backward_prefetch": prefetch,
                     "step_ms": round(statistics.median(measured), 1),
                     "round_medians_ms": [round(statistics.median(r["steps_ms"][1:]), 1) for r in rs],
                     "tx_bytes_per_host_per_step": int(tx), "formula_bytes_per_host_per_step": formula,
                     "wire_ms_at_rate": None if rate == "unlimited" else
                     round(formula * 8 / rate_bits(rate) * 1e3, 1), "runs": rs})
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.with_suffix(".json").write_text(json.dumps(
        {"model": {"layers": LAYERS, "dim": DIM, "heads": HEADS, "seq": SEQ, "batch_per_rank": BATCH,
                   "params": psi()}, "hosts": 2, "ranks_per_host": 2, "steps": STEPS, "rounds": ROUNDS,
         "cpu_count": os.cpu_count(), "loadavg_after": os.getloadavg(), "rows": rows}, indent=1) + "\n")
    lines = ["# Across hosts: a slow link (tests/hosts/slow_link_bench.py)", "",
             f"2 hosts (network namespaces on a bridge) x 2 ranks, gpt_train --layers {LAYERS} --dim "
             f"{DIM} --heads {HEADS} --seq {SEQ} --batch {BATCH} (Ψ = {psi():,} parameters, fp32), "
             f"{STEPS} steps, {ROUNDS} rounds interleaved; step ms = median over rank 0's steps 2..{STEPS} "
             "of all rounds (per-round medians in brackets). Each host's egress limited with "
             "`tc qdisc tbf`; ranks of one host talk over loopback (not limited). "
             f"Machine: {os.cpu_count()} cores shared by the 4 ranks and by other jobs (load average "
             f"{os.getloadavg()[0]:.1f} at the end), so compute is slow and noisy; the bench took "
             f"{elapsed:.0f} s.", "",
             "tx = kernel eth0 tx bytes per host / steps (start-up included); formula = cross-host "
             "bytes per host per step from Ψ (FULL_SHARD: one ring hop leaves each host, 4·(W-1)/W·"
             "(Ψ gathered fwd+bwd + Ψ reduce-scattered); HYBRID_SHARD: 2 ranks x a 2-rank all-reduce "
             "of their 4Ψ/2-byte shard = 4Ψ); wire ms = formula at the link's rate, the least time "
             "the link needs per step.", "",
             "| link | strategy | backward prefetch | step ms | tx bytes/host/step | formula | wire ms |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rate']} | {r['strategy']} | {r['backward_prefetch']} | {r['step_ms']} "
                     f"{r['round_medians_ms']} | {r['tx_bytes_per_host_per_step']:,} | "
                     f"{r['formula_bytes_per_host_per_step']:,} | {r['wire_ms_at_rate'] or '-'} |")
    out_md.write_text("\n".join(lines) + "\n")
    print(f"wrote {out_md} ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
