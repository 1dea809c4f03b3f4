"""What a save stalls training: the synchronous save's whole time against an asynchronous save's
staging (the call's return; the write then runs in the background), side by side in one run.

checkpoint_tool under fsdprun (W ranks) saves a GPT after one AdamW step, once with
fsdp::save_checkpoint and once with fsdp::save_checkpoint_async (--async-save: stall_seconds is
the call, save_seconds the call and wait()), each --repeat times, alternating.

  .venv/bin/python bench/checkpoint/async_stall.py [--world 2] [--layers 8] [--dim 512]

Writes bench/results/async-checkpoint.md (--out to change).
"""
import argparse
import statistics
import tempfile
from pathlib import Path

from run import ROOT, tool


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "async-checkpoint.md"))
    args = parser.parse_args()
    model = ["--layers", str(args.layers), "--dim", str(args.dim), "--heads", "8"]
    sync_stall, async_stall, async_total = [], [], []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            sync = tool(args.bin, args.world, model, "--steps", 1, "--save", f"{tmp}/sync")
            sync_stall.append(float(sync["save_seconds"][0]))
            saved = tool(args.bin, args.world, model, "--steps", 1, "--save", f"{tmp}/async", "--async-save")
            async_stall.append(float(saved["stall_seconds"][0]))
            async_total.append(float(saved["save_seconds"][0]))
            mb = int(sync["save_seconds"][1]) / 1e6
    med = statistics.median
    rows = [
        "# Asynchronous checkpoints: the stall (bench/checkpoint/async_stall.py)",
        "",
        f"GPT {args.layers} layers x {args.dim}, W={args.world}, {mb:.1f} MB a checkpoint, "
        f"median of {args.repeat} (CPU ranks, the machine's own disk):",
        "",
        "| save | training stalls (s) | save done (s) |",
        "|---|---|---|",
        f"| fsdp::save_checkpoint | {med(sync_stall):.4f} | {med(sync_stall):.4f} |",
        f"| fsdp::save_checkpoint_async | {med(async_stall):.4f} | {med(async_total):.4f} (wait() at once) |",
        "",
    ]
    Path(args.out).write_text("\n".join(rows))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
