"""`make bench`'s Muon configurations (issue 51): what run_bench.py measures of gpt_train
--optimizer muon beyond the step time, its goals and its table.

A Muon configuration runs six kinds in the same rounds (run_bench.py interleaves them):
  cpp               gpt_train --optimizer muon at W ranks (fsdp::optim::Muon on the blocks'
                    matrices, each orthogonalized whole at one owner; the fused AdamW on the rest)
  cpp_overlap       the same with --step-in-backward: each unit's matrices exchanged and
                    orthogonalized on the optimizer's thread while backward goes on
                    (fsdp::optim::StepInBackward); the step's optimizer.step() waits for the rest
  cpp_adamw         the same model, batches and ranks with --optimizer fused (AdamW everywhere)
  peer              PyTorch FSDP2 + torch.optim.Muon on the same split (bench/peer_fsdp2.py
                    --optimizer muon): each rank orthogonalizes its own rows, so its weights are
                    not Muon's (the caveat the table prints)
  floor             gpt_train --reference --world-size 1 --optimizer muon on one rank's batch: one
                    rank orthogonalizing every matrix, alone on the machine
  concurrent_floor  W such processes at once

Measured here (bench/README.md, "Muon"):
  optimizer time    each step's optimizer.step() (gpt_train's optimizer_ms: AdamW's and Muon's
                    step; the slowest rank per step), at W ranks against the floors' (one rank
                    orthogonalizing every matrix); for cpp_overlap, what is left of the optimizer
                    after backward, with its step time against cpp's (the work moved into
                    backward must not make the step slower)
  Newton-Schulz     each rank's flops of the step's iterations (gpt_train's muon_ns_flops, from
                    fsdp::optim::Muon::last_step_work()): the busiest rank against the balanced
                    share (all ranks' sum / W), and the largest matrix's (no placement of whole
                    matrices can put less than one on the busiest rank)
"""

KINDS = ("cpp", "cpp_overlap", "cpp_adamw", "peer", "floor", "concurrent_floor")  # round 0 starts with cpp
NS_STEPS = 5  # torch.optim.Muon's default ns_steps, gpt_train's

# Goals (bench/README.md, "Muon"). The optimizer at W = 2, its iterations overlapped with backward
# (cpp_overlap), leaves at most 0.6 × one rank orthogonalizing every matrix after backward, and
# the overlapped step is no slower than the step that runs Muon after backward (within 5 %: the
# work moved into backward must not come back as step time). The busiest rank's Newton-Schulz
# flops within 10 % of the balanced share, or of one matrix's where the largest matrix alone is
# more than that (a whole matrix cannot be split).
GOALS = {"optimizer_vs_one_rank": 0.60, "overlapped_step_vs_plain": 1.05, "ns_busiest_vs_balanced": 1.10}

PEER_CAVEAT = ("FSDP2 + torch.optim.Muon trains without a word but is wrong: each rank "
               "orthogonalizes its own rows (dim-0 shards), so its weights are not those of "
               "torch.optim.Muon on the unsharded model; its loss departs from gpt_train's after "
               "step 0 (issue 51). Its step time is shown for scale, not as a like-for-like peer.")


def is_muon(c):
    return c.get("optimizer") == "muon"


def iteration_flops(shape, ns_steps=NS_STEPS):
    """The Newton-Schulz iteration's flops of one matrix, as fsdp::optim::Muon counts them
    (src/optim/newton_schulz.cpp): per step X Xᵀ (2m²n), the Gram polynomial (2m³) and its
    product with X (2m²n), m ≤ n the matrix's sides."""
    m, n = sorted(shape)
    return ns_steps * (2 * m * m * n + 2 * m * m * m + 2 * m * m * n)


def muon_matrices(init_path):
    """The matrices gpt_train --optimizer muon gives Muon: every block's (h.{i}.*) 2-D parameter."""
    import torch
    params = torch.load(init_path)
    return {name: tuple(t.shape) for name, t in params.items() if name.startswith("h.") and t.dim() == 2}


def per_rank(metrics, key):
    """One value of `key` per rank, the same at every step of every round (else a list of them)."""
    values = []
    for k in range(len(metrics[0])):
        seen = {m[key] for ranks in metrics for m in ranks[k]}
        values.append(seen.pop() if len(seen) == 1 else sorted(seen))
    return values


