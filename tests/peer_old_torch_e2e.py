"""The FSDP2 peer (bench/peer_fsdp2.py) on the torch.distributed of torch 2.11, simulated on this
torch: without all_gather_single / reduce_scatter_single (2.11 has only all_gather_into_tensor /
reduce_scatter_tensor, and its FSDP2 calls those). The peer must train and count the same bytes
and losses as on this torch's own names, step for step.

    peer_old_torch_e2e.py BIN_DIR CORPUS_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BIN, CORPUS = Path(sys.argv[1]), Path(sys.argv[2])
PEER = Path(__file__).resolve().parents[1] / "bench" / "peer_fsdp2.py"
SIZES = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--batch", "2"]
STEPS = 3
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
    ENV.pop(name, None)

# Run as the program instead of the peer: hides the newer names, points FSDP2 at the older ones
# (looked up at call time, so the peer's byte counter on them sees every call), runs the peer.
OLD_TORCH = '''
import runpy, sys
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard import _fsdp_collectives

NEWER_TO_OLDER = {"all_gather_single": "all_gather_into_tensor",
                  "reduce_scatter_single": "reduce_scatter_tensor"}
for newer in NEWER_TO_OLDER:
    delattr(dist, newer)

class Torch211Distributed:
    def __getattr__(self, name):
        return getattr(dist, NEWER_TO_OLDER.get(name, name))

_fsdp_collectives.dist = Torch211Distributed()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout + r.stderr


def peer(tmp, script, tag, init, batches):
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--log-dir", str(tmp / "torchrun"), *script, *SIZES, "--steps", str(STEPS), "--init-from", init, "--batches", batches,
               "--metrics", str(tmp / f"{tag}-{{rank}}.jsonl")])
    records = [json.loads(line) for line in (tmp / f"{tag}-0.jsonl").read_text().splitlines()]
    return out, [(r["loss"], r["bytes_all_gather"], r["bytes_reduce_scatter"]) for r in records]


def main():
    with tempfile.TemporaryDirectory(prefix="peer_old_torch_") as tmp:
        tmp = Path(tmp)
        init, batches = str(tmp / "init.pt"), str(tmp / "batches.pt")
        common = [str(BIN / "gpt_train"), "--reference", "--world-size", "2", *SIZES,
                  "--data", str(CORPUS), "--max-data-mb", "1"]
        run([*common, "--steps", "0", "--save-full", init])
        run([*common, "--steps", str(STEPS), "--dump-batches", batches])
        shim = tmp / "torch211.py"
        shim.write_text(OLD_TORCH)
        new_out, new = peer(tmp, [str(PEER)], "new", init, batches)
        old_out, old = peer(tmp, [str(shim), str(PEER)], "old", init, batches)
        assert "dist.all_gather_into_tensor and dist.reduce_scatter_tensor" in old_out, old_out
        assert len(new) == STEPS and all(ag > 0 and rs > 0 for _, ag, rs in new), new
        assert old == new, f"torch 2.11's names: {old}\nthis torch's: {new}"
        print(f"peer on this torch ({new_out.splitlines()[0] if new_out else ''}) and on torch 2.11's "
              f"names: {STEPS} steps, equal losses and bytes: {new}")
    print("peer on torch 2.11's torch.distributed: OK")


if __name__ == "__main__":
    main()
