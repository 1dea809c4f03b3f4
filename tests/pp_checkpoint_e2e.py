"""Checkpoints of a pipelined run (include/fsdp/pipeline_checkpoint.h), through gpt_train: a Llama
of 4 blocks trained 6 steps at (pp 2, dp 2) uninterrupted, and 3 steps at (pp 2, dp 2) saving,
then resumed for the other 3 at (pp 2, dp 2), (pp 1, dp 2) (the ordinary unpipelined run),
(pp 2, dp 1), (pp 4, dp 1) and (pp 2, dp 1, tp 2), each on the same global batches (8 rows a step). Each resumed run
saves its last step; its losses and final parameters (read with torch.distributed.checkpoint)
equal the uninterrupted run's: bitwise at (pp 2, dp 2), the same arithmetic; elsewhere, where the
micro-batches group the rows otherwise (the sums run in another order), within
pp_train_e2e.py's 1e-5. dcp.load (HuggingFaceStorageReader, no_dist) reads the pipelined
checkpoint: its parameters bitwise those that the unpipelined run loads from it (its --save-full
at --steps 3), and AdamW's moments of every parameter. A pipelined run loading it writes
--save-full and --export-hf bitwise as the unpipelined run does. --async-save writes the same
folder byte for byte. With --optimizer muon the checkpoint holds Muon's momentum beside AdamW's
moments, and a run resumed at (pp 2, dp 2) is bitwise the uninterrupted one; so is GPT-2's (its
tie across the two sharded stages) under 1F1B. Saved at
(pp 2, tp 2), the checkpoint resumes bitwise at (pp 2, tp 2) and at (pp 1, dp 2) within 1e-5.
The (pp 2, dp 2) save resumes under interleaved 1F1B (two stages per rank) too; saved under
interleaved 1F1B, a checkpoint (written byte for byte by --async-save, read by dcp.load) resumes
bitwise interleaved and within 1e-5 at (pp 1, dp 2), (pp 2, dp 2) 1F1B and (pp 4, dp 1); with
--optimizer muon, resumed interleaved bitwise.

    pp_checkpoint_e2e.py BIN_DIR"""
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from pp_train_e2e import write_corpus

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
GPT, FSDPRUN = str(BIN / "gpt_train"), str(BIN / "fsdprun")
MODEL = ["--model", "llama", "--kv-heads", 2, "--ffn-dim", 64, "--layers", 4, "--dim", 32, "--heads", 4,
         "--seq", 16, "--batch", 2, "--lr", 3e-3, "--seed", 5]
STEPS, SAVED = 6, 3
TOLERANCE = 1e-5
# (pp, dp) -> gpt_train's layout flags for 8 rows a step (2 per micro-batch and dp rank).
LAYOUTS = {(2, 2): ["--pp", 2, "--microbatches", 2, "--pp-schedule", "1f1b"],
           (1, 2): ["--grad-accum", 2],
           (2, 1): ["--pp", 2, "--microbatches", 4, "--pp-schedule", "1f1b"],
           (4, 1): ["--pp", 4, "--microbatches", 4, "--pp-schedule", "1f1b"],
           (2, 1, 2): ["--pp", 2, "--tp", 2, "--microbatches", 4, "--pp-schedule", "1f1b"]}
