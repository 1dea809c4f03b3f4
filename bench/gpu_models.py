"""The device check's other models, beside gpu_bench.py's 1.3 B GPT: fsdp-cpp against PyTorch FSDP2
(both W = 1, NCCL, fused AdamW, bf16 with fp32 masters and fp32 reduction) on
  llama1b    a Llama-3.2-1B-shaped model: 16 layers x 2048, 32 heads, 8 key/value heads, SwiGLU
             8192, vocabulary 128,256, head tied to the embedding, rope theta 500000, seq 2048
             (1.24 B parameters); FSDP2 trains transformers' own LlamaForCausalLM, loaded from the
             folder that gpt_train --steps 0 --export-hf writes of the same seed's weights;
  gpt2small  GPT-2 124M's shapes (12 x 768, 12 heads, seq 1024, the byte vocabulary) at batch 2:
             a short step, where what each framework spends on the host shows.
Each model: ROUNDS interleaved rounds (fsdp-cpp, FSDP2; then FSDP2, fsdp-cpp), the same weights and
batches (the first fsdp-cpp run's --dump-batches); tokens/s is batch x seq / the median timed step,
the peak is the caching allocator's peak in a step. The losses must agree within 2e-2 relative at
every step (bf16). Writes --out (JSON) and the same name with .md.

    python3 bench/gpu_models.py [--build build-gpu] [--out bench/results/gpu-models.json]
    python3 bench/gpu_models.py --rehearse --build build --out DIR/gpu-models.json   # CPU, tiny (CI)
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_check import REPO, Run, Runner, ensure_corpus, environment, relative_differences, say  # noqa: E402

BF16 = ["--param-dtype", "bf16", "--reduce-dtype", "fp32"]
LR, SEED = "3e-4", "1234"
ROUNDS, WARMUP, TIMED = 2, 2, 3
LOSS_TOLERANCE = 2e-2
CONTENDERS = ("fsdp_cpp", "fsdp2_fused")

# name: gpt_train's model flags, seq, batch, and whether FSDP2 reads a Hugging Face folder (a Llama:
# transformers' own model) or gpt_train's full parameters (bench/peer_fsdp2.py's GPT).
LLAMA_1B = ["--model", "llama", "--layers", "16", "--dim", "2048", "--heads", "32", "--kv-heads", "8",
            "--ffn-dim", "8192", "--vocab", "128256", "--rope-theta", "500000", "--tie-head"]
MODELS = {
    "llama1b": {"flags": LLAMA_1B, "seq": 2048, "batch": 8, "hf": True},
    "gpt2small": {"flags": ["--layers", "12", "--dim", "768", "--heads", "12"], "seq": 1024, "batch": 2,
                  "hf": False},
}
REHEARSAL_MODELS = {
    "llama1b": {"flags": ["--model", "llama", "--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2",
                          "--ffn-dim", "96", "--vocab", "512", "--rope-theta", "500000", "--tie-head"],
                "seq": 32, "batch": 2, "hf": True},
    "gpt2small": {"flags": ["--layers", "2", "--dim", "64", "--heads", "2"], "seq": 32, "batch": 2, "hf": False},
}


class ModelBench:
    def __init__(self, name, m, args, corpus):
        self.name, self.m = name, m
        self.device = "cpu" if args.rehearse else "cuda"
        self.runner = Runner(args.build, Path(args.work or Path(args.build) / "gpu-models") / name,
                             fixed_ports=not args.rehearse)
        self.common = [*m["flags"], "--seq", str(m["seq"]), "--lr", LR, "--seed", SEED, "--data", str(corpus)]
        self.init = self.runner.work / ("init-hf" if m["hf"] else "init.pt")
        self.batches = self.runner.work / "batches.pt"

    def write_initial_weights(self):
        """The seed's weights for FSDP2, written by the reference on the CPU (no GPU needed)."""
        out = ["--export-hf", self.init] if self.m["hf"] else ["--save-full", self.init]
        run = Run("init", [self.runner.bin / "gpt_train", "--reference", *self.common, "--steps", "0", *out],
                  writes_metrics=False)
        self.runner.execute(run, timeout_s=300)
        if run.rc != 0:
            raise SystemExit(f"gpu_models {self.name}: writing {self.init} failed; see {run.log}")

    def make(self, kind, tag):
        steps, batch = WARMUP + TIMED, self.m["batch"]
        if kind == "fsdp_cpp":
            dump = ["--dump-batches", str(self.batches)] if tag == "r1" else []
            return self.runner.fsdp(f"{kind}_{tag}", 1, ["--device", self.device, *self.common, *BF16,
                                                         "--batch", str(batch), "--steps", str(steps),
                                                         "--optimizer", "fused", *dump])
        name = f"{kind}_{tag}"
        model = ["--model", "llama"] if self.m["hf"] else self.m["flags"]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
               "--log-dir", self.runner.work / name / "torchrun", REPO / "bench" / "peer_fsdp2.py",
               "--device", self.device, *model, "--seq", str(self.m["seq"]), *BF16, "--batch", str(batch),
               "--steps", str(steps), "--lr", LR, "--init-from", self.init, "--batches", self.batches,
               "--metrics", self.runner.metrics_pattern(name), "--fused"]
        return Run(name, cmd)


