"""End to end: sharded checkpoints of a 2-D (FSDP x TP) model, gpt_train --tp under fsdprun.
A GPT-2 (c_attn's fused q/k/v split per part, row-wise weights as column blocks, replicated norms,
biases and wpe) and a Llama (GQA, untied head) train at (dp, tp) = (2, 2), W = 4, and save at
step 3. Then:
- resumed at (2, 2): bitwise the losses of the uninterrupted run;
- resumed at (1, 2), (3, 1) and (1, 1) (W = 2, 3, 1; the same global batch of 6 rows): within
  checkpoint_e2e.py's bound of the uninterrupted run (float reassociation of other sums);
- PyTorch's torch.distributed.checkpoint.load (HuggingFaceStorageReader, no_dist) reads the
  (2, 2) checkpoint into plain tensors bitwise equal to the run's full state dict (--save-full,
  gathered by fsdp-cpp's collectives, not read from the files), each tensor's elements exactly
  once (the files' boxes tile it); AdamW's moments close to those of the same run at (2, 1);
- a checkpoint whose extra.tp was edited, or that lists a column block twice, is refused, naming
  the cause.
A GPT-2 saved at replicate 2 x shard 2 x tp 2 (W = 8) resumes at (2, 2) likewise, and one built
with --deferred-init at (2, 2) resumes at (1, 2).
Run: tp_checkpoint_e2e.py BIN_DIR [CORPUS]"""
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

LOSS_REL_TOL = 1e-4  # checkpoint_e2e.py's bound after resharding
MOMENT_REL_TOL = 1e-4  # TP's other sums vs the 1-D run after 3 steps (seen: under 1e-5), as a norm
CONFIG = ["--layers", "2", "--dim", "32", "--seq", "16", "--lr", "3e-3"]
FAMILIES = {"gpt2": ["--heads", "2"], "llama": ["--model", "llama", "--heads", "4", "--kv-heads", "2"]}  # GQA
ROWS = 6  # the global batch: 3 per dp rank at dp 2, 6 at dp 1, 2 at dp 3
SAVED = 3