def summarize(c, world, init_path, metrics, step_ms, optimizer_ms):
    """The Muon configuration's own numbers; step_ms, optimizer_ms: run_bench's timing of every
    kind's step_ms and optimizer_ms."""
    matrices = muon_matrices(init_path)
    flops = {name: iteration_flops(shape) for name, shape in matrices.items()}
    ranks_flops = per_rank(metrics["cpp"], "muon_ns_flops")
    overlap_flops = per_rank(metrics["cpp_overlap"], "muon_ns_flops")
    if any(isinstance(f, list) for f in ranks_flops):
        raise SystemExit(f"[bench] FAILED: a rank's Newton-Schulz flops changed between steps: {ranks_flops}")
    total = sum(ranks_flops)
    balanced = total / world
    largest = max(flops.values())
    floor_flops = per_rank(metrics["floor"], "muon_ns_flops")[0]
    expected = sum(flops.values())
    if any(isinstance(f, list) for f in overlap_flops):
        raise SystemExit(f"[bench] FAILED: a rank's Newton-Schulz flops stepped in backward changed "
                         f"between steps: {overlap_flops}")
    if not total == sum(overlap_flops) == floor_flops == expected:  # each matrix once, by one rank
        what = f"{c.get('model', 'gpt2')} {c['layers']}×{c['dim']}"
        raise SystemExit(f"[bench] FAILED: {what}: Newton-Schulz flops per step: the ranks' sum "
                         f"{total:.6g} (stepped in backward {sum(overlap_flops):.6g}), the one-rank floor's {floor_flops:.6g}, the shapes' {expected:.6g}: "
                         "each matrix must be orthogonalized exactly once per step")
    cpp_a2a = per_rank(metrics["cpp"], "bytes_all_to_all") if "bytes_all_to_all" in metrics["cpp"][0][0][0] else None
    return {
        "muon_lr": c["muon_lr"],
        "ratio_vs_adamw": step_ms["cpp"]["median"] / step_ms["cpp_adamw"]["median"],
        "cpp_adamw_step_ms": step_ms["cpp_adamw"]["median"],
        "optimizer_ms": optimizer_ms,
        "optimizer_vs_one_rank": optimizer_ms["cpp_overlap"]["median"] / optimizer_ms["floor"]["median"],
        "optimizer_vs_concurrent_one_rank":
            optimizer_ms["cpp_overlap"]["median"] / optimizer_ms["concurrent_floor"]["median"],
        "optimizer_after_backward_vs_one_rank": optimizer_ms["cpp"]["median"] / optimizer_ms["floor"]["median"],
        "optimizer_after_backward_vs_concurrent_one_rank":
            optimizer_ms["cpp"]["median"] / optimizer_ms["concurrent_floor"]["median"],
        "overlapped_step_vs_plain": step_ms["cpp_overlap"]["median"] / step_ms["cpp"]["median"],
        "optimizer_share_of_step": {k: optimizer_ms[k]["median"] / step_ms[k]["median"] for k in metrics},
        "ns_matrices_per_rank": per_rank(metrics["cpp"], "muon_ns_matrices"),
        "ns_flops_per_rank": ranks_flops,
        "ns_flops_per_rank_overlap": overlap_flops,
        "ns_flops_total": total,
        "ns_flops_expected_total": expected,             # from init.pt's shapes, as Muon counts
        "ns_flops_floor": floor_flops,                   # one rank orthogonalizing every matrix
        "ns_matrices": len(matrices),
        "ns_flops_balanced_share": balanced,
        "ns_flops_largest_matrix": largest,
        "ns_busiest_vs_balanced": max(ranks_flops) / balanced,
        "ns_busiest_target": max(GOALS["ns_busiest_vs_balanced"], largest / balanced),
        "cpp_all_to_all_bytes_per_step": cpp_a2a,
        "peer_caveat": PEER_CAVEAT,
    }


def goals(s):
    return [("optimizer time left after backward (stepped in backward) vs one rank orthogonalizing "
             "every matrix", s["optimizer_vs_one_rank"], GOALS["optimizer_vs_one_rank"]),
            ("step time, Muon stepped in backward vs after it", s["overlapped_step_vs_plain"],
             GOALS["overlapped_step_vs_plain"]),
            ("busiest rank's Newton-Schulz flops vs balanced share", s["ns_busiest_vs_balanced"],
             s["ns_busiest_target"])]


def spread(t):
    return f"{t['median']:.1f} [{t['p25']:.1f}–{t['p75']:.1f}]"


def gflop(x):
    return f"{x / 1e9:.2f}"


