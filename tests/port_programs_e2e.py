"""End to end: the four public-style LibTorch programs ported to fsdp-cpp (tests/port_programs.h)
train two steps sharded over 2 ranks (tests/port_programs_export.cpp, under fsdprun) and write
their full state dicts with fsdp::save_full_params. Each loads into the same model written in
PyTorch with load_state_dict(strict=True), every parameter and BatchNorm buffer named as PyTorch
names it, and in eval mode gives the sharded model's output on the same input.

Tolerance: both sides run the same ATen kernels on the same values in fp32; outputs agree to a few
ulp (measured: printed below), checked at rtol 1e-5, atol 1e-6."""
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch import nn


class MnistNet(nn.Module):  # cpp/mnist's CNN with a BatchNorm
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.bn1(self.conv1(x)), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 64)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, 0.5, self.training)
        return F.log_softmax(self.fc2(x), dim=1)


class Generator(nn.Module):  # cpp/dcgan's generator, smaller
    def __init__(self, noise=8):
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(noise, 32, 4, bias=False)
        self.batch_norm1 = nn.BatchNorm2d(32)
        self.conv2 = nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1, bias=False)
        self.batch_norm2 = nn.BatchNorm2d(16)
        self.conv3 = nn.ConvTranspose2d(16, 1, 4, stride=2, padding=1, bias=False)

    def forward(self, x):
        x = F.relu(self.batch_norm1(self.conv1(x)))
        x = F.relu(self.batch_norm2(self.conv2(x)))
        return torch.tanh(self.conv3(x))


def discriminator():  # cpp/dcgan's Sequential, smaller
    return nn.Sequential(
        nn.Conv2d(1, 16, 4, stride=2, padding=1, bias=False),
        nn.LeakyReLU(0.2),
        nn.Conv2d(16, 32, 4, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.LeakyReLU(0.2),
        nn.Conv2d(32, 1, 4, stride=1, padding=0, bias=False),
        nn.Sigmoid())


class LstmNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 8, num_layers=2, dropout=0.2, batch_first=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        output, _ = self.lstm(x)
        return self.fc(output[:, -1])


class DistMnistNet(nn.Module):  # cpp/distributed/dist-mnist's model
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, 5)
        self.conv2 = nn.Conv2d(10, 20, 5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, 0.5, self.training)
        return F.log_softmax(self.fc2(x), dim=1)


# name -> (PyTorch model, BatchNorm forwards in training: num_batches_tracked after two steps)
MODELS = {
    "mnist": (MnistNet, 2),
    "generator": (Generator, 2),
    "discriminator": (discriminator, 6),  # three forwards a step: real, fake.detach(), fake
    "lstm": (LstmNet, None),
    "dist_mnist": (DistMnistNet, None),
}


def main(bin_dir):
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", "2",
                        f"{bin_dir}/port_programs_export", tmp], check=True, timeout=240)
        for name, (make, batches) in MODELS.items():
            state = torch.load(f"{tmp}/{name}.pt")
            io = torch.load(f"{tmp}/{name}-io.pt")
            model = make()
            fresh = {k: v.clone() for k, v in model.state_dict().items()}
            model.load_state_dict(state, strict=True)  # every name, every shape, nothing else
            assert list(state) and set(state) == set(fresh), (name, sorted(state))
            changed = [k for k in state if not torch.equal(state[k], fresh[k])]
            assert len(changed) == len(state), (name, "not trained or not loaded:",
                                                sorted(set(state) - set(changed)))
            for key, value in state.items():
                if key.endswith("num_batches_tracked"):
                    assert value.item() == batches, (name, key, value.item(), batches)
            model.eval()
            with torch.no_grad():
                output = model(io["input"])
            diff = (output - io["output"]).abs().max().item()
            torch.testing.assert_close(output, io["output"], rtol=1e-5, atol=1e-6)
            print(f"{name}: {len(state)} tensors loaded strictly, eval output max |diff| {diff:.3g}")


if __name__ == "__main__":
    main(sys.argv[1])
