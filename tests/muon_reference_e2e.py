"""fsdp::optim::Muon against torch.optim.Muon, bit for bit: the same initial matrices and the same
gradients for three steps; PyTorch steps the unsharded matrices, tests/muon_tool.cpp steps them
unsharded (W = 1) and sharded at W = 1, 2 and 3 (full shard), W = 2 (grad-op, no-shard) and
W = 4 (hybrid, shard groups of 2), with nesterov on and off and both adjust_lr_fn values. Matrices
tall, wide, square and one whose pieces are empty on some ranks. Also the sanity of the
reference itself: a rank orthogonalizing only its own piece (PyTorch FSDP2's behaviour) is not
what torch.optim.Muon gives. Where the world is one shard group, the bytes each rank's all-to-alls
sent in the last step equal the formula (2 bytes per element: its pieces of the matrices others
own, and the others' pieces of the matrices it owns), and the busiest owner's Newton-Schulz flops
stay within list scheduling's bound (the balanced share plus one matrix)."""
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SHAPES = {"tall.weight": (48, 20), "wide.weight": (20, 48), "square.weight": (20, 20),
          "small.weight": (5, 20), "mix": (7, 5)}
STEPS = 3
LAYOUTS = [  # (ranks, tool options)
    (1, ["--unsharded"]), (1, []), (2, []), (3, []),
    (2, ["--strategy", "grad_op"]), (2, ["--strategy", "none"]),
    (4, ["--strategy", "hybrid", "--shard-group-size", "2"]),
    # 2-D: split over 2 tensor-parallel ranks, sharded over W / 2 ([Note: Muon on a
    # tensor-parallel matrix]); tall column-wise, wide row-wise, square two fused column-wise parts.
    (2, ["--tp", "2"]), (4, ["--tp", "2"]), (4, ["--tp", "2", "--strategy", "grad_op"]),
]
TP_SPLIT = {"tall.weight", "wide.weight", "square.weight"}  # the others replicated over tp


def make_cases(path):
    gen = torch.Generator().manual_seed(51)
    tensors = {}
    for name, shape in SHAPES.items():
        tensors[name] = torch.randn(shape, generator=gen) * 0.2
        for step in range(STEPS):
            tensors[f"step{step}.{name}"] = torch.randn(shape, generator=gen)
    save_file(tensors, str(path))
    return tensors


def torch_muon(cases, nesterov, adjust):
    params = {name: cases[name].clone() for name in SHAPES}
    muon = torch.optim.Muon(list(params.values()), lr=0.02, weight_decay=0.1, momentum=0.95,
                            nesterov=nesterov, adjust_lr_fn=adjust)
    for step in range(STEPS):
        for name, p in params.items():
            p.grad = cases[f"step{step}.{name}"].clone()
        muon.step()
    return params


def own_rows_only(cases, nesterov, adjust, world):
    """What FSDP2 + torch.optim.Muon computes: each rank orthogonalizes its own rows (dim-0 shards)."""
    params = {name: cases[name].clone() for name in SHAPES}
    for name, p in params.items():
        rows = [r.clone() for r in p.chunk(world)]
        muon = torch.optim.Muon(rows, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=nesterov,
                                adjust_lr_fn=adjust)
        for step in range(STEPS):
            for r, g in zip(rows, cases[f"step{step}.{name}"].chunk(world)):
                r.grad = g.clone()
            muon.step()
        params[name] = torch.cat(rows)
    return params


def ns_flops(shape, steps=5):
    m, n = min(shape), max(shape)
    return steps * (4 * m * m * n + 2 * m * m * m)


def tool_lines(stdout):
    """Each rank's piece of each matrix (elements) and, per case and rank, the matrices it
    orthogonalized, their flops and the all-to-all bytes it sent, from muon_tool's lines."""
    pieces, cases = {}, {}
    for line in stdout.splitlines():
        rank_text, _, text = line.partition("]: ")
        if not rank_text.startswith("[rank"):
            continue
        rank, words = int(rank_text[5:]), text.split()
        if words[:1] == ["piece"]:
            pieces[(rank, words[1])] = int(words[3]) - int(words[2])
        elif words[:1] == ["case"]:
            owned = [] if words[3] == "-" else words[3].split(",")
            cases.setdefault(words[1].rstrip(":"), {})[rank] = (owned, float(words[5]), int(words[7]))
    return pieces, cases