TABLE_ROWS = [
    ("model (layers × dim, heads, seq, batch/rank)",
     lambda s: f"{s['config']['layers']}×{s['config']['dim']}, {s['config']['heads']}, "
               f"{s['config']['seq']}, {s['config']['batch']}"),
    ("lr: AdamW / Muon (constant)", lambda s: f"{s['config']['lr']:g} / {s['muon_lr']:g}"),
    ("steps (warm-up) × rounds",
     lambda s: f"{s['config']['steps']} ({s['config']['warmup']}) × {s['config']['rounds']}"),
    ("C++ Muon step ms", lambda s: spread(s["step_ms"]["cpp"])),
    ("C++ Muon stepped in backward step ms", lambda s: spread(s["step_ms"]["cpp_overlap"])),
    ("C++ fused AdamW step ms (same rounds)", lambda s: spread(s["step_ms"]["cpp_adamw"])),
    ("FSDP2 + torch.optim.Muon step ms (weights wrong, see below)", lambda s: spread(s["step_ms"]["peer"])),
    ("Muon floor step ms (1 rank alone, every matrix)", lambda s: spread(s["step_ms"]["floor"])),
    ("Muon concurrent floor step ms (W processes, every matrix each)",
     lambda s: spread(s["step_ms"]["concurrent_floor"])),
    ("ratio C++ Muon / C++ AdamW", lambda s: f"{s['ratio_vs_adamw']:.3f}"),
    ("ratio C++ Muon stepped in backward / after it (goal)", lambda s: f"{s['overlapped_step_vs_plain']:.3f}"),
    ("ratio C++ Muon / Muon floor", lambda s: f"{s['ratio_vs_floor']:.3f}"),
    ("ratio C++ Muon / Muon concurrent floor", lambda s: f"{s['ratio_vs_concurrent_floor']:.3f}"),
    ("ratio C++ Muon / FSDP2 + torch.optim.Muon", lambda s: f"{s['ratio_vs_peer']:.3f}"),
    ("optimizer ms per step: C++ Muon", lambda s: spread(s["optimizer_ms"]["cpp"])),
    ("optimizer ms per step: C++ Muon stepped in backward (left after backward)",
     lambda s: spread(s["optimizer_ms"]["cpp_overlap"])),
    ("optimizer ms per step: C++ AdamW", lambda s: spread(s["optimizer_ms"]["cpp_adamw"])),
    ("optimizer ms per step: FSDP2 + torch.optim.Muon", lambda s: spread(s["optimizer_ms"]["peer"])),
    ("optimizer ms per step: Muon floor / concurrent floor",
     lambda s: f"{spread(s['optimizer_ms']['floor'])} / {spread(s['optimizer_ms']['concurrent_floor'])}"),
    ("optimizer time C++ stepped in backward / one rank: alone (goal) / concurrent",
     lambda s: f"{s['optimizer_vs_one_rank']:.3f} / {s['optimizer_vs_concurrent_one_rank']:.3f}"),
    ("optimizer time C++ after backward / one rank: alone / concurrent",
     lambda s: f"{s['optimizer_after_backward_vs_one_rank']:.3f} / "
               f"{s['optimizer_after_backward_vs_concurrent_one_rank']:.3f}"),
    ("optimizer share of the step: C++ Muon / AdamW / floor",
     lambda s: " / ".join(f"{s['optimizer_share_of_step'][k]:.2f}" for k in ("cpp", "cpp_adamw", "floor"))),
    ("Newton-Schulz GFLOP per step per rank, stepped in backward",
     lambda s: ", ".join(gflop(f) for f in s["ns_flops_per_rank_overlap"])),
    ("Newton-Schulz GFLOP per step: per rank (matrices)",
     lambda s: ", ".join(f"{gflop(f)} ({n})" for f, n in zip(s["ns_flops_per_rank"], s["ns_matrices_per_rank"]))),
    ("Newton-Schulz GFLOP: all ranks / floor / from the shapes",
     lambda s: f"{gflop(s['ns_flops_total'])} / {gflop(s['ns_flops_floor'])} / {gflop(s['ns_flops_expected_total'])}"),
    ("Newton-Schulz GFLOP: balanced share / largest matrix",
     lambda s: f"{gflop(s['ns_flops_balanced_share'])} / {gflop(s['ns_flops_largest_matrix'])}"),
    ("busiest rank / balanced share (target)",
     lambda s: f"{s['ns_busiest_vs_balanced']:.3f} (≤ {s['ns_busiest_target']:.3f})"),
    ("Muon's all-to-all bytes per step per rank",
     lambda s: ", ".join(f"{b:,}" for b in s["cpp_all_to_all_bytes_per_step"])
     if s["cpp_all_to_all_bytes_per_step"] else "– (not in this gpt_train's metrics)"),
    ("reduce-scatter bytes per step per rank (C++ Muon)",
     lambda s: f"{s['cpp_bytes_per_step']['reduce_scatter']:,}"),
    ("loss C++ Muon vs FSDP2 + torch.optim.Muon: step 0 (tolerance) / max rel. diff",
     lambda s: f"{s['loss_first_rel_diff']:.2e} ({s['loss_tolerance']['first_step']:g}) / "
               f"{s['loss_max_rel_diff']:.2e} (the peer's caveat)"),
    ("C++ Muon peak tensor bytes per rank", lambda s: f"{s['cpp_peak_bytes'] / 2**20:.1f} MiB"),
]


def markdown_lines(results):
    """The Muon section of latest.md: its table, its caveat (none without Muon configurations)."""
    names = [n for n, s in results.items() if is_muon(s["config"])]
    if not names:
        return []
    L = ["## Muon (issue 51): gpt_train --optimizer muon at W ranks", "",
         "Muon on the blocks' matrices (fsdp::optim::Muon: each matrix orthogonalized whole at one "
         "owner), the fused AdamW on the rest, against the same model with the fused AdamW, the "
         "one-rank Muon floors and FSDP2 + torch.optim.Muon, interleaved in the same rounds. "
         "Optimizer time: each step's optimizer.step(), the slowest rank's. See bench/README.md, \"Muon\".", "",
         "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, f in TABLE_ROWS:
        L.append(f"| {label} | " + " | ".join(f(results[n]) for n in names) + " |")
    return L + ["", "**Caveat (the FSDP2 column)**: " + PEER_CAVEAT, ""]
