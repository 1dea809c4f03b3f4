"""Sharded checkpoint throughput against the disk's own speed.

Ceiling: dd writing 256 MiB with O_DIRECT and a final fsync, and reading it back with O_DIRECT.
Measured: checkpoint_tool under fsdprun (W ranks) saving a GPT after one AdamW step (parameters +
two moments = 12 bytes per parameter, every file fsynced), then loading it in new processes after
the files were evicted from the page cache (posix_fadvise DONTNEED), so the load reads the disk.

  .venv/bin/python bench/checkpoint/run.py [--dir /tmp] [--world 2] [--layers 8] [--dim 512]

Writes bench/results/checkpoint.md (--out to change). The files are safetensors: a rank's range of
a matrix is up to 3 boxes, each in its own file, so the run also reports files and header bytes.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def dd(args):
    out = subprocess.run(["dd", *args], check=True, capture_output=True, text=True).stderr
    seconds = float(re.search(r"copied, ([0-9.]+) s", out).group(1))
    return 256 * 2**20 / seconds / 1e6  # MB/s


def evict(folder):
    for path in Path(folder).rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def tool(bin_dir, world, model, *args):
    out = subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", str(world),
                          f"{bin_dir}/checkpoint_tool", "--data", str(ROOT / "build" / "test-corpus"), "--batch", "1",
                          "--seq", "32", *model, *map(str, args)],
                         check=True, capture_output=True, text=True).stdout
    return {m.group(1): m.group(2).split() for m in re.finditer(r"(\w+_seconds) (.*)", out)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "checkpoint.md"))
    args = parser.parse_args()
    model = ["--layers", str(args.layers), "--dim", str(args.dim), "--heads", "8"]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        write = dd(["if=/dev/zero", f"of={tmp}/dd.bin", "bs=1M", "count=256", "oflag=direct",
                    "conv=fsync"])
        read = dd([f"if={tmp}/dd.bin", "of=/dev/null", "bs=1M", "iflag=direct"])
        os.remove(f"{tmp}/dd.bin")
        saved = tool(args.bin, args.world, model, "--steps", 1, "--save", f"{tmp}/ckpt")
        save_s, nbytes = float(saved["save_seconds"][0]), int(saved["save_seconds"][1])
        files = sorted(Path(tmp, "ckpt").glob("step-*/*.safetensors"))
        header_bytes = sum(8 + int.from_bytes(f.read_bytes()[:8], "little") for f in files)
        evict(f"{tmp}/ckpt")
        loaded = tool(args.bin, args.world, model, "--load", f"{tmp}/ckpt")
        load_s = float(loaded["load_seconds"][0])
    lines = [
        "# Sharded checkpoint throughput against dd",
        "",
        "`.venv/bin/python bench/checkpoint/run.py " + " ".join(sys.argv[1:]) + "`",
        "",
        f"- disk ({args.dir}): dd write {write:.0f} MB/s (O_DIRECT + fsync), dd read {read:.0f} MB/s "
        "(O_DIRECT)",
        f"- checkpoint, W={args.world}, GPT {args.layers}x{args.dim}, {nbytes / 1e6:.1f} MB in "
        f"{len(files)} safetensors files ({header_bytes / 1e3:.1f} kB of headers, "
        f"{100 * header_bytes / nbytes:.2f}%) + metadata.json",
        f"- save {save_s:.3f} s = {nbytes / save_s / 1e6:.0f} MB/s "
        f"({100 * nbytes / save_s / 1e6 / write:.0f}% of dd write)",
        f"- load (page cache evicted) {load_s:.3f} s = {nbytes / load_s / 1e6:.0f} MB/s "
        f"({100 * nbytes / load_s / 1e6 / read:.0f}% of dd read)",
    ]
    print("\n".join(lines))
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
