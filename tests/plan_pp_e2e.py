"""The planner against a pipelined run: `gpt_train --plan --pp 2 --json` plans each pp rank's peak
(its stage's parameters, gradients and AdamW state, the micro-batches its schedule keeps in flight,
counted on the action list the runner executes), then `fsdprun ... gpt_train --pp 2` trains 3 steps
and writes each rank's measured peak (--metrics' mem_peak_bytes, the step's highest) and its
pp_send bytes. For 1F1B and GPipe at two micro-batch counts each (pp 2 x dp 1, W = 2, a Llama on
the CPU), and GPipe and 1F1B at pp 2 x dp 2 (each stage sharded over dp, held unsharded across
the micro-batches; the 1F1B case on a wider, shorter model, where the held parameters weigh more),
and GPT-2 under 1F1B at dp 1 and dp 2 (its head tied to wte: the last stage holds it again and
sends its gradient), ZBV at pp 2 x dp 2 (FSDP inside its two stages per rank, the W passes
between the hold's gather and its reduction), bf16 with activation checkpointing at dp 1 and
activation checkpointing at dp 2 (the stage's own FSDP features): every rank's measured peak
within 10% of its plan, its pp bytes and FSDP's
all-gather / reduce-scatter bytes equal to the plan's; and 1F1B's stage 0 holds P micro-batches,
GPipe's M (the plan says which). Then `--auto` from `--pp 1 --pp-schedule gpipe --microbatches 2`
under a cap that only pp 2 under 1F1B at M = 4 fits: it trains that, under the cap.

    plan_pp_e2e.py BIN_DIR"""
import json
import random
import re
import sys
import tempfile
from pathlib import Path

from pp_train_e2e import run, steps

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
GPT, FSDPRUN = str(BIN / "gpt_train"), str(BIN / "fsdprun")
SIZES = {"--ffn-dim": 128, "--dim": 64, "--seq": 128}
# pp 2 x dp 2: wider and shorter, so that the stage's held unsharded parameters weigh in its peak.
WIDE = {"--ffn-dim": 512, "--dim": 128, "--seq": 32}


# GPT-2: its head tied to wte, the tie's gradient sent between the first and the last stage.
GPT2 = {"--model": "gpt2", "--dim": 64, "--seq": 128}


def model(sizes=None):
    sizes = sizes or SIZES
    family = [] if "--model" in sizes else ["--model", "llama", "--kv-heads", 2]
    return [*family, "--layers", 4, "--heads", 4, "--batch", 2, "--seed", 5, "--max-data-mb", 1,
            *[x for flag, value in sizes.items() for x in (flag, value)]]


MODEL = model()
TOLERANCE = 0.10
# (schedule, world, micro-batches, micro-batches stage 0 holds at its peak)
# Then the stage's FSDP features: bf16 with activation checkpointing at dp 1 (a stage sharded over
# a group of one: its bf16 compute copy, its bf16 backward's gradient beside the fp32 sum) and
# activation checkpointing at pp 2 x dp 2 (each micro-batch keeps its parts' inputs; a backward
# recomputes one part at a time, never beside the head's or the embedding's backward).
CASES = [("1f1b", 2, 2, 2), ("1f1b", 2, 4, 2), ("gpipe", 2, 2, 2), ("gpipe", 2, 4, 4), ("gpipe", 4, 2, 2),
         ("1f1b", 4, 4, 2, WIDE), ("1f1b", 2, 4, 2, GPT2), ("1f1b", 4, 2, 2, GPT2), ("zbv", 4, 4, 4),
         ("1f1b", 2, 4, 2, WIDE, ["--param-dtype", "bf16", "--reduce-dtype", "fp32", "--activation-checkpointing"]),
         ("1f1b", 4, 4, 2, None, ["--activation-checkpointing"])]


def check(tmp, schedule, world, micro, held, sizes=None, extra=()):
    flags = ["--pp", 2, "--pp-schedule", schedule, "--microbatches", micro, *model(sizes), *extra,
             "--data", tmp / "text.txt"]
    plan = json.loads(run([GPT, "--plan", "--json", "--ranks", world, "--ranks-per-host", world, *flags]))
    name = f"{schedule} M={micro} W={world}" + (" gpt2" if sizes is GPT2 else " wide" if sizes else "") + \
        "".join(f" {x}" for x in extra)
    assert plan["ranks"][0]["in_flight"] == held, f"{name}: stage 0 holds {plan['ranks'][0]['in_flight']}, not {held}"
    metrics = tmp / f"{schedule}-{world}-{micro}-{len(name)}-{len(extra)}-{{rank}}.jsonl"
    run([FSDPRUN, "--nproc-per-node", world, GPT, *flags, "--steps", 3, "--metrics", metrics])
    dp = world // 2
    ratios = []
    for rank in range(world):
        planned = plan["ranks"][rank // dp]
        got = steps(str(metrics).replace("{rank}", str(rank)))
        measured = max(s["mem_peak_bytes"] for s in got[1:])  # the first step also allocates AdamW's state
        ratio = measured / planned["peak_bytes"]
        ratios.append(ratio)
        assert abs(ratio - 1) <= TOLERANCE, \
            f"{name} rank {rank}: measured peak {measured} vs planned {planned['peak_bytes']} ({ratio:.3f}x): {planned}"
        for key, planned_key in (("bytes_pp_send", "pp_send_bytes"), ("bytes_all_gather", "all_gather_bytes"),
                                 ("bytes_reduce_scatter", "reduce_scatter_bytes")):
            assert all(s[key] == planned[planned_key] for s in got), \
                f"{name} rank {rank}: {key} {[s[key] for s in got]}, planned {planned[planned_key]}"
    print(f"{name}: measured / planned peak per rank {', '.join(f'{r:.3f}' for r in ratios)}")


def check_auto(tmp):
    """--auto --pp from pp 1 under GPipe (M = 2): the cap fits pp 2 under 1F1B at M = 4 (the global
    batch kept) with the planner's margin and nothing else; the run trains it, every rank under the cap."""
    data = ["--data", tmp / "text.txt"]
    target = json.loads(run([GPT, "--plan", "--json", "--ranks", 2, "--pp", 2, "--pp-schedule", "1f1b",
                             "--microbatches", 4, *MODEL, *data]))["peak_bytes"]
    cap_gb = target / 0.92 * 1.01 / 2**30
    base = ["--pp", 1, "--pp-schedule", "gpipe", "--microbatches", 2, *MODEL, *data]
    out = run([FSDPRUN, "--nproc-per-node", 2, GPT, *base, "--auto", "--max-memory-gb", f"{cap_gb:.6f}", "--steps", 2])
    assert "--auto: training with pp 2 1f1b M=4" in out, out
    ratios = [float(x) for x in re.findall(r"plan vs run: pp rank \d peak predicted .* MiB, measured .* MiB \(([0-9.]+)x\)", out)]
    assert len(ratios) == 2, out
    print(f"--auto --pp under {cap_gb * 2**30 / 2**20:.2f} MiB: trained pp 2 1f1b M=4, measured / planned {ratios}")


def main():
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        words = ["def", "return", "self", "tensor", "rank", "shard", "step", "loss", "(", ")", ":"]
        rng = random.Random(7)
        (tmp / "text.txt").write_text(" ".join(rng.choice(words) for _ in range(20000)))
        for case in CASES:
            check(tmp, *case)
        check_auto(tmp)


if __name__ == "__main__":
    main()
