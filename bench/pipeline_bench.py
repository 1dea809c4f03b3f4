"""`make bench`'s pipelined configurations (issue 60): gpt_train --pp beside PyTorch's own
pipelining (torch.distributed.pipelining + FSDP2, bench/peer_pipeline.py) on the same Llama,
weights, batches and schedule, and beside gpt_train without a pipeline on the same global batch.

A pipelined configuration runs three kinds in the same rounds (run_bench.py interleaves them):
  cpp     fsdprun gpt_train --pp P --pp-schedule S --microbatches M (the mesh pp x dp, each stage
          sharded over its dp ranks when dp > 1)
  peer    torchrun bench/peer_pipeline.py: ScheduleGPipe / Schedule1F1B over the same stages,
          FSDP2's fully_shard on each stage over dp
  cpp_1d  fsdprun gpt_train at the same ranks, the same rows in one micro-batch (--batch M·B/P):
          FSDP alone on the same global batch (what the pipeline costs or saves against sharding
          every layer over every rank)

Measured: step times side by side, the losses of both pipelines against each other at every step
(fp32, the same tolerance as the other configurations), and gpt_train's pipeline send bytes per
step against their formula (every micro-batch's activation forward and its gradient back across
each stage boundary).
"""

import os

KINDS = ("cpp", "peer", "cpp_1d")  # round 0 starts with cpp
GOALS = {"ratio_vs_peer": 1.00}  # gpt_train's pipelined step no slower than PyTorch's


def is_pipeline(c):
    return c.get("pp", 0) > 1


def world_of(c, default):
    return c.get("world", default)


def without_batch(args):
    """gpt_train's common flags less --batch (each kind gives its own)."""
    at = args.index("--batch")
    return args[:at] + args[at + 2:]


def batches_command(c, d, gpt_train, common):
    """The reference's dump of the step's rows in --grad-accum's layout (gpt_train --pp refuses
    --dump-batches): micro-batch m of dp rank r is rows [(m·dp + r)·B, +B), gpt_train --pp's."""
    dp = c["world"] // c["pp"]
    return [gpt_train, "--reference", "--world-size", str(dp), "--grad-accum", str(c["microbatches"]),
            "--batch", str(c["batch"]), "--dump-batches", os.path.join(d, "batches.pt")] + without_batch(common)


def plan_args(c):
    """gpt_train --plan's flags for the configuration's pipeline (none for an unpipelined one)."""
    if not is_pipeline(c):
        return []
    return ["--pp", str(c["pp"]), "--pp-schedule", c["schedule"], "--microbatches", str(c["microbatches"])]