# (pp 2, dp 2) under interleaved 1F1B: two stages per rank (4 in all), one AdamW over both.
INTERLEAVED = (2, 2, 1, "interleaved")
LAYOUTS[INTERLEAVED] = ["--pp", 2, "--microbatches", 2, "--pp-schedule", "interleaved-1f1b"]
# (pp 2, dp 2) under ZBV: two stages per rank in V placement (0 and 3 on pp rank 0), each sharded.
ZBV = (2, 2, 1, "zbv")
LAYOUTS[ZBV] = ["--pp", 2, "--microbatches", 2, "--pp-schedule", "zbv"]
ENV = {k: v for k, v in __import__("os").environ.items()
       if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
ENV.update(OMP_NUM_THREADS="1", FSDP_TIMEOUT_SECONDS="60")


def gpt_train(tmp, layout, *flags):
    """gpt_train at `layout` (pp, dp) or (pp, dp, tp); rank 0's loss per step, and its output."""
    pp, dp, tp = (*layout, 1)[:3]
    metrics = tmp / "m-{rank}.jsonl"
    cmd = [FSDPRUN, "--nproc-per-node", pp * dp * tp, GPT, "--data", tmp / "text.txt", *MODEL, *LAYOUTS[layout],
           "--metrics", metrics, *flags]
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, f"{layout}: {' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    rank0 = Path(str(metrics).replace("{rank}", "0"))
    records = [json.loads(line) for line in rank0.read_text().splitlines()]
    for m in tmp.glob("m-*.jsonl"):
        m.unlink()
    return {rec["step"]: rec["loss"] for rec in records if "loss" in rec}, r.stdout


def dcp_load(folder, like):
    """torch.distributed.checkpoint.load of `folder` into NaN-filled tensors shaped as `like`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    state = {k: torch.full_like(t, float("nan")) for k, t in like.items()}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)), no_dist=True)
    return state


def check_pipelined_export(tmp, folder, full):
    """--save-full and --export-hf of a pipelined run at the checkpoint's weights: the unpipelined
    run's dict (every tensor bitwise) and HF folder (every file bitwise)."""
    ckpt = tmp / "pp2-load"
    shutil.copytree(folder.parent, ckpt)
    gpt_train(tmp, (2, 2), "--steps", SAVED, "--checkpoint-dir", ckpt, "--resume", "--save-full", tmp / "pp-full.pt",
              "--export-hf", tmp / "pp-hf")
    pp_full = torch.load(tmp / "pp-full.pt")
    assert sorted(pp_full) == sorted(full), (sorted(pp_full), sorted(full))
    for name, tensor in full.items():
        assert torch.equal(pp_full[name], tensor), f"{name}: the pipelined --save-full differs"
    files = sorted(p.name for p in (tmp / "hf").iterdir())
    assert files == sorted(p.name for p in (tmp / "pp-hf").iterdir()), files
    for name in files:
        assert (tmp / "hf" / name).read_bytes() == (tmp / "pp-hf" / name).read_bytes(), f"--export-hf's {name} differs"


def check_dcp(tmp, folder):
    """dcp.load reads the pipelined checkpoint: the parameters the unpipelined run loads from it."""
    ckpt = tmp / "pp1-load"
    shutil.copytree(folder.parent, ckpt)
    gpt_train(tmp, (1, 2), "--steps", SAVED, "--checkpoint-dir", ckpt, "--resume", "--save-full", tmp / "full.pt",
              "--export-hf", tmp / "hf")
    full = torch.load(tmp / "full.pt")
    check_pipelined_export(tmp, folder, full)
    loaded = dcp_load(folder, full)
    for name, expected in full.items():
        assert torch.equal(loaded[name], expected), f"{name}: dcp.load of the pipelined checkpoint differs"
    moments = {f"state.{n}.{kind}": t for n, t in full.items() for kind in ("exp_avg", "exp_avg_sq")}
    state = dcp_load(folder, moments)
    assert all(not t.isnan().any() for t in state.values()), "dcp.load left AdamW moments unread"
    return len(full), len(moments), full


def refused(tmp, saved_dir, edit, needles):
    """A copy of the checkpoint with `edit` applied to its metadata.json: resuming at (pp 2, dp 1)
    fails, naming `needles`, on every rank alike."""
    ckpt = tmp / "edited"
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.copytree(saved_dir, ckpt)
    path = ckpt / f"step-{SAVED:08d}" / "metadata.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    cmd = [FSDPRUN, "--nproc-per-node", 2, GPT, "--data", tmp / "text.txt", *MODEL, *LAYOUTS[(2, 1)],
           "--steps", STEPS, "--checkpoint-dir", ckpt, "--resume"]
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode != 0, f"an edited checkpoint resumed:\n{r.stdout[-2000:]}"
    for needle in needles:
        assert needle in r.stderr, f"no {needle!r} in:\n{r.stderr[-3000:]}"


def add_copy(meta, old, new):
    """A parameter `new` described as `old` is (its pieces in the same files), `old` kept."""
    meta["params"] += [{**p, "name": new} for p in meta["params"] if p["name"] == old]
    for f in meta["files"]:
        f["pieces"] += [{**piece, "param": new} for piece in f["pieces"] if piece["param"] == old]


def drop(meta, name):
    meta["params"] = [p for p in meta["params"] if p["name"] != name]
    for f in meta["files"]:
        f["pieces"] = [piece for piece in f["pieces"] if piece["param"] != name]
    for group in meta.get("param_groups", []):
        group["params"] = [n for n in group["params"] if n != name]


