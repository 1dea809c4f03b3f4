"""End to end: gpt_train under fsdprun (W=2) writes per-rank metrics whose losses equal the
unsharded reference's (gpt_train --reference --world-size 2) on the same global batches; with
mixed precision, activation checkpointing and frozen parameters too (and a sharded checkpoint
resumed bitwise); fp16 with the sharded scaler matches the fp16 reference, its loss scale
following GradScaler's rule (checked here), overflowing steps skipped on both ranks; --device cpu
is the default, bitwise; a Llama (--model llama) with those features and gradient accumulation
matches its reference and resumes bitwise."""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

KEYS = {"step", "loss", "step_ms", "tokens_per_s", "mem_current_bytes", "mem_peak_bytes",
        "mem_reserved_bytes", "bytes_all_gather", "bytes_reduce_scatter", "bytes_all_reduce",
        "bytes_all_to_all"}


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def main(bin_dir, corpus):
    args = ["--data", corpus, "--layers", "2", "--dim", "32", "--heads", "2", "--seq", "32",
            "--batch", "2", "--steps", "6", "--lr", "3e-3"]
    with tempfile.TemporaryDirectory() as tmp:
        sharded = f"{tmp}/fsdp-{{rank}}.jsonl"
        subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", "2", f"{bin_dir}/gpt_train",
                        *args, "--metrics", sharded], check=True)
        subprocess.run([f"{bin_dir}/gpt_train", *args, "--reference", "--world-size", "2",
                        "--metrics", f"{tmp}/ref.jsonl"], check=True)
        rank0, rank1 = read(f"{tmp}/fsdp-0.jsonl"), read(f"{tmp}/fsdp-1.jsonl")
        reference = read(f"{tmp}/ref.jsonl")
    assert len(rank0) == len(rank1) == len(reference) == 6, (len(rank0), len(rank1), len(reference))
    for a, b, r in zip(rank0, rank1, reference):
        assert KEYS <= set(a), f"missing keys: {KEYS - set(a)}"
        assert a["loss"] == b["loss"], f"ranks disagree on the global loss: {a} {b}"
        assert abs(a["loss"] - r["loss"]) <= 2e-5 * r["loss"], f"step {a['step']}: {a['loss']} vs {r['loss']}"
        assert a["bytes_all_gather"] > 0 and a["bytes_reduce_scatter"] > 0
        assert r["bytes_all_gather"] == 0 and r["mem_peak_bytes"] > 0
    assert rank0[-1]["loss"] < rank0[0]["loss"]
    print("gpt_train end to end: 6 steps, losses match the reference:",
          [round(x["loss"], 5) for x in rank0])
    device_cpu_is_default(bin_dir, args, rank0, reference)
    features(bin_dir, args, rank0)
    llama_features(bin_dir, args)


def run_pair(bin_dir, args, flags, tmp):
    """The sharded run (rank 0's metrics) and the reference with the same flags."""
    subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", "2", f"{bin_dir}/gpt_train", *args,
                    *flags, "--metrics", f"{tmp}/f-{{rank}}.jsonl"], check=True)
    subprocess.run([f"{bin_dir}/gpt_train", *args, *flags, "--reference", "--world-size", "2",
                    "--metrics", f"{tmp}/r.jsonl"], check=True)
    return read(f"{tmp}/f-0.jsonl"), read(f"{tmp}/r.jsonl")


def device_cpu_is_default(bin_dir, args, sharded, reference):
    """--device cpu: bitwise the losses of the runs without the flag, sharded and unsharded."""
    with tempfile.TemporaryDirectory() as tmp:
        cpu_sharded, cpu_reference = run_pair(bin_dir, args, ["--device", "cpu"], tmp)
    assert [x["loss"] for x in cpu_sharded] == [x["loss"] for x in sharded], (cpu_sharded, sharded)
    assert [x["loss"] for x in cpu_reference] == [x["loss"] for x in reference], (cpu_reference,
                                                                                   reference)
    assert all(x["mem_reserved_bytes"] == 0 for x in cpu_sharded), cpu_sharded  # a GPU's only
    print("--device cpu: bitwise the same losses as without the flag")


def with_steps(args, steps):
    out = list(args)
    out[out.index("--steps") + 1] = str(steps)
    return out


def resume_matches(bin_dir, args, flags, uninterrupted):
    """Save a sharded checkpoint at step 3 (frozen and bf16 flat parameters), resume to step 6:
    bitwise the losses of the uninterrupted run."""
    launch = [f"{bin_dir}/fsdprun", "--nproc-per-node", "2", f"{bin_dir}/gpt_train"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*launch, *with_steps(args, 3), *flags, "--save-every", "3",
                        "--checkpoint-dir", f"{tmp}/ckpt"], check=True)
        subprocess.run([*launch, *args, *flags, "--checkpoint-dir", f"{tmp}/ckpt", "--resume",
                        "--metrics", f"{tmp}/resumed-{{rank}}.jsonl"], check=True)
        resumed = read(f"{tmp}/resumed-0.jsonl")
    assert [x["step"] for x in resumed] == [3, 4, 5], resumed
    assert [x["loss"] for x in resumed] == [x["loss"] for x in uninterrupted[3:]], (resumed, uninterrupted)
    print(f"resumed at step 3 with {' '.join(flags)}: bitwise the same losses")


