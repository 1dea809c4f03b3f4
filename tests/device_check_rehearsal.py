"""The device check's Python steps rehearsed on the CPU, as scripts/device_check.sh runs them on a
GPU: tests/gpu_check.py --device cpu (its parity and memory checks bar offload), then
bench/gpu_bench.py --rehearse (a tiny model, CPU ranks, every contender in its interleaved rounds,
the two-device step, the host's AdamW step), bench/plan_vs_gpu.py on its results and
bench/gpu_models.py --rehearse (a tiny Llama and GPT against FSDP2). What only a
GPU can get wrong is not tested here; what the scripts themselves get wrong is: a run that cannot
start, a contender missing, a measurement or report that cannot be made, losses that disagree.

    python3 tests/device_check_rehearsal.py BUILD_DIR
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from gpu_bench import CONTENDERS, LABELS, REHEARSAL_GPUS, ROUNDS  # noqa: E402
from gpu_models import CONTENDERS as MODEL_CONTENDERS, MODELS, ROUNDS as MODEL_ROUNDS  # noqa: E402

failures = []


def check(condition, what):
    print(("PASS " if condition else "FAIL ") + what, flush=True)
    if not condition:
        failures.append(what)


def main():
    build = Path(sys.argv[1]).resolve()
    with tempfile.TemporaryDirectory(prefix="device-check-rehearsal-") as tmp:
        tmp = Path(tmp)
        checked = subprocess.run([sys.executable, REPO / "tests" / "gpu_check.py", "--device", "cpu", "--build", build,
                                  "--parallel", "2", "--work", tmp / "check-runs", "--out", tmp / "gpu-check.json"],
                                 capture_output=True, text=True, timeout=600)
        print(checked.stdout[-4000:], checked.stderr[-3000:])
        check(checked.returncode == 0 and (tmp / "gpu-check.json").exists(),
              f"gpu_check.py --device cpu passes (exit {checked.returncode})")

        out = tmp / "gpu-bench.json"
        bench = subprocess.run([sys.executable, REPO / "bench" / "gpu_bench.py", "--rehearse", "--build", build,
                                "--work", tmp / "runs", "--out", out], capture_output=True, text=True, timeout=900)
        print(bench.stdout[-6000:], bench.stderr[-3000:])
        check(bench.returncode == 0, f"gpu_bench.py --rehearse exits 0 (got {bench.returncode})")
        if not out.exists():
            check(False, f"{out.name} written")
            return
        summary = json.loads(out.read_text())
        results = summary["results"]
        for kind in CONTENDERS:
            r = results.get(kind, {})
            check(r.get("ok") and len(r["runs"]) == ROUNDS and r["tokens_per_s"] > 0,
                  f"{kind}: {ROUNDS} runs measured")
        multi = results.get(f"fsdp_cpp_w{REHEARSAL_GPUS}", {})
        check(multi.get("ok") and multi["world"] == REHEARSAL_GPUS and
              abs(multi["tokens_per_s_per_gpu"] * REHEARSAL_GPUS - multi["tokens_per_s"]) < 1e-6 * multi["tokens_per_s"],
              f"fsdp-cpp at W = {REHEARSAL_GPUS} (the multi-GPU step) measured, tokens/s per GPU")
        check(results.get("fsdp_cpp_keep", {}).get("ok"), "fsdp-cpp without resharding after forward measured")
        agreeing = summary["loss_agreement"]
        expected = [k for k in CONTENDERS if k != "fsdp_cpp"] + ["fsdp_cpp_keep", f"fsdp_cpp_w{REHEARSAL_GPUS}"]
        check(sorted(agreeing) == sorted(expected) and all(a["passed"] for a in agreeing.values()),
              f"losses of {', '.join(expected)} agree with fsdp-cpp's: {agreeing}")
        goals = summary["goals"]
        check(results["fsdp_cpp"]["mem_peak_bytes"] > 0, "fsdp-cpp's peak memory measured")
        # Offload needs a GPU; the FSDP2 peer reports memory only there.
        on_device = [n for n in goals if not n.startswith("offload") and "peak" not in n]
        check(all(isinstance(goals[n]["value"], float) and goals[n]["value"] > 0 for n in on_device),
              f"every goal but offload's has a value: {[(n, goals[n]['value']) for n in on_device]}")
        host = summary.get("host_adamw") or {}
        check(host.get("ok") and host["step_ms"] > 0 and host["elements"] == summary["model"]["params"],
              f"the host's AdamW step measured over every parameter: {host}")
        report = out.with_suffix(".md").read_text()
        check(all(LABELS[k] in report for k in CONTENDERS), "the report names every contender")
        check("Host AdamW" in report, "the report gives the host's AdamW step")

        plan_out = tmp / "gpu-plan.json"
        plan = subprocess.run([sys.executable, REPO / "bench" / "plan_vs_gpu.py", "--build", build, "--bench", out,
                               "--out", plan_out], capture_output=True, text=True, timeout=300)
        print(plan.stdout[-2000:], plan.stderr[-2000:])
        check(plan.returncode == 0 and plan_out.exists(), "plan_vs_gpu.py runs on the rehearsal's results")
        if plan_out.exists():
            ratios = json.loads(plan_out.read_text())
            check(ratios["step_planned_vs_measured"] > 0 and ratios["peak_planned_vs_measured"] > 0,
                  f"planned against measured: step {ratios['step_planned_vs_measured']:.3f}x, "
                  f"peak {ratios['peak_planned_vs_measured']:.3f}x")

        models(build, tmp)


def models(build, tmp):
    """bench/gpu_models.py --rehearse: both models, both contenders, every round, losses agreeing."""
    out = tmp / "gpu-models.json"
    run = subprocess.run([sys.executable, REPO / "bench" / "gpu_models.py", "--rehearse", "--build", build,
                          "--work", tmp / "model-runs", "--out", out], capture_output=True, text=True, timeout=600)
    print(run.stdout[-4000:], run.stderr[-3000:])
    check(run.returncode == 0 and out.exists(), f"gpu_models.py --rehearse exits 0 (got {run.returncode})")
    if not out.exists():
        return
    results = json.loads(out.read_text())["results"]
    for name in MODELS:
        r = results.get(name, {})
        measured = all(r.get(k, {}).get("ok") and len(r[k]["runs"]) == MODEL_ROUNDS and r[k]["tokens_per_s"] > 0
                       for k in MODEL_CONTENDERS)
        check(measured and r.get("losses_agree"), f"{name}: fsdp-cpp and FSDP2 measured in {MODEL_ROUNDS} "
              f"rounds, losses agreeing (max relative difference {r.get('loss_max_relative_difference')})")


if __name__ == "__main__":
    main()
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