def check_refusals(tmp, saved_dir):
    """A checkpoint parameter no stage holds, and a stage's parameter the checkpoint lacks: named."""
    name = "h.3.attn.q_proj.weight"
    refused(tmp, saved_dir, lambda m: add_copy(m, name, "h.9.attn.q_proj.weight"),
            ("'h.9.attn.q_proj.weight'", "no stage of this run holds"))
    refused(tmp, saved_dir, lambda m: drop(m, name), (f"'{name}'",))


def check_async_save(tmp, folder, layout=(2, 2)):
    """--async-save (fsdp::pp::save_checkpoint_async; its step-2 save staged in the arena reserved
    after step 1, completed by the step-3 save): the step-3 folder is byte for byte the
    synchronous save's."""
    async_dir = tmp / ("async-" + "x".join(map(str, layout)))
    gpt_train(tmp, layout, "--steps", SAVED, "--save-every", 2, "--checkpoint-dir", async_dir, "--async-save")
    saved = {f.name: f.read_bytes() for f in folder.iterdir()}
    written = {f.name: f.read_bytes() for f in (async_dir / folder.name).iterdir()}
    assert sorted(written) == sorted(saved), (sorted(written), sorted(saved))
    differ = [name for name in saved if written[name] != saved[name]]
    assert not differ, f"--async-save's {folder.name} differs from the synchronous save's in {differ}"
    assert (async_dir / "step-00000002" / "metadata.json").exists(), "the step-2 save was not completed"


def check_tp_save(tmp, straight):
    """Saved at (pp 2, dp 1, tp 2), each stage's tp ranks writing their own shard files after the
    stages before it: resumed at (pp 2, dp 1, tp 2) bitwise the uninterrupted run at that layout,
    and at (pp 1, dp 2) within TOLERANCE of the (pp 2, dp 2) run."""
    tp_layout = (2, 1, 2)
    uninterrupted, _ = gpt_train(tmp, tp_layout, "--steps", STEPS)
    ckpt = tmp / "tp-saved"
    gpt_train(tmp, tp_layout, "--steps", SAVED, "--save-every", SAVED, "--checkpoint-dir", ckpt)
    for layout, want, bound in ((tp_layout, uninterrupted, 0), ((1, 2), straight, TOLERANCE)):
        resumed_dir = tmp / f"tp-resumed-{len(layout)}"
        shutil.copytree(ckpt, resumed_dir)
        losses, _ = gpt_train(tmp, layout, "--steps", STEPS, "--checkpoint-dir", resumed_dir, "--resume")
        assert sorted(losses) == list(range(SAVED, STEPS)), losses
        gap = max(abs(losses[s] - want[s]) for s in losses)
        assert gap <= bound, f"saved at (pp 2, tp 2), resumed at {layout}: |loss gap| {gap:.3g} > {bound}"


def check_interleaved_save(tmp, straight, like, saved_1f1b):
    """Saved at (pp 2, dp 2) under interleaved 1F1B (each rank's two stages' shard files in one
    folder, one metadata.json): --async-save writes it byte for byte; dcp.load reads every
    parameter and AdamW moment (within TOLERANCE of the 1F1B save's); resumed interleaved, bitwise
    the uninterrupted interleaved run; at (pp 1, dp 2), (pp 2, dp 2) 1F1B and (pp 4, dp 1) within
    TOLERANCE of the uninterrupted 1F1B run. Returns the report's line."""
    uninterrupted, _ = gpt_train(tmp, INTERLEAVED, "--steps", STEPS)
    ckpt = tmp / "interleaved-saved"
    gpt_train(tmp, INTERLEAVED, "--steps", SAVED, "--save-every", SAVED, "--checkpoint-dir", ckpt)
    folder = ckpt / f"step-{SAVED:08d}"
    check_async_save(tmp, folder, INTERLEAVED)
    meta = json.loads((folder / "metadata.json").read_text())
    assert sorted(p["name"] for p in meta["params"]) == sorted(like), meta["params"]
    assert meta["world_size"] == 4, meta["world_size"]
    loaded, expected = dcp_load(folder, like), dcp_load(saved_1f1b, like)
    dcp_gap = max((loaded[n] - expected[n]).abs().max().item() for n in like)
    assert dcp_gap <= TOLERANCE, f"dcp.load of the interleaved checkpoint: {dcp_gap:.3g} from the 1F1B one's"
    moments = {f"state.{n}.{kind}": t for n, t in like.items() for kind in ("exp_avg", "exp_avg_sq")}
    assert all(not t.isnan().any() for t in dcp_load(folder, moments).values()), "dcp.load left AdamW moments unread"
    gaps = resume_gaps(tmp, ckpt, "interleaved", ((INTERLEAVED, uninterrupted, 0), ((1, 2), straight, TOLERANCE),
                                                  ((2, 2), straight, TOLERANCE), ((4, 1), straight, TOLERANCE)))
    return f"saved interleaved, dcp.load within {dcp_gap:.2g}, resumed with loss gaps {gaps}"