def features(bin_dir, args, fp32):
    flags = ["--param-dtype", "bf16", "--reduce-dtype", "fp32", "--activation-checkpointing",
             "--freeze", "wpe"]
    with tempfile.TemporaryDirectory() as tmp:
        sharded, reference = run_pair(bin_dir, args, flags, tmp)
    # bf16: within bf16's unit roundoff of the same-policy reference (tests/precision_test.cpp).
    for a, r in zip(sharded, reference):
        assert abs(a["loss"] - r["loss"]) <= 2 ** -8 * r["loss"], f"{flags}: {a['loss']} vs {r['loss']}"
    # bf16 all-gathers move half the bytes (wpe, frozen, is still gathered: same set of tensors).
    assert sharded[0]["bytes_all_gather"] * 2 == fp32[0]["bytes_all_gather"], (sharded[0], fp32[0])
    # wpe's gradient is neither kept nor reduced.
    assert sharded[0]["bytes_reduce_scatter"] < fp32[0]["bytes_reduce_scatter"]
    print("bf16 + activation checkpointing + frozen wpe: losses match the reference:",
          [round(x["loss"], 5) for x in sharded])
    resume_matches(bin_dir, args, flags, sharded)

    fp16(bin_dir, args)


def llama_features(bin_dir, args):
    """A Llama (2 heads sharing 1 key/value head, an untied head) with bf16, activation
    checkpointing, a frozen parameter and gradient accumulation: the sharded run within bf16's
    roundoff of the reference, and resumed from a sharded checkpoint bitwise."""
    llama = [*args, "--model", "llama", "--kv-heads", "1"]
    flags = ["--param-dtype", "bf16", "--reduce-dtype", "fp32", "--activation-checkpointing",
             "--freeze", "lm_head", "--grad-accum", "2"]
    with tempfile.TemporaryDirectory() as tmp:
        sharded, reference = run_pair(bin_dir, llama, flags, tmp)
    for a, r in zip(sharded, reference):
        assert abs(a["loss"] - r["loss"]) <= 2 ** -8 * r["loss"], f"Llama {flags}: {a['loss']} vs {r['loss']}"
    assert sharded[-1]["loss"] < sharded[0]["loss"], sharded
    print("Llama, bf16 + activation checkpointing + frozen lm_head + 2 micro-batches: losses match "
          "the reference:", [round(x["loss"], 5) for x in sharded])
    resume_matches(bin_dir, llama, flags, sharded)


def expected_scales(init, skipped, growth=2.0, backoff=0.5, interval=2000):
    """torch.amp.GradScaler's rule, written here and not taken from the library: the scale after
    each step, given which steps were skipped."""
    scale, good, out = init, 0, []
    for skip in skipped:
        if skip:
            scale, good = scale * backoff, 0
        else:
            good += 1
            if good == interval:
                scale, good = scale * growth, 0
        out.append(scale)
    return out


def fp16(bin_dir, args):
    """fp16 + the sharded gradient scaler against the unsharded fp16 reference; the loss scale
    follows GradScaler's rule, and (with deferred init, whose model is initialised in another
    order than the reference's) a scale that overflows skips steps."""
    with tempfile.TemporaryDirectory() as tmp:
        half, reference = run_pair(bin_dir, args, ["--param-dtype", "fp16"], tmp)
    # fp16 unit roundoff 2^-11 (tests/precision_test.cpp); 65536 overflows neither run here.
    for a, r in zip(half, reference):
        assert not a["skipped"] and not r["skipped"], (a, r)
        assert abs(a["loss"] - r["loss"]) <= 2 ** -11 * r["loss"], f"fp16: {a['loss']} vs {r['loss']}"
    assert [x["loss_scale"] for x in half] == expected_scales(65536.0, [False] * len(half)), half
    assert half[-1]["loss"] < half[0]["loss"], [x["loss"] for x in half]
    print("fp16 + sharded gradient scaler: losses match the fp16 reference:",
          [round(x["loss"], 4) for x in half])

    # 2^22: the logits' gradient alone (scale / 64 tokens per rank, up to 2^16) overflows fp16's
    # 65504, so step 0 is skipped on both ranks and the scale halved; by 65536 (the run above)
    # steps go through again: at most 6 skips, so the last of 10 steps is taken.
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", "2", f"{bin_dir}/gpt_train",
                        *with_steps(args, 10), "--param-dtype", "fp16", "--deferred-init",
                        "--loss-scale", str(2 ** 22), "--metrics", f"{tmp}/s-{{rank}}.jsonl"],
                       check=True)
        rank0, rank1 = read(f"{tmp}/s-0.jsonl"), read(f"{tmp}/s-1.jsonl")
    skipped = [x["skipped"] for x in rank0]
    assert skipped == [x["skipped"] for x in rank1], (rank0, rank1)
    assert skipped[0] and not skipped[-1], skipped
    assert [x["loss_scale"] for x in rank0] == expected_scales(2.0 ** 22, skipped), rank0
    print("fp16 from scale 2^22: skipped", skipped, "scales", [x["loss_scale"] for x in rank0])

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