def plan_vs_measured(plan, s):
    """gpt_train --plan --pp's step time and each rank's peak (a world rank's pp rank: rank // dp,
    pp outermost) beside the measured ones (docs/planner.md, "Pipeline parallelism")."""
    dp = s["config"]["world"] // s["config"]["pp"]
    planned_peaks = [plan["ranks"][k // dp]["peak_bytes"] for k in range(s["config"]["world"])]
    return {"planned_step_ms": plan["step_s"] * 1000,
            "planned_vs_measured_step": plan["step_s"] * 1000 / s["cpp_step_ms"],
            "planned_vs_measured_peak_per_rank": [p / m for p, m in zip(planned_peaks, s["cpp_peak_bytes_per_rank"])]}


def commands(kind, r, c, d, tools, common):
    """The commands of one run of `kind` in round r and its metrics files (one per rank). tools:
    the paths of fsdprun, gpt_train and torchrun; common: gpt_train's model, data, seed, lr,
    steps and optimizer flags."""
    world, common = c["world"], without_batch(common)
    metrics = os.path.join(d, f"{kind}-r{r}-rank{{rank}}.jsonl")
    paths = [metrics.format(rank=k) for k in range(world)]
    launch = [tools["fsdprun"], "--nproc-per-node", str(world), tools["gpt_train"]]
    if kind == "cpp":
        return [launch + common + ["--pp", str(c["pp"]), "--pp-schedule", c["schedule"], "--microbatches",
                                   str(c["microbatches"]), "--batch", str(c["batch"]), "--metrics", metrics]], paths
    if kind == "cpp_1d":  # the step's rows in one micro-batch, W·b = M·dp·B rows
        rows, left = divmod(c["microbatches"] * c["batch"], c["pp"])
        assert left == 0, "a pipelined configuration needs --microbatches x --batch divisible by --pp"
        return [launch + common + ["--batch", str(rows), "--metrics", metrics]], paths
    return [[tools["torchrun"], "--standalone", "--nproc-per-node", str(world), "--log-dir",
             os.path.join(d, "torchrun"), tools["peer_pipeline"], "--pp", str(c["pp"]), "--schedule",
             c["schedule"], "--microbatches", str(c["microbatches"]), "--batch", str(c["batch"]),
             "--steps", str(c["steps"]), "--lr", str(c["lr"]), "--init-from", os.path.join(d, "init-hf"),
             "--batches", os.path.join(d, "batches.pt"), "--metrics", metrics, "--fused"]], paths


HEADER_BYTES = 80  # each message's header: dtype, number of dimensions, 8 sizes (int64)


def pp_send_formula(c):
    """gpt_train's pipeline bytes sent per step, per rank (docs/pipeline-parallel.md, "Bytes
    sent"): each micro-batch's activation (B × seq × dim fp32) and its header forward across each
    boundary of a rank's stages, and its gradient back."""
    activation = c["batch"] * c["seq"] * c["dim"] * 4 + HEADER_BYTES
    per_rank = []
    for rank in range(c["world"]):
        stage = rank // (c["world"] // c["pp"])
        boundaries = (stage < c["pp"] - 1) + (stage > 0)  # sends forward and sends back
        per_rank.append(boundaries * c["microbatches"] * activation)
    return per_rank


def summarize(c, metrics, timing, loss_tolerance):
    """The configuration's numbers: timing(runs, warmup) is run_bench's; metrics: per kind, per
    round, per rank, per step."""
    t = {k: timing(v, c["warmup"]) for k, v in metrics.items()}
    rel = [[abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(cpp[0], peer[0])]
           for cpp, peer in zip(metrics["cpp"], metrics["peer"])]
    sent = sorted({tuple(m["bytes_pp_send"] for m in (ranks[k][-1] for k in range(c["world"])))
                   for ranks in metrics["cpp"]})
    tol_first, tol_any = loss_tolerance
    return {
        "step_ms": t, "cpp_step_ms": t["cpp"]["median"], "peer_step_ms": t["peer"]["median"],
        "ratio_vs_peer": t["cpp"]["median"] / t["peer"]["median"],
        "ratio_vs_1d": t["cpp"]["median"] / t["cpp_1d"]["median"],
        "cpp_loss": [m["loss"] for m in metrics["cpp"][0][0]],
        "peer_loss": [m["loss"] for m in metrics["peer"][0][0]],
        "cpp_1d_loss": [m["loss"] for m in metrics["cpp_1d"][0][0]],
        "loss_first_rel_diff": max(r[0] for r in rel), "loss_max_rel_diff": max(max(r) for r in rel),
        "loss_rel_diff_per_step": [max(r[s] for r in rel) for s in range(c["steps"])],
        "loss_tolerance": {"first_step": tol_first, "any_step": tol_any},
        "cpp_pp_send_bytes_per_rank": list(sent[0]) if len(sent) == 1 else [list(x) for x in sent],
        "pp_send_bytes_formula": pp_send_formula(c),
        "cpp_peak_bytes_per_rank": [max(m["mem_peak_bytes"] for ranks in metrics["cpp"] for m in ranks[k])
                                    for k in range(c["world"])],
    }


def goals(s):
    return [("pipelined step time vs PyTorch pipelining + FSDP2", s["ratio_vs_peer"], GOALS["ratio_vs_peer"])]


def failures(name, s):
    """A pipeline whose send bytes differ from the formula computes something else: fail."""
    if s["cpp_pp_send_bytes_per_rank"] != s["pp_send_bytes_formula"]:
        return [f"{name}: gpt_train --pp sent {s['cpp_pp_send_bytes_per_rank']} bytes per rank per step, "
                f"the formula {s['pp_send_bytes_formula']}"]
    return []


def spread(t):
    return f"{t['median']:.1f} [{t['p25']:.1f}–{t['p75']:.1f}]"


TABLE_ROWS = [
    ("layout: pp × dp (W), schedule, micro-batches × rows",
     lambda s: f"{s['config']['pp']} × {s['config']['world'] // s['config']['pp']} ({s['config']['world']}), "
               f"{s['config']['schedule']}, {s['config']['microbatches']} × {s['config']['batch']}"),
    ("model (layers × dim, heads, seq)",
     lambda s: f"{s['config']['layers']}×{s['config']['dim']}, {s['config']['heads']}, {s['config']['seq']}"),
    ("steps (warm-up) × rounds",
     lambda s: f"{s['config']['steps']} ({s['config']['warmup']}) × {s['config']['rounds']}"),
    ("C++ gpt_train --pp step ms", lambda s: spread(s["step_ms"]["cpp"])),
    ("PyTorch pipelining + FSDP2 step ms", lambda s: spread(s["step_ms"]["peer"])),
    ("C++ FSDP alone, same rows, step ms", lambda s: spread(s["step_ms"]["cpp_1d"])),
    ("ratio C++ pipelined / PyTorch pipelined", lambda s: f"{s['ratio_vs_peer']:.3f}"),
    ("ratio C++ pipelined / C++ FSDP alone", lambda s: f"{s['ratio_vs_1d']:.3f}"),
    ("loss C++ vs PyTorch: step 0 / max rel. diff (tolerance)",
     lambda s: f"{s['loss_first_rel_diff']:.2e} / {s['loss_max_rel_diff']:.2e} "
               f"({s['loss_tolerance']['first_step']:g} / {s['loss_tolerance']['any_step']:g})"),
    ("pipeline bytes sent per step per rank: C++ / formula",
     lambda s: f"{', '.join(f'{b:,}' for b in s['cpp_pp_send_bytes_per_rank'])} / "
               f"{', '.join(f'{b:,}' for b in s['pp_send_bytes_formula'])}"),
    ("C++ peak tensor bytes per rank (MiB)",
     lambda s: ", ".join(f"{b / 2**20:.1f}" for b in s["cpp_peak_bytes_per_rank"])),
    ("planned step ms (gpt_train --plan --pp) / planned ÷ measured",
     lambda s: f"{s['planned_step_ms']:.1f} / {s['planned_vs_measured_step']:.3f}"),
    ("planned peak ÷ measured, per rank",
     lambda s: ", ".join(f"{v:.3f}" for v in s["planned_vs_measured_peak_per_rank"])),
]


def markdown_lines(results):
    """The pipeline section of latest.md (none without pipelined configurations)."""
    names = [n for n, s in results.items() if is_pipeline(s["config"])]
    if not names:
        return []
    L = ["## Pipeline parallelism (issue 60): gpt_train --pp vs torch.distributed.pipelining + FSDP2", "",
         "The same Llama, weights, batches and schedule; FSDP (gpt_train's, FSDP2) inside each stage "
         "over its dp ranks. See bench/README.md, \"Pipeline\".", "",
         "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, f in TABLE_ROWS:
        L.append(f"| {label} | " + " | ".join(f(results[n]) for n in names) + " |")
    return L + [""]
