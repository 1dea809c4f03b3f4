#!/usr/bin/env python3
"""Do Muon's tests catch what they claim? Each mutation below changes fsdp::optim::Muon the way a
plausible bug would; this script applies it in WORKTREE, rebuilds muon_tool, runs
tests/muon_reference_e2e.py (torch.optim.Muon given the same gradients, bitwise, at W = 1, 2, 3,
grad-op, no-shard and hybrid), which must fail, and restores the file with git checkout.

    .venv/bin/python tests/muon_mutations.py WORKTREE [--only ID,...]

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed.
Prints a Markdown table: mutation -> red (the first failure it printed), or SURVIVED (exit 1)."""
import argparse
import subprocess
import sys
from pathlib import Path

REFERENCE = "tests/muon_reference_e2e.py"

# (id, file, exact original text, mutated text)
MUTATIONS = [
    # What PyTorch FSDP2 + torch.optim.Muon does: each rank orthogonalizes the piece it holds.
    ("own-piece-orthogonalized", "src/optim/muon.cpp",
     "  const std::vector<at::Tensor> mine =\n"
     "      muon::scatter_from_owners(group, exchanged, results, pieces.front().options());\n",
     "  std::vector<at::Tensor> mine;\n"
     "  for (size_t e = 0; e < exchanged.size(); ++e)\n"
     "    mine.push_back(pieces[e].numel() ? orthogonalize(pieces[e].view({1, -1}), *now[which[e]]->options)"
     ".reshape(-1) : pieces[e]);\n"),
    ("transpose-skipped", "src/optim/newton_schulz.cpp",
     "const bool tall = update.size(0) > update.size(1);", "const bool tall = false;"),
    ("momentum-not-kept", "src/optim/muon.cpp",
     "buffer.lerp_(s.grad, 1 - momentum);", "buffer = buffer.lerp(s.grad, 1 - momentum);"),
    ("piece-sent-back-from-the-wrong-offset", "src/optim/muon_exchange.cpp",
     "const int64_t start = starts_of(m.piece_numels)[r];",
     "const int64_t start = starts_of(m.piece_numels)[r == 0 ? 0 : r - 1];"),
    ("lr-adjusted-by-cols-over-rows", "src/optim/newton_schulz.cpp",
     "return lr * std::sqrt(std::max(1.0, rows / cols));", "return lr * std::sqrt(std::max(1.0, cols / rows));"),
]


def sh(cmd, cwd, timeout=None):
    return subprocess.run(cmd, cwd=cwd, text=True, capture_output=True, timeout=timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("worktree")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    wt = Path(args.worktree).resolve()
    only = set(filter(None, args.only.split(",")))
    rows, survived = [], 0
    build = ["cmake", "--build", "build", "-j2", "--target", "muon_tool", "fsdprun"]
    for mid, path, original, mutated in MUTATIONS:
        if only and mid not in only:
            continue
        text = (wt / path).read_text()
        if text.count(original) != 1:
            sys.exit(f"{mid}: the original text occurs {text.count(original)} times in {path}")
        try:
            (wt / path).write_text(text.replace(original, mutated))
            built = sh(build, wt)
            if built.returncode != 0:
                sys.exit(f"{mid}: the mutated build failed:\n{built.stdout[-3000:]}")
            run = sh([sys.executable, REFERENCE, str(wt / "build" / "bin")], wt, timeout=900)
            if run.returncode == 0:
                verdict = "SURVIVED"
                survived += 1
            else:
                lines = [l for l in run.stdout.splitlines() if "diff" in l or "exit" in l]
                verdict = f"red ({(lines or ['exit ' + str(run.returncode)])[0][:140]})"
            rows.append(f"| {mid} | `{path}` | {verdict} |")
            print(rows[-1], flush=True)
        finally:
            sh(["git", "checkout", "--", path], wt)
    sh(build, wt)
    print("| mutation | file | result |\n|---|---|---|\n" + "\n".join(rows))
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
