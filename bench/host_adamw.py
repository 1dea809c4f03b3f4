"""What one AdamW step costs on this machine's CPU at a model's size: the host's part of a
CPU-offloaded step (gpt_train --cpu-offload steps each unit's fp32 shard on the CPU with ATen's
fused AdamW as its gradient lands). With W = 1 the host steps every parameter each step, and
backward hides at most its own length of that; the rest adds to the step. bench/gpu_bench.py runs
this beside its offload run, so that an offload step slower than the goal can be read as "the host
is the bound" or "the engine leaves time on the table".

    python3 bench/host_adamw.py --layers 26 --dim 2048 --heads 16 --seq 2048

Prints one JSON line: the median step over the timed ones (ms), the bytes AdamW moves (it reads a
parameter, its gradient and both moments and writes three of them back: 28 bytes an fp32 element)
per second, the elements and the threads. Threads: one per logical core, as fsdprun gives a
single rank (OMP_NUM_THREADS = cores / ranks per host).
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_check import Model  # noqa: E402

BYTES_PER_ELEMENT = 7 * 4  # four fp32 tensors read, three written


def unit_sizes(model):
    """One flat fp32 shard per FSDP unit, as gpt_train wraps the GPT: the root, then each block."""
    return [model.root_params()] + [model.block_params()] * model.layers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one untimed)")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    sizes = unit_sizes(Model(args.layers, args.dim, args.heads, args.seq))
    # Values that keep every element a normal float through the steps (denormals would be slower).
    params = [torch.full((n,), 0.02) for n in sizes]
    grads = [torch.full((n,), 1e-3) for n in sizes]
    exp_avgs = [torch.zeros(n) for n in sizes]
    exp_avg_sqs = [torch.zeros(n) for n in sizes]
    steps = [torch.zeros(1) for _ in sizes]
    seconds = []
    for _ in range(1 + args.steps):
        start = time.perf_counter()
        for unit in range(len(sizes)):  # a call per unit, as the offloaded engine steps them
            steps[unit].add_(1)
            torch._fused_adamw_([params[unit]], [grads[unit]], [exp_avgs[unit]], [exp_avg_sqs[unit]], [],
                                [steps[unit]], lr=3e-4, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8,
                                amsgrad=False, maximize=False)
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds[1:])
    elements = sum(sizes)
    print(json.dumps({"step_ms": median * 1000, "gb_per_s": BYTES_PER_ELEMENT * elements / median / 1e9,
                      "elements": elements, "threads": torch.get_num_threads(),
                      "step_ms_all": [s * 1000 for s in seconds]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
