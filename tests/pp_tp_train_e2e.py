"""gpt_train --pp --tp (the mesh pp x dp x tp, pp outermost, tp innermost) against the unsharded
model: `fsdprun --nproc-per-node W gpt_train --pp P --tp T --microbatches M --batch B` trains what
`gpt_train --reference --world-size W/(P·T) --grad-accum M --batch B` trains. For 6 steps in fp32
the loss every rank reports is within 1e-5 of the reference's at every step, and each rank's
bytes_pp_send is docs/pipeline-parallel.md's formula with a tp rank's activation (its sequence
shard: seq/T rows). Layouts: GPT-2 and Llama under ZBV at (pp 2, tp 2) on 4 blocks (GPT-2's tie
on rank 0, where the V placement puts the first and the last stage); GPT-2 under 1F1B at
(pp 2, tp 2) (its tie, split over tp, across the two pp ranks); Llama under 1F1B in 3-D,
(pp 2, dp 2, tp 2) at W = 8, each stage split over tp and sharded over dp; in 3-D too, GPT-2
under 1F1B (its tie across sharded stages) and Llama under ZBV (FSDP inside its stages).

    pp_tp_train_e2e.py BIN_DIR [--only NAME,...]"""
import random
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pp_train_e2e import COMMON, FAMILIES, FSDPRUN, GPT, ONLY, TOLERANCE, rank_of_stage, run, steps  # noqa: E402

# (name, family, world, pp, tp, layers, microbatches, flags of the pipeline run)
LAYOUTS = [("gpt2-zbv-tp2", "gpt2", 4, 2, 2, 4, 2, ["--pp-schedule", "zbv"]),
           ("gpt2-1f1b-tp2", "gpt2", 4, 2, 2, 4, 2, ["--pp-schedule", "1f1b"]),
           ("llama-zbv-tp2", "llama", 4, 2, 2, 4, 2, ["--pp-schedule", "zbv"]),
           ("llama-1f1b-3d", "llama", 8, 2, 2, 4, 2, ["--pp-schedule", "1f1b"]),
           ("gpt2-1f1b-3d", "gpt2", 8, 2, 2, 4, 2, ["--pp-schedule", "1f1b"]),
           ("llama-zbv-3d", "llama", 8, 2, 2, 4, 2, ["--pp-schedule", "zbv"])]
SPLITS = {"llama-1f1b-3d": "over pp 2 x dp 2 x tp 2: stage 0 [wte h.0 h.1] stage 1 [h.2 h.3 ln_f lm_head]"}


def pp_bytes(pp_rank, pp, tp, family, micro, schedule):
    """What pp rank `pp_rank` sends a step: M·(a + h) for each boundary of its stages with another
    rank, a = one tp rank's share of a micro-batch's activation (B x seq/T x dim, fp32), h = 80;
    and GPT-2's tied wte/head, its tp rank's rows (vocab/T x dim), when the first and the last
    stage are on two ranks (not under ZBV)."""
    stages = pp * (2 if schedule == "zbv" else 1)
    dim, batch, seq = COMMON[1], COMMON[COMMON.index("--batch") + 1], COMMON[COMMON.index("--seq") + 1]
    a, h = batch * (seq // tp) * dim * 4, 80
    place = lambda s: rank_of_stage(s, pp, stages, schedule)
    crossings = sum((s + 1 < stages and place(s + 1) != pp_rank) + (s > 0 and place(s - 1) != pp_rank)
                    for s in range(stages) if place(s) == pp_rank)
    tie = 256 // tp * dim * 4 if family == "gpt2" and place(0) != place(stages - 1) else 0
    return micro * (a + h) * crossings + tie


def check(tmp, name, family, world, pp, tp, layers, micro, flags):
    model = [*FAMILIES[family], "--layers", layers, *COMMON, "--data", str(tmp / "text.txt")]
    ref = tmp / f"{name}-ref.jsonl"
    dp = world // (pp * tp)
    run([GPT, "--reference", "--world-size", dp, "--grad-accum", micro, *model, "--metrics", ref])
    metrics = tmp / f"{name}-pp-{{rank}}.jsonl"
    out = run([FSDPRUN, "--nproc-per-node", world, GPT, "--pp", pp, "--tp", tp, "--microbatches", micro,
               *flags, *model, "--metrics", metrics, "--log-every", 2])
    expected = [s["loss"] for s in steps(ref)]
    if name in SPLITS:
        assert SPLITS[name] in out, f"{name}: the split is not {SPLITS[name]}:\n{out}"
    shown = re.search(r"step +6/6 \| loss ([0-9.]+)", out)
    assert shown and abs(float(shown.group(1)) - expected[-1]) < 1e-4, f"{name}: no progress line of the loss:\n{out}"
    worst = 0.0
    for rank in range(world):
        got = steps(str(metrics).replace("{rank}", str(rank)))
        assert len(got) == len(expected) == 6, f"{name}: {len(got)} steps, reference {len(expected)}"
        diffs = [abs(g["loss"] - e) for g, e in zip(got, expected)]
        worst = max(worst, *diffs)
        assert max(diffs) < TOLERANCE, f"{name} rank {rank}: losses {[g['loss'] for g in got]} vs reference {expected}"
        sent = pp_bytes(rank // (dp * tp), pp, tp, family, micro, flags[flags.index("--pp-schedule") + 1])
        assert all(g["bytes_pp_send"] == sent for g in got), \
            f"{name} rank {rank}: pp bytes {[g['bytes_pp_send'] for g in got]}, expected {sent}"
    print(f"{name}: {world} ranks, pp {pp} x dp {dp} x tp {tp}: 6 steps, max |loss - reference| = {worst:.2e} "
          f"(first {expected[0]:.6f}, last {expected[-1]:.6f})")


def main():
    with tempfile.TemporaryDirectory(prefix="pp_tp_train_") as tmp:
        tmp = Path(tmp)
        words = ["def", "return", "self", "tensor", "rank", "shard", "step", "loss", "(", ")", ":"]
        rng = random.Random(7)
        (tmp / "text.txt").write_text(" ".join(rng.choice(words) for _ in range(20000)))
        for layout in LAYOUTS:
            if not ONLY or layout[0] in ONLY:
                check(tmp, *layout)
    print("pp_tp_train_end_to_end: all layouts within", TOLERANCE)


if __name__ == "__main__":
    main()