def measure(run, m):
    if not run.ok:
        return {"ok": False, "rc": run.rc, "log": str(run.log), "out_of_memory": run.out_of_memory}
    records = run.metrics[0]
    step_ms = statistics.median(r["step_ms"] for r in records[WARMUP:])
    return {"ok": True, "step_ms_median": step_ms, "tokens_per_s": m["batch"] * m["seq"] / (step_ms / 1000),
            "mem_peak_bytes": run.max_over_ranks_and_steps("mem_peak_bytes"), "losses": run.losses(),
            "seconds": round(run.seconds, 1)}


def bench_model(bench):
    """ROUNDS rounds of both contenders, alternating which goes first (fsdp-cpp first in round 1:
    it dumps the batches)."""
    bench.write_initial_weights()
    runs = {kind: [] for kind in CONTENDERS}
    for r in range(ROUNDS):
        for kind in (CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]):
            run = bench.make(kind, f"r{r + 1}")
            bench.runner.execute(run, timeout_s=300)
            runs[kind].append(measure(run, bench.m))
            got = runs[kind][-1]
            say(f"gpu_models {bench.name} round {r + 1} {kind}: " +
                (f"{got['step_ms_median']:.1f} ms/step, {got['tokens_per_s']:.0f} tokens/s"
                 if got["ok"] else f"failed (exit {got['rc']})"))
    result = {}
    for kind, measured in runs.items():
        ok = [x for x in measured if x["ok"]]
        result[kind] = {"ok": len(ok) == len(measured), "runs": measured}
        if ok:
            result[kind].update(tokens_per_s=statistics.median(x["tokens_per_s"] for x in ok),
                                mem_peak_bytes=max(x["mem_peak_bytes"] for x in ok), losses=ok[0]["losses"])
    both = all(result[k]["ok"] for k in CONTENDERS)
    if both:
        diffs = relative_differences(result["fsdp_cpp"]["losses"], result["fsdp2_fused"]["losses"])
        result["loss_max_relative_difference"] = max(diffs)
        result["losses_agree"] = max(diffs) <= LOSS_TOLERANCE
        result["cpp_vs_fsdp2_tokens_per_s"] = result["fsdp_cpp"]["tokens_per_s"] / result["fsdp2_fused"]["tokens_per_s"]
        peer_peak = result["fsdp2_fused"]["mem_peak_bytes"]  # 0 on a CPU: the peer reports a GPU's only
        result["cpp_vs_fsdp2_peak"] = result["fsdp_cpp"]["mem_peak_bytes"] / peer_peak if peer_peak else None
    return result


def markdown(summary):
    lines = [f"# GPU models: fsdp-cpp vs FSDP2 (fused AdamW), bf16, {ROUNDS} interleaved rounds", "",
             str(summary["environment"]), "",
             "| model | batch x seq | fsdp-cpp tokens/s | FSDP2 tokens/s | ratio | peak GiB (cpp / FSDP2) | losses |",
             "|---|---|---|---|---|---|---|"]
    for name, r in summary["results"].items():
        m = summary["models"][name]
        if "cpp_vs_fsdp2_tokens_per_s" not in r:
            lines.append(f"| {name} | {m['batch']} x {m['seq']} | failed | | | | |")
            continue
        c, p = r["fsdp_cpp"], r["fsdp2_fused"]
        lines.append(f"| {name} | {m['batch']} x {m['seq']} | {c['tokens_per_s']:.0f} | {p['tokens_per_s']:.0f} | "
                     f"{r['cpp_vs_fsdp2_tokens_per_s']:.3f} | {c['mem_peak_bytes'] / 2**30:.2f} / "
                     f"{p['mem_peak_bytes'] / 2**30:.2f} | max rel diff {r['loss_max_relative_difference']:.1e} |")
    lines += ["", f"Command: `python3 bench/gpu_models.py` (scripts/device_check.sh); {summary['seconds']} s", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-gpu", help="the build folder (its bin/ and test-corpus/)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu-models.json"))
    ap.add_argument("--rehearse", action="store_true", help="on the CPU with tiny models (CI)")
    ap.add_argument("--work", help="the runs' folder (default: BUILD/gpu-models)")
    ap.add_argument("--models", default=",".join(MODELS), help="a comma-separated subset")
    args = ap.parse_args()
    start = time.monotonic()
    corpus = ensure_corpus(args.build, False)
    table = REHEARSAL_MODELS if args.rehearse else MODELS
    results = {name: bench_model(ModelBench(name, table[name], args, corpus)) for name in args.models.split(",")}
    summary = {"environment": environment(), "seconds": round(time.monotonic() - start, 1),
               "rehearsal": args.rehearse, "models": {k: table[k] for k in results}, "results": results}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(markdown(summary))
    say(markdown(summary))
    bad = [name for name, r in results.items() if not r.get("losses_agree")]
    if bad:
        say(f"gpu_models: FAILED (a run failed or the losses disagree): {bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
