"""End to end: fsdp-cpp's sharded checkpoints are PyTorch's too. gpt_train trains at W = 2 and
saves a sharded checkpoint; then, in Python:
- safetensors.safe_open opens every shard file and reads every tensor;
- torch.distributed.checkpoint.load(..., storage_reader=HuggingFaceStorageReader(folder),
  no_dist=True) assembles full parameters bitwise equal to fsdp's own full state dict
  (gpt_train --save-full: gathered by fsdp-cpp's collectives, not read from the files), and full
  AdamW state bitwise equal to fsdp::gather_full_optimizer_state (checkpoint_tool
  --dump-full-state), from fsdp::save_checkpoint and from fsdp::save_checkpoint_async alike;
- a checkpoint of two optimizers over one model (checkpoint_state_tool --optimizer muon+adamw:
  fsdp::optim::Muon's momentum_buffer for the matrices beside AdamW's exp_avg, exp_avg_sq and
  step for the rest) reads the same way, bitwise equal to fsdp::gather_full_optimizer_state, and
  the tool resumes it at W = 3;
- a PyTorch FSDP2 model (bench/peer_fsdp2.py's GPT, the same architecture) at W = 3 loads the
  parameters and the AdamW state from the same folder, and its losses on the next two batches
  (the second after one AdamW step on the loaded state) equal gpt_train's resumed at W = 3.
Run: dcp_interop_e2e.py BIN_DIR CORPUS   (the FSDP2 side runs this file under torchrun)."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
LOSS_REL_TOL = 1e-5  # the same weights and rows at W = 3 on both sides: only summation order differs
CONFIG = dict(layers=2, dim=32, heads=2, max_seq=16)  # also checkpoint_tool's defaults
LR, WEIGHT_DECAY = 3e-3, 0.1  # constant (no warm-up), as checkpoint_tool's
SAVED_STEP = 4


def launch(bin_dir, world, program, *args):
    command = [f"{bin_dir}/fsdprun", "--nproc-per-node", str(world), f"{bin_dir}/{program}",
               *map(str, args)]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def gpt_train(bin_dir, corpus, world, steps, *args):
    """gpt_train on the global batch of 6 rows; returns the global loss of each step it trained."""
    with tempfile.TemporaryDirectory() as folder:
        metrics = Path(folder) / "m{rank}.jsonl"
        launch(bin_dir, world, "gpt_train", "--data", corpus, "--layers", CONFIG["layers"],
               "--dim", CONFIG["dim"], "--heads", CONFIG["heads"], "--seq", CONFIG["max_seq"],
               "--batch", 6 // world, "--steps", steps, "--lr", LR, "--weight-decay", WEIGHT_DECAY,
               "--metrics", metrics, *args)
        lines = Path(str(metrics).replace("{rank}", "0")).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def check_safe_open(folder):
    from safetensors import safe_open
    files = sorted(folder.glob("*.safetensors"))
    assert files, f"{folder} has no safetensors files"
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            assert "DCP_SHARDING_INFO" in f.metadata(), f"{path.name}: no DCP_SHARDING_INFO"
            for key in f.keys():
                f.get_tensor(key)
    return len(files)


def check_dcp_full_load(folder, full):
    """dcp.load with no process group fills full tensors; each must equal fsdp's gathered one."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    # fsdp's names are DCP's; AdamW's step is saved as PyTorch's AdamW keeps it, a float.
    wanted = {k: t.float() if k.endswith(".step") else t for k, t in full.items()}
    # Filled with what no saved tensor holds: NaN, or -7 for an integer buffer (num_batches_tracked).
    state = {k: torch.full_like(t, float("nan") if t.is_floating_point() else -7) for k, t in wanted.items()}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)), no_dist=True)
    for k, expected in wanted.items():
        assert torch.equal(state[k], expected), f"{k}: dcp.load differs from fsdp's gathered one"
    return len(wanted)


def check_two_optimizers(bin_dir, tmp):
    """Muon + AdamW at W = 2, saved; dcp.load reads every parameter, buffer and state tensor of
    both optimizers bitwise as fsdp gathers them; the tool resumes the checkpoint at W = 3."""
    launch(bin_dir, 2, "checkpoint_state_tool", "--optimizer", "muon+adamw", "--steps", 2,
           "--save", tmp / "two", "--dump-full-state", tmp / "two-full.pt")
    full = torch.load(tmp / "two-full.pt")
    kinds = {k.rsplit(".", 1)[1] for k in full if k.startswith("state.")}
    assert kinds == {"momentum_buffer", "exp_avg", "exp_avg_sq", "step"}, f"state kinds {kinds}"
    count = check_dcp_full_load(tmp / "two" / "step-00000002", full)
    out = launch(bin_dir, 3, "checkpoint_state_tool", "--optimizer", "muon+adamw", "--steps", 1,
                 "--load", tmp / "two")
    assert "resumed_step 2" in out, out
    return count


