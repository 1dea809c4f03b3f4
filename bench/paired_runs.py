"""Paired runs of the deep (or small) configuration: builds of gpt_train (W = 2 under their fsdprun) and the
concurrent floor, interleaved round by round, so that a noisy machine slows all of them alike.
Each run's time is the median over steps 10.. of the slower rank's (or process's) step; prints
every round and the median of the rounds, and writes them as JSON to --out.

  .venv/bin/python bench/paired_runs.py --rounds 8 cpp=build/bin other=/tmp/other/bin floor=build/bin
  (a name `floor` runs the concurrent floor with that directory's gpt_train; a name `x@cpp`
  with `:VAR=VALUE,...` after the directory runs cpp under those environment variables)
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

# bench/run_bench.py's shapes: model flags, batch per rank, steps per run (the first 10 untimed).
CONFIGS = {
    "deep": (["--layers", "48", "--dim", "32", "--heads", "2", "--seq", "16"], 1, 60),
    "small": (["--layers", "4", "--dim", "128", "--heads", "4", "--seq", "128"], 8, 24),
}


def run(cmds, env):
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=dict(os.environ, OMP_NUM_THREADS="1", **env)) for c in cmds]
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            sys.exit(f"failed: {' '.join(cmds[0])}\n{err.decode()[-2000:]}")


def median_step(paths, warmup=10):
    ranks = [[json.loads(line) for line in open(p) if line.strip()] for p in paths]
    return statistics.median(max(r[s]["step_ms"] for r in ranks) for s in range(warmup, len(ranks[0])))


def one_run(kind, bindir, env, train, work):
    paths = [os.path.join(work, f"{kind}-rank{k}.jsonl") for k in range(2)]
    gpt_train = os.path.join(bindir, "gpt_train")
    if kind == "floor":
        run([[gpt_train, "--reference", "--world-size", "1"] + train + ["--metrics", p] for p in paths], env)
    else:
        metrics = os.path.join(work, f"{kind}-rank{{rank}}.jsonl")
        run([[os.path.join(bindir, "fsdprun"), "--nproc-per-node", "2", gpt_train] + train +
             ["--metrics", metrics]], env)
    return median_step(paths)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="deep")
    ap.add_argument("--steps", type=int, default=None, help="per run (default: the config's)")
    ap.add_argument("--out", default=None)
    ap.add_argument("variants", nargs="+", help="name=BINDIR[:VAR=VALUE,...]")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="paired-runs-")
    data = os.path.dirname(os.__file__)  # text every machine has
    first = a.variants[0].split("=", 1)[1].partition(":")[0]
    model, batch, steps = CONFIGS[a.config]
    steps = a.steps or steps
    init = os.path.join(work, "init.pt")
    run([[os.path.join(first, "gpt_train"), "--reference", "--steps", "0", "--save-full", init,
          "--data", data] + model], {})
    train = model + ["--lr", "1e-3", "--seed", "1234", "--data", data, "--max-data-mb", "4",
                     "--steps", str(steps), "--batch", str(batch), "--optimizer", "fused", "--init-from", init]
    variants = []
    for v in a.variants:
        name, rest = v.split("=", 1)
        bindir, _, envs = rest.partition(":")
        variants.append((name, bindir, dict(e.split("=", 1) for e in envs.split(",") if e)))
    results = {name: [] for name, _, _ in variants}
    for r in range(a.rounds):
        for name, bindir, env in variants:
            kind = "floor" if name.split("@")[-1] == "floor" else "cpp"
            results[name].append(one_run(kind, bindir, env, train, work))
        print(r, {k: round(x[-1], 2) for k, x in results.items()}, flush=True)
    medians = {k: round(statistics.median(x), 2) for k, x in results.items()}
    print("median of the rounds' medians:", medians)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"command": sys.argv, "rounds": results, "medians": medians}, f, indent=1)


if __name__ == "__main__":
    main()