def gpt_train(bin_dir, corpus, tmp, dp, tp, steps, *args, rows=ROWS):
    """gpt_train at (dp, tp) on the global batch of `rows` rows; rank 0's loss per step."""
    metrics = Path(tmp) / f"m-{dp}x{tp}-{{rank}}.jsonl"
    command = [f"{bin_dir}/fsdprun", "--nproc-per-node", str(dp * tp), f"{bin_dir}/gpt_train",
               "--data", corpus, *CONFIG, "--batch", str(rows // dp), "--steps", str(steps),
               "--metrics", str(metrics), *(["--tp", str(tp)] if tp > 1 else []), *map(str, args)]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode:  # the ranks' own error last, where a failed test's log ends
        raise subprocess.CalledProcessError(run.returncode, command, run.stdout, run.stderr) from RuntimeError(
            f"gpt_train at (dp, tp) = ({dp}, {tp}) failed: {run.stderr.strip()[-2000:]}")
    out = run.stdout
    lines = Path(str(metrics).replace("{rank}", "0")).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    Path(str(metrics).replace("{rank}", "0")).unlink()
    return {r["step"]: r["loss"] for r in records if "loss" in r}, out


def dcp_full(folder, like):
    """torch.distributed.checkpoint.load of `folder` into NaN-filled tensors shaped as `like`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    state = {k: torch.full_like(t, float("nan")) for k, t in like.items()}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)), no_dist=True)
    return state


def check_boxes_tile(folder, full):
    """The shard files' boxes (DCP_SHARDING_INFO) of each parameter cover it exactly once: a
    replicated parameter is saved once, not by every tp rank; so is each AdamW step."""
    from safetensors import safe_open
    count = {k: torch.zeros_like(t, dtype=torch.int32) for k, t in full.items()}
    steps = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            info = json.loads(f.metadata()["DCP_SHARDING_INFO"])
            for key in f.keys():
                if key.endswith(".step"):
                    steps[key] = steps.get(key, 0) + 1
                if key not in count:
                    continue
                shape = f.get_slice(key).get_shape()
                box = tuple(slice(o, o + s) for o, s in zip(info[key]["saved_offsets"], shape))
                count[key][box] += 1
    for key, c in count.items():
        assert bool((c == 1).all()), f"{key}: the saved boxes hold its elements {c.min()}..{c.max()} times"
    assert sorted(steps) == sorted(f"state.{k}.step" for k in full), sorted(steps)
    assert all(n == 1 for n in steps.values()), {k: n for k, n in steps.items() if n != 1}


def check_dcp(bin_dir, corpus, tmp, folder, full_path, family):
    """dcp.load of the (2, 2) checkpoint: the parameters bitwise the full state dict; AdamW's
    moments near the (2, 1) run's."""
    full = torch.load(full_path)
    check_boxes_tile(folder, full)
    loaded = dcp_full(folder, full)
    for k, expected in full.items():
        assert torch.equal(loaded[k], expected), f"{k}: dcp.load differs from the full state dict"
    moments = {f"state.{k}.{m}": t for k, t in full.items() for m in ("exp_avg", "exp_avg_sq")}
    tp_state = dcp_full(folder, moments)
    gpt_train(bin_dir, corpus, tmp, 2, 1, SAVED, *family, "--save-every", SAVED,
              "--checkpoint-dir", Path(tmp) / "one-d")
    one_d = dcp_full(Path(tmp) / "one-d" / f"step-{SAVED:08d}", moments)
    worst = 0.0
    for k in moments:
        assert not torch.isnan(tp_state[k]).any(), f"{k}: not every element was in the checkpoint"
        relative = ((tp_state[k] - one_d[k]).norm() / one_d[k].norm()).item()
        assert relative <= MOMENT_REL_TOL, f"{k}: (2, 2)'s differs from (2, 1)'s by {relative:.3g} relative"
        worst = max(worst, relative)
    return len(full), len(moments), worst


def refused(bin_dir, corpus, tmp, ckpt, family, edit, expected):
    """A copy of `ckpt` whose metadata.json `edit` changed does not resume: the error says `expected`."""
    edited = Path(tmp) / "edited"
    shutil.copytree(ckpt, edited)
    path = edited / f"step-{SAVED:08d}" / "metadata.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    try:
        gpt_train(bin_dir, corpus, tmp, 1, 1, 2 * SAVED, *family, "--checkpoint-dir", edited, "--resume")
    except subprocess.CalledProcessError as e:
        assert expected in e.stderr, e.stderr
    else:
        raise AssertionError(f"an edited checkpoint was resumed (expected: {expected})")
    finally:
        shutil.rmtree(edited)


def check_edited(bin_dir, corpus, tmp, ckpt, family):
    """extra.tp other than the layout that saved it, and a column block listed twice, are refused."""
    def tp_3(meta):
        meta["extra"]["tp"] = 3
    refused(bin_dir, corpus, tmp, ckpt, family, tp_3,
            "extra.tp is 3 but the checkpoint was saved by 4 ranks at tensor-parallel size 2")

    def box_twice(meta):  # a shard file's box pieces listed again (as another entry): they overlap
        file = next(f for f in meta["files"] if any("offsets" in p for p in f["pieces"]))
        meta["files"].append(dict(file, pieces=[p for p in file["pieces"] if "offsets" in p]))
    refused(bin_dir, corpus, tmp, ckpt, family, box_twice, "' overlap: the box at")


def check_family(bin_dir, corpus, name, family):
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        uninterrupted, _ = gpt_train(bin_dir, corpus, tmp, 2, 2, 2 * SAVED, *family)
        gpt_train(bin_dir, corpus, tmp, 2, 2, SAVED, *family, "--save-every", SAVED,
                  "--checkpoint-dir", ckpt, "--save-full", Path(tmp) / "full.pt")
        meta = json.loads((ckpt / f"step-{SAVED:08d}" / "metadata.json").read_text())
        assert meta["tp_size"] == 2 and meta["extra"]["tp"] == 2 and meta["world_size"] == 4, meta["extra"]
        assert any("offsets" in p for f in meta["files"] for p in f["pieces"]), "no column block saved as a box"
        params, moments, moment_gap = check_dcp(bin_dir, corpus, tmp, ckpt / f"step-{SAVED:08d}",
                                                Path(tmp) / "full.pt", family)
        check_edited(bin_dir, corpus, tmp, ckpt, family)
        worst = {}
        for dp, tp in [(2, 2), (1, 2), (3, 1), (1, 1)]:
            resumed, out = gpt_train(bin_dir, corpus, tmp, dp, tp, 2 * SAVED, *family,
                                     "--checkpoint-dir", ckpt, "--resume")
            assert sorted(resumed) == list(range(SAVED, 2 * SAVED)), resumed
            if tp != 2:
                assert "saved at --tp 2, resumed at --tp 1" in out, out
            for step, loss in resumed.items():
                relative = abs(loss - uninterrupted[step]) / abs(uninterrupted[step])
                if (dp, tp) == (2, 2):
                    assert loss == uninterrupted[step], f"{name} (2, 2) step {step}: {loss!r} vs {uninterrupted[step]!r}"
                assert relative <= LOSS_REL_TOL, (
                    f"{name}: resumed at (dp, tp) = ({dp}, {tp}), step {step} has loss {loss!r}, the "
                    f"uninterrupted (2, 2) run {uninterrupted[step]!r} ({relative:.3g} relative)")
                worst[(dp, tp)] = max(worst.get((dp, tp), 0.0), relative)
    print(f"{name}: a (2, 2) checkpoint resumed at (2, 2) bitwise, at "
          + ", ".join(f"({dp}, {tp}) within {w:.2g}" for (dp, tp), w in worst.items() if (dp, tp) != (2, 2))
          + f" relative of the uninterrupted run; dcp.load gave {params} parameters bitwise equal to "
          f"the full state dict and {moments} AdamW moments within {moment_gap:.2g} of the 1-D run's")


def check_three_d(bin_dir, corpus):
    """A GPT-2 saved at replicate 2 x shard 2 x tp 2 (W = 8, HYBRID over the dp ranks: the first
    replica writes) resumes at (2, 2) within the bound of the uninterrupted 3-D run."""
    three_d = ["--heads", "2", "--strategy", "hybrid", "--shard-group-size", "2"]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        uninterrupted, _ = gpt_train(bin_dir, corpus, tmp, 4, 2, 2 * SAVED, *three_d, rows=4)
        gpt_train(bin_dir, corpus, tmp, 4, 2, SAVED, *three_d, "--save-every", SAVED, "--checkpoint-dir", ckpt, rows=4)
        shards = {f.name[:11] for f in (ckpt / f"step-{SAVED:08d}").glob("*.safetensors")}
        assert shards == {f"shard-{k:05d}" for k in range(4)}, shards  # 2 shards x 2 tp ranks: one replica
        resumed, _ = gpt_train(bin_dir, corpus, tmp, 2, 2, 2 * SAVED, "--heads", "2", "--checkpoint-dir", ckpt,
                               "--resume", rows=4)
    assert sorted(resumed) == list(range(SAVED, 2 * SAVED)), resumed
    worst = max(abs(loss - uninterrupted[step]) / abs(uninterrupted[step]) for step, loss in resumed.items())
    assert worst <= LOSS_REL_TOL, f"3-D -> (2, 2): losses differ by {worst:.3g} relative"
    print(f"3-D (2 x 2 x 2) checkpoint resumed at (2, 2) within {worst:.2g} relative of the uninterrupted run")


def check_deferred_init(bin_dir, corpus):
    """A GPT-2 built block by block (--deferred-init: each unit split as it is initialised) and
    saved at (2, 2) resumes at (1, 2) without it, within the bound of the uninterrupted run."""
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        uninterrupted, _ = gpt_train(bin_dir, corpus, tmp, 2, 2, 2 * SAVED, "--heads", "2", "--deferred-init")
        gpt_train(bin_dir, corpus, tmp, 2, 2, SAVED, "--heads", "2", "--deferred-init", "--save-every", SAVED,
                  "--checkpoint-dir", ckpt)
        resumed, _ = gpt_train(bin_dir, corpus, tmp, 1, 2, 2 * SAVED, "--heads", "2", "--checkpoint-dir", ckpt, "--resume")
    assert sorted(resumed) == list(range(SAVED, 2 * SAVED)), resumed
    worst = max(abs(loss - uninterrupted[step]) / abs(uninterrupted[step]) for step, loss in resumed.items())
    assert worst <= LOSS_REL_TOL, f"--deferred-init (2, 2) -> (1, 2): losses differ by {worst:.3g} relative"
    print(f"--deferred-init (2, 2) checkpoint resumed at (1, 2) within {worst:.2g} relative of the uninterrupted run")


def main(bin_dir, corpus):
    for name, family in FAMILIES.items():
        check_family(bin_dir, corpus, name, family)
    check_three_d(bin_dir, corpus)
    check_deferred_init(bin_dir, corpus)


if __name__ == "__main__":  # CORPUS defaults to the build's test corpus (BIN_DIR/../test-corpus)
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else str(Path(sys.argv[1]).parent / "test-corpus" / "corpus.txt"))