def resume_gaps(tmp, ckpt, saved_as, resumes):
    """Each (layout, uninterrupted losses, bound) of `resumes`: a copy of `ckpt` resumed at layout,
    its losses within bound of those. Returns the gaps, for the report."""
    gaps = []
    for layout, want, bound in resumes:
        resumed_dir = tmp / (saved_as + "-resumed-" + "x".join(map(str, layout)))
        shutil.copytree(ckpt, resumed_dir)
        losses, _ = gpt_train(tmp, layout, "--steps", STEPS, "--checkpoint-dir", resumed_dir, "--resume")
        assert sorted(losses) == list(range(SAVED, STEPS)), losses
        gap = max(abs(losses[s] - want[s]) for s in losses)
        assert gap <= bound, f"saved {saved_as} at (pp 2, dp 2), resumed at {layout}: |loss gap| {gap:.3g} > {bound}"
        gaps.append(f"{layout}: {gap:.2g}")
    return ", ".join(gaps)


def check_muon_resume(tmp, layout=(2, 2)):
    """--optimizer muon (Muon's momentum beside AdamW's moments in one pipelined checkpoint): 3 steps
    saved and 3 resumed at `layout` are bitwise the 6 uninterrupted steps."""
    muon = ["--optimizer", "muon"]
    straight, _ = gpt_train(tmp, layout, *muon, "--steps", STEPS)
    ckpt = tmp / ("muon-" + "x".join(map(str, layout)))
    gpt_train(tmp, layout, *muon, "--steps", SAVED, "--save-every", SAVED, "--checkpoint-dir", ckpt)
    meta = json.loads((ckpt / f"step-{SAVED:08d}" / "metadata.json").read_text())
    assert "Muon" in json.dumps(meta), "the pipelined checkpoint holds no Muon state"
    resumed, _ = gpt_train(tmp, layout, *muon, "--steps", STEPS, "--checkpoint-dir", ckpt, "--resume")
    assert sorted(resumed) == list(range(SAVED, STEPS)), resumed
    gap = max(abs(resumed[s] - straight[s]) for s in resumed)
    assert gap == 0, f"--optimizer muon resumed at {layout} is not the uninterrupted run: |loss gap| {gap:.3g}"


def check_zbv_resume(tmp, straight):
    """Saved at (pp 2, dp 2) under ZBV (its stages sharded, their W passes adding into the held
    sums): resumed under ZBV, bitwise the uninterrupted ZBV run; at (pp 2, dp 2) 1F1B within
    TOLERANCE of the uninterrupted 1F1B run. Returns the report's line."""
    uninterrupted, _ = gpt_train(tmp, ZBV, "--steps", STEPS)
    ckpt = tmp / "zbv-saved"
    gpt_train(tmp, ZBV, "--steps", SAVED, "--save-every", SAVED, "--checkpoint-dir", ckpt)
    gaps = resume_gaps(tmp, ckpt, "zbv", ((ZBV, uninterrupted, 0), ((2, 2), straight, TOLERANCE)))
    return f"saved under zbv, resumed with loss gaps {gaps}"


