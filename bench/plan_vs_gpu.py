"""The planner against the GPU benchmark (bench/gpu_bench.py's 1.3 B GPT, bf16, W = 1): gpt_train
--plan --device cuda, with the device probed on this GPU at the model's shapes, beside the fsdp-cpp
run's measured step time and peak in gpu-bench.json (its model and device: the CPU after
gpu_bench's rehearsal). Writes gpu-plan.json and prints the ratios.

    python bench/plan_vs_gpu.py --build build-gpu --bench bench/results/gpu-bench.json --out bench/results/gpu-plan.json
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import BF16, Model  # noqa: E402  (the benchmark's own precision)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--bench", default="bench/results/gpu-bench.json")
    ap.add_argument("--out", default="bench/results/gpu-plan.json")
    args = ap.parse_args()
    bench = json.loads(Path(args.bench).read_text())
    measured = bench["results"]["fsdp_cpp"]
    batch = measured["batch"]
    model = Model(**{key: bench["model"][key] for key in ("layers", "dim", "heads", "seq")})
    device = bench.get("device", "cuda")  # the CPU in gpu_bench's rehearsal
    plan = json.loads(subprocess.run(
        [f"{args.build}/bin/gpt_train", "--plan", "--json", "--device", device, "--ranks", "1",
         *model.flags(), *BF16, "--batch", str(batch)], check=True, capture_output=True,
        text=True).stdout)
    report = {"batch": batch, "planned_step_ms": plan["time"]["step_s"] * 1000,
              "measured_step_ms": measured["step_ms"], "planned_peak_bytes": plan["peak_bytes"],
              "measured_peak_bytes": measured["mem_peak_bytes"], "plan": plan}
    report["step_planned_vs_measured"] = report["planned_step_ms"] / report["measured_step_ms"]
    report["peak_planned_vs_measured"] = report["planned_peak_bytes"] / report["measured_peak_bytes"]
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"plan vs GPU bench (batch {batch}): step {report['planned_step_ms']:.0f} ms planned, "
          f"{report['measured_step_ms']:.0f} ms measured ({report['step_planned_vs_measured']:.3f}x); peak "
          f"{report['planned_peak_bytes'] / 2**30:.2f} GiB planned, {report['measured_peak_bytes'] / 2**30:.2f} "
          f"GiB measured ({report['peak_planned_vs_measured']:.3f}x)")


if __name__ == "__main__":
    main()