def check_exchange(stdout, world):
    """The all-to-all bytes and the owners' balance of each case, from the tool's per-rank lines."""
    pieces, cases = tool_lines(stdout)
    problems = []
    numel = {name: torch.Size(shape).numel() for name, shape in SHAPES.items()}
    if len(cases) != 4 or any(len(ranks) != world for ranks in cases.values()):
        problems.append(f"the tool's lines name {len(cases)} cases, not 4 with {world} ranks each")
    for case, ranks in cases.items():
        owner = {m: r for r, (owned, _, _) in ranks.items() for m in owned}
        if sorted(owner) != sorted(SHAPES):
            problems.append(f"{case}: owners {owner} do not cover every matrix once")
            continue
        for me, (_, _, sent) in ranks.items():
            want = sum(2 * pieces[(me, m)] for m in SHAPES if owner[m] != me)
            want += sum(2 * (numel[m] - pieces[(me, m)]) for m in SHAPES if owner[m] == me)
            if sent != want:
                problems.append(f"{case}: rank {me} sent {sent} all-to-all bytes, the formula says {want}")
        total = sum(ns_flops(shape) for shape in SHAPES.values())
        busiest = max(flops for _, flops, _ in ranks.values())
        bound = total / world + max(ns_flops(shape) for shape in SHAPES.values()) * (1 - 1 / world)
        if busiest > bound + 1:
            problems.append(f"{case}: the busiest owner's {busiest:.0f} flops exceed {bound:.0f}")
    return problems


def check_tensor_parallel_exchange(stdout, world, tp):
    """At (dp, tp) = (world / tp, tp), world rank = dp index * tp + tp index: each split matrix
    orthogonalized by one rank, each replicated one by one rank per tp index, and every rank's
    all-to-all bytes those of the two stages: its pieces to (and the others' pieces from) the
    matrix's owner in its shard group, then, at that owner, its part to the matrix's owner in the
    tp group (or, there, the other parts back)."""
    pieces, cases = tool_lines(stdout)
    problems = []
    if len(cases) != 4 or any(len(ranks) != world for ranks in cases.values()):
        return [f"the tool's lines name {len(cases)} cases, not 4 with {world} ranks each"]
    local = {m: sum(pieces[(r, m)] for r in range(0, world, tp)) for m in SHAPES}  # a tp part's elements
    for case, ranks in cases.items():
        owners = {m: [r for r, (owned, _, _) in ranks.items() if m in owned] for m in SHAPES}
        for m, who in owners.items():
            want = 1 if m in TP_SPLIT else tp
            if len(who) != want or (m not in TP_SPLIT and sorted(r % tp for r in who) != list(range(tp))):
                problems.append(f"{case}: {m} orthogonalized by ranks {who}")
        if problems:
            continue
        for me, (_, _, sent) in ranks.items():
            dp_me, tp_me = divmod(me, tp)
            want = 0
            for m in SHAPES:
                # The owner in this rank's shard group: the dp index of the final owner(s).
                shard_owner = owners[m][0] // tp
                mine = pieces[(me, m)]
                want += 2 * (local[m] - mine) if shard_owner == dp_me else 2 * mine
                if m in TP_SPLIT and shard_owner == dp_me:
                    want += 2 * local[m] * ((tp - 1) if owners[m][0] % tp == tp_me else 1)
            if sent != want:
                problems.append(f"{case}: rank {me} sent {sent} all-to-all bytes, the formula says {want}")
    return problems


def main(bin_dir):
    torch.set_num_threads(1)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = make_cases(Path(tmp) / "cases.safetensors")
        expected = {}
        for nesterov in (True, False):
            for adjust in ("original", "match_rms_adamw"):
                name = f"{'nesterov' if nesterov else 'plain'}-{adjust}"
                expected[name] = torch_muon(cases, nesterov, adjust)
                fsdp2 = own_rows_only(cases, nesterov, adjust, 2)
                assert any(not torch.equal(fsdp2[k], expected[name][k]) for k in SHAPES), \
                    "the reference cannot tell a rank's own rows from the whole matrix"
                assert all(not torch.equal(expected[name][k], cases[k]) for k in SHAPES)
        for world, options in LAYOUTS:
            out = Path(tmp) / f"w{world}{''.join(options)}"
            out.mkdir()
            command = [f"{bin_dir}/fsdprun", "--nproc-per-node", str(world), f"{bin_dir}/muon_tool",
                       "--cases", str(Path(tmp) / "cases.safetensors"), "--out", str(out),
                       "--steps", str(STEPS), *options]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                failures.append(f"W={world} {options}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
                continue
            if world > 1 and options in ([], ["--strategy", "grad_op"]):
                failures += [f"W={world} {options}: {p}" for p in check_exchange(done.stdout, world)]
            if "--tp" in options and "--strategy" not in options:
                tp = int(options[options.index("--tp") + 1])
                failures += [f"W={world} {options}: {p}" for p in check_tensor_parallel_exchange(done.stdout, world, tp)]
            for name, want in expected.items():
                got = load_file(str(out / f"{name}.safetensors"))
                for k in SHAPES:
                    if not torch.equal(got[k], want[k]):
                        diff = (got[k] - want[k]).abs().max().item()
                        failures.append(f"W={world} {options} {name} {k}: max |diff| {diff:.3e}")
            print(f"W={world} {' '.join(options) or 'full'}: 4 cases x {len(SHAPES)} matrices bitwise equal "
                  f"to torch.optim.Muon" if not failures else f"W={world}: see failures")
    if failures:
        print("\n".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