def check_gpt2_tie_resume(tmp):
    """GPT-2 (its head tied to wte across the first and the last stage, both sharded) at
    (pp 2, dp 2) under 1F1B: 3 steps saved and 3 resumed there are bitwise the 6 uninterrupted
    steps, each saving (so both runs' stages are sharded alike)."""
    gpt2 = ["--model", "gpt2", "--layers", 2, "--dim", 32, "--heads", 4, "--seq", 16, "--batch", 2, "--lr", 3e-3,
            "--seed", 5, "--pp", 2, "--microbatches", 2, "--pp-schedule", "1f1b", "--data", tmp / "text.txt"]

    def run(*flags):
        metrics = tmp / "gpt2-{rank}.jsonl"
        cmd = [FSDPRUN, "--nproc-per-node", 4, GPT, *gpt2, "--metrics", metrics, *flags]
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, timeout=300)
        assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        records = [json.loads(line) for line in Path(str(metrics).replace("{rank}", "0")).read_text().splitlines()]
        return {rec["step"]: rec["loss"] for rec in records if "loss" in rec}

    straight = run("--steps", STEPS, "--save-every", STEPS, "--checkpoint-dir", tmp / "gpt2-straight")
    ckpt = tmp / "gpt2-saved"
    run("--steps", SAVED, "--save-every", SAVED, "--checkpoint-dir", ckpt)
    resumed = run("--steps", STEPS, "--save-every", STEPS, "--checkpoint-dir", ckpt, "--resume")
    assert sorted(resumed) == list(range(SAVED, STEPS)), resumed
    gap = max(abs(resumed[s] - straight[s]) for s in resumed)
    assert gap == 0, f"GPT-2 resumed at (pp 2, dp 2) is not the uninterrupted run: |loss gap| {gap:.3g}"


def main():
    with tempfile.TemporaryDirectory(prefix="pp_ckpt_") as tmp:
        tmp = Path(tmp)
        write_corpus(tmp / "text.txt")
        straight_dir = tmp / "straight"
        straight, _ = gpt_train(tmp, (2, 2), "--steps", STEPS, "--save-every", STEPS, "--checkpoint-dir", straight_dir)
        saved_dir = tmp / "saved"
        first, _ = gpt_train(tmp, (2, 2), "--steps", SAVED, "--save-every", SAVED, "--checkpoint-dir", saved_dir)
        assert all(first[s] == straight[s] for s in first), (first, straight)
        folder = saved_dir / f"step-{SAVED:08d}"
        check_async_save(tmp, folder)
        check_muon_resume(tmp)
        check_muon_resume(tmp, INTERLEAVED)
        check_gpt2_tie_resume(tmp)
        check_tp_save(tmp, straight)
        meta = json.loads((folder / "metadata.json").read_text())
        params, moments, like = check_dcp(tmp, folder)
        assert "h.3.attn.q_proj.weight" in like, sorted(like)
        check_refusals(tmp, saved_dir)
        # One metadata for every stage, under the model's own names (none stage-local).
        assert sorted(p["name"] for p in meta["params"]) == sorted(like), meta["params"]
        assert meta["world_size"] == 4, meta["world_size"]
        expected = dcp_load(straight_dir / f"step-{STEPS:08d}", like)
        report = [check_interleaved_save(tmp, straight, like, folder), check_zbv_resume(tmp, straight)]
        for layout in LAYOUTS:
            ckpt = tmp / ("resume-" + "x".join(map(str, layout)))
            shutil.copytree(saved_dir, ckpt)
            losses, out = gpt_train(tmp, layout, "--steps", STEPS, "--save-every", STEPS, "--checkpoint-dir", ckpt,
                                    "--resume")
            assert f"resumed from {ckpt}/step-{SAVED:08d} at step {SAVED}" in out, out
            assert sorted(losses) == list(range(SAVED, STEPS)), losses
            got = dcp_load(ckpt / f"step-{STEPS:08d}", like)
            loss_gap = max(abs(losses[s] - straight[s]) for s in losses)
            param_gap = max((got[n] - expected[n]).abs().max().item() for n in expected)
            if layout == (2, 2):
                assert loss_gap == 0 and param_gap == 0, f"{layout}: not bitwise ({loss_gap}, {param_gap})"
            assert loss_gap <= TOLERANCE and param_gap <= TOLERANCE, \
                f"(pp, dp) = {layout}: |loss - uninterrupted| {loss_gap:.3g}, |param - uninterrupted| {param_gap:.3g}"
            report.append(f"{layout}: losses within {loss_gap:.2g}, parameters within {param_gap:.2g}")
    print(f"pp_checkpoint_end_to_end: saved at (pp 2, dp 2) step {SAVED}, resumed to step {STEPS}: "
          + "; ".join(report) + f". dcp.load read {params} parameters (bitwise the unpipelined load) "
          f"and {moments} AdamW moments of the pipelined checkpoint")


if __name__ == "__main__":
    main()
