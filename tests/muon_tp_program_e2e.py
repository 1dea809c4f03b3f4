"""Muon on a 2-D model, as a user writes it (tests/muon_tp_program.cpp: blocks of
fsdp::tp::Parallel<torch::nn::Linear>, column-wise up and row-wise down with biases, FSDP units,
a plain head; fsdp::optim::Muon on split_for_muon's matrices, AdamW on the rest), at (dp, tp) =
(1, 2), (2, 2) and (2, 1), against the unsplit model trained here by torch.optim.Muon +
torch.optim.AdamW on the same batches: every parameter within 2e-4 (relative to its size) after
6 steps, the bf16 iteration's rounding on gradients that differ in the last bits. The reference
itself can fail: a rank's tp part orthogonalized alone is off by far more.

    muon_tp_program_e2e.py BIN_DIR"""
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

STEPS, ROWS, DIM, HIDDEN, OUT = 6, 8, 12, 40, 3
LAYOUTS = [(2, 2), (4, 2), (2, 1)]  # (ranks, tp)
TOLERANCE = 2e-4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(DIM, HIDDEN), torch.nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(DIM, OUT)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_data(path):
    gen = torch.Generator().manual_seed(58)
    net = Net()
    tensors = {name: torch.randn(p.shape, generator=gen) * 0.3 for name, p in net.named_parameters()}
    for step in range(STEPS):
        tensors[f"x{step}"] = torch.randn(ROWS, DIM, generator=gen)
        tensors[f"y{step}"] = torch.randn(ROWS, OUT, generator=gen)
    save_file(tensors, str(path))
    return tensors


def reference(data, own_part_only_tp=1):
    """torch.optim.Muon on the blocks' weights, AdamW on the rest, the whole batch each step;
    with own_part_only_tp > 1, each weight's tp parts stepped by Muon apart (the bug to catch)."""
    net = Net()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(data[name])
    matrices = [p for name, p in net.named_parameters() if p.dim() == 2 and not name.startswith("head")]
    others = [p for name, p in net.named_parameters() if not (p.dim() == 2 and not name.startswith("head"))]
    muon = torch.optim.Muon(matrices, lr=0.02) if own_part_only_tp == 1 else None
    adamw = torch.optim.AdamW(others, lr=3e-3, weight_decay=0.01)
    part_muons = []
    if own_part_only_tp > 1:
        for block in net.blocks:
            for weight, dim in ((block.up.weight, 0), (block.down.weight, 1)):
                parts = [t.clone().requires_grad_() for t in weight.detach().chunk(own_part_only_tp, dim)]
                part_muons.append((weight, dim, parts, torch.optim.Muon(parts, lr=0.02)))
    for step in range(STEPS):
        net.zero_grad()
        torch.nn.functional.mse_loss(net(data[f"x{step}"]), data[f"y{step}"]).backward()
        if muon:
            muon.step()
        for weight, dim, parts, part_muon in part_muons:
            for part, grad in zip(parts, weight.grad.chunk(own_part_only_tp, dim)):
                part.grad = grad.clone()
            part_muon.step()
            with torch.no_grad():
                weight.copy_(torch.cat([p.detach() for p in parts], dim))
        adamw.step()
    return {name: p.detach() for name, p in net.named_parameters()}


def worst(got, want):
    return max(((got[k] - want[k]).norm() / want[k].norm()).item() for k in want)


def main(bin_dir):
    torch.set_num_threads(1)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        data = make_data(Path(tmp) / "data.safetensors")
        want = reference(data)
        apart = worst(reference(data, own_part_only_tp=2), want)
        assert apart > 50 * TOLERANCE, f"the reference cannot tell tp parts stepped apart ({apart:.1e})"
        for ranks, tp in LAYOUTS:
            out = Path(tmp) / f"w{ranks}tp{tp}.safetensors"
            run = subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", str(ranks), f"{bin_dir}/muon_tp_program",
                                  "--data", str(Path(tmp) / "data.safetensors"), "--out", str(out),
                                  "--steps", str(STEPS), "--tp", str(tp)], capture_output=True, text=True)
            if run.returncode != 0:
                failures.append(f"(dp, tp) = ({ranks // tp}, {tp}): exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
                continue
            got = load_file(str(out))
            difference = worst(got, want)
            print(f"(dp, tp) = ({ranks // tp}, {tp}): parameters within {difference:.1e} of torch.optim.Muon + AdamW "
                  f"(tp parts stepped apart: {apart:.1e})", flush=True)
            if difference > TOLERANCE:
                failures.append(f"(dp, tp) = ({ranks // tp}, {tp}): parameters {difference:.2e} off, over {TOLERANCE}")
    if failures:
        print("\n".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
