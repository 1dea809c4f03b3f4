"""End to end: asynchronous sharded checkpoints (checkpoint_tool --async-save under fsdprun). A
save written by the background thread loads bitwise the state saved, in new processes; a kill -9
of every rank during the background write (after its shard files, before the metadata) leaves the
previous checkpoint the one that `latest` names, and it loads. gpt_train --async-save
--save-every 2 (each save completed by the next, while training went on) resumed from its step-6
checkpoint ends bitwise where the run that never stopped ends."""
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from checkpoint_e2e import kill_during_save, run


def gpt_train(bin_dir, corpus, *args):
    command = [f"{bin_dir}/fsdprun", "--nproc-per-node", "2", f"{bin_dir}/gpt_train", "--data", corpus,
               "--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--steps", "8", *map(str, args)]
    subprocess.run(command, check=True, capture_output=True, text=True)


def gpt_train_resumes_bitwise(bin_dir, corpus, tmp):
    gpt_train(bin_dir, corpus, "--save-full", f"{tmp}/straight.pt")
    gpt_train(bin_dir, corpus, "--save-every", 2, "--checkpoint-dir", f"{tmp}/ck", "--async-save")
    (Path(tmp) / "ck" / "latest").write_text("step-00000006\n")  # resume from a middle save
    gpt_train(bin_dir, corpus, "--save-every", 2, "--checkpoint-dir", f"{tmp}/ck", "--async-save", "--resume",
              "--save-full", f"{tmp}/resumed.pt")
    straight, resumed = torch.load(f"{tmp}/straight.pt"), torch.load(f"{tmp}/resumed.pt")
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight), \
        "gpt_train --async-save resumed from step 6 does not end where the straight run ends"


def main(bin_dir, corpus):
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = f"{tmp}/a"
        first = run(bin_dir, corpus, 2, "--steps", 10, "--save", ckpt, "--async-save")
        saved = first["digest"]["at_save"]
        loaded = run(bin_dir, corpus, 2, "--load", ckpt)
        assert loaded["resumed_step"] == ["10"] and loaded["digest"]["after_load"] == saved, \
            f"the asynchronous save does not load the state saved: {loaded} vs {saved}"

        kill_during_save(bin_dir, corpus, ckpt, "--async-save")
        assert not (Path(ckpt) / "step-00000012" / "metadata.json").exists()
        after_kill = run(bin_dir, corpus, 2, "--load", ckpt)
        assert after_kill["resumed_step"] == ["10"] and after_kill["digest"]["after_load"] == saved, \
            "the killed asynchronous save broke the previous checkpoint"
        gpt_train_resumes_bitwise(bin_dir, corpus, tmp)
    print("async checkpoint end to end: the background write loads bitwise; a kill -9 during it "
          "leaves the previous checkpoint loadable; gpt_train --async-save resumes bitwise")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
