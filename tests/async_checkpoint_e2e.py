"""End to end: asynchronous sharded checkpoints (checkpoint_tool --async-save under fsdprun). A
save written by the background thread loads bitwise the state saved, in new processes; a kill -9
of every rank during the background write (after its shard files, before the metadata) leaves the
previous checkpoint the one that `latest` names, and it loads."""
import sys
import tempfile
from pathlib import Path

from checkpoint_e2e import kill_during_save, run


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
    print("async checkpoint end to end: the background write loads bitwise; a kill -9 during it "
          "leaves the previous checkpoint loadable")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