def fsdp2_worker(folder, batches_path, out_path):
    """Under torchrun at W = 3: FSDP2 loads the checkpoint, then the losses of two steps."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    sys.path.insert(0, str(ROOT / "bench"))
    import peer_fsdp2 as peer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    model = peer.GPT(**CONFIG)
    for block in model.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = peer.make_optimizer(model, LR, WEIGHT_DECAY)  # gpt_train's AdamW
    state = dict(model.state_dict())
    for name, p in model.named_parameters():
        optim.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                          "exp_avg_sq": torch.zeros_like(p)}
        for kind, tensor in optim.state[p].items():
            state[f"state.{name}.{kind}"] = tensor
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)))

    batches = torch.load(batches_path)  # gpt_train --dump-batches: [steps, rows, seq]
    losses = {}
    for step in (SAVED_STEP, SAVED_STEP + 1):
        x, y = batches["inputs"][step], batches["targets"][step]
        rows = x.size(0) // world
        x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        optim.zero_grad()
        loss = peer.lm_loss(model(x), y)
        loss.backward()
        optim.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses[step] = total.item() / world
    if rank == 0:
        Path(out_path).write_text(json.dumps(losses))
    peer.leave_together()


def main(bin_dir, corpus):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        gpt_train(bin_dir, corpus, 2, SAVED_STEP, "--save-every", SAVED_STEP,
                  "--checkpoint-dir", tmp / "ckpt", "--save-full", tmp / "full.pt")
        folder = tmp / "ckpt" / f"step-{SAVED_STEP:08d}"
        files = check_safe_open(folder)
        params = check_dcp_full_load(folder, torch.load(tmp / "full.pt"))

        launch(bin_dir, 2, "checkpoint_tool", "--data", corpus, "--batch", 3, "--steps", 3,
               "--save", tmp / "tool", "--dump-full-state", tmp / "tool-full.pt")
        full_state = torch.load(tmp / "tool-full.pt")
        assert any(k.endswith(".exp_avg") for k in full_state), "no optimizer state to compare"
        state = check_dcp_full_load(tmp / "tool" / "step-00000003", full_state)
        # The same from an asynchronous save (fsdp::save_checkpoint_async's background thread).
        launch(bin_dir, 2, "checkpoint_tool", "--data", corpus, "--batch", 3, "--steps", 3,
               "--save", tmp / "tool-async", "--async-save", "--dump-full-state", tmp / "tool-async-full.pt")
        check_dcp_full_load(tmp / "tool-async" / "step-00000003", torch.load(tmp / "tool-async-full.pt"))
        two = check_two_optimizers(bin_dir, tmp)

        resumed = gpt_train(bin_dir, corpus, 3, SAVED_STEP + 2, "--checkpoint-dir", tmp / "ckpt",
                            "--resume", "--dump-batches", tmp / "batches.pt")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "3", "--log-dir", tmp / "torchrun",
                        __file__, "--fsdp2-worker", str(folder),
                        str(tmp / "batches.pt"), str(tmp / "fsdp2.json")], check=True, env=env)
        fsdp2 = {int(k): v for k, v in json.loads((tmp / "fsdp2.json").read_text()).items()}
        worst = 0.0
        for step, loss in fsdp2.items():
            relative = abs(loss - resumed[step]) / abs(resumed[step])
            assert relative <= LOSS_REL_TOL, (
                f"step {step}: FSDP2 at W=3 from the checkpoint gives loss {loss!r}, "
                f"gpt_train resumed at W=3 {resumed[step]!r} ({relative:.3g} relative)")
            worst = max(worst, relative)
    print(f"dcp interop: safe_open read {files} shard files; dcp.load(no_dist) gave {params} "
          f"parameters bitwise equal to gpt_train's full state dict and {state} parameters + AdamW "
          f"tensors bitwise equal to fsdp's gathered ones (from a synchronous and an asynchronous save), and {two} tensors of a Muon+AdamW "
          f"checkpoint likewise; FSDP2 at W=3 from gpt_train's W=2 "
          f"checkpoint: losses of steps {SAVED_STEP} and {SAVED_STEP + 1} within {worst:.2g} "
          "relative of gpt_train resumed at W=3")


if __name__ == "__main__":
    if sys.argv[1] == "--fsdp2-worker":
        fsdp2_worker(*sys.argv[2:5])
    else:
        main(sys.argv[1], sys.argv[2])
