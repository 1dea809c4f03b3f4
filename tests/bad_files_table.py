"""Damaged files inside the folders gpt_train reads (a checkpoint directory, a Hugging Face model
folder): a FIFO in place of a file, a name that leads out of its folder, a malformed `latest`, a
metadata.json far too large. Every case fails within seconds (never waiting for a FIFO's writer
or for FSDP_TIMEOUT_SECONDS), naming the file and the rule it breaks; nothing outside the folder
is ever loaded.

    bad_files_table.py BIN_DIR [TABLE.md]

Prints a markdown table (case, expected, exit code, seconds, first line of the message) and
writes it to TABLE.md (default /tmp/bad_files_table.md). Exits 1 if any case fails. Its runs and
helpers are tests/bad_input_table.py's; its data is generated in a temporary folder."""
import json
import os
import shutil
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bad_input_table as bt  # noqa: E402  (reads BIN_DIR from the same argv)

TABLE = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/bad_files_table.md")
# Well below FSDP_TIMEOUT_SECONDS (20): a case that waited for a peer's timeout is a hang.
FAST = 15
INDEX = "model.safetensors.index.json"
SHARD = "model-00001-of-00001.safetensors"


def refused(t, name, result, *needles, absent=(), within=FAST, max_chars=None):
    """A non-zero exit within `within` seconds, every needle in the output and no `absent` one
    (a message that names another cause than the real one); with `max_chars`, an output no
    longer (one line, not a dump of the input)."""
    missing = [n for n in needles if n not in result.output]
    wrong = [a for a in absent if a in result.output]
    long = max_chars is not None and len(result.output) > max_chars
    why = ("exit code 0" if result.rc == 0 else
           f"message lacks {missing}" if missing else
           f"message says {wrong}" if wrong else
           f"{len(result.output)} characters of output" if long else
           f"took {result.seconds:.1f} s, not < {within}" if result.seconds >= within else "")
    expect = "error naming " + " + ".join(f"`{n}`" for n in needles) + f", < {within} s"
    t.check(name, expect, result, result.rc not in (0, "hang") and not why, why)


def replace_with_fifo(path):
    path.unlink()
    os.mkfifo(path)


def write_latest(text):
    return lambda copy: (copy / "latest").write_text(text)


def tensor_names(safetensors):
    """The tensor names in a safetensors file's header (8-byte length, then JSON)."""
    with open(safetensors, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return [k for k in json.loads(f.read(length)) if k != "__metadata__"]


def write_index(folder, file_of):
    """An index naming, for each tensor of the folder's shard, the file `file_of(tensor)` (None:
    an empty weight_map)."""
    names = tensor_names(folder / SHARD) if file_of else []
    weight_map = {name: file_of(name) for name in names}
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def checkpoint_cases(t, tmp):
    ck = tmp / "ck"
    made = bt.sharded("--steps", "4", "--save-every", "2", "--checkpoint-dir", str(ck), n=2)
    t.check("setup: 2 ranks, 4 steps, --save-every 2", "exit 0, latest = step-4", made,
            made.rc == 0 and (ck / "latest").exists() and
            (ck / "latest").read_text() == "step-00000004\n")
    if made.rc != 0:
        raise RuntimeError("the setup run failed:\n" + made.output)
    step = "step-00000004"
    outside = tmp / "outside"  # beside the copies: what a name that leaves its folder reaches
    outside.mkdir()
    metadata = json.loads((ck / step / "metadata.json").read_text())
    shard = metadata["files"][0]["name"]
    shutil.copy(ck / step / shard, outside / shard)  # a valid shard: loading it would succeed
    (outside / "latest").write_text(step + "\n")
    shutil.copytree(ck / step, outside / step)

    def name_outside(copy):
        edited = json.loads((copy / step / "metadata.json").read_text())
        edited["files"][0]["name"] = f"../../../outside/{shard}"
        (copy / step / "metadata.json").write_text(json.dumps(edited))

    def link_latest(copy):
        (copy / "latest").unlink()
        (copy / "latest").symlink_to(outside / "latest")

    def link_step_folder(copy):
        shutil.rmtree(copy / step)
        (copy / step).symlink_to(outside / step)

    def huge_metadata(copy):
        os.truncate(copy / step / "metadata.json", 300 << 20)  # sparse: written in no time

    cases = [  # name, damage, needles, absent
        ("`latest` a FIFO", lambda c: replace_with_fifo(c / "latest"),
         ("latest", "is a FIFO", "regular file"), ()),
        ("metadata.json a FIFO", lambda c: replace_with_fifo(c / step / "metadata.json"),
         ("metadata.json", "is a FIFO", "regular file"), ()),
        ("a shard file a FIFO", lambda c: replace_with_fifo(c / step / shard),
         (shard, "is a FIFO", "regular file"), ()),
        ("metadata.json names ../../../outside/SHARD", name_outside,
         ("metadata.json", "../../../outside", "'..' component", "inside its folder"), ()),
        ("`latest` names ../../outside", write_latest("../../outside\n"),
         ("latest", "'../../outside'", "not the name of a step folder"), ()),
        ("`latest` a symlink", link_latest, ("latest", "symbolic link"), ()),
        ("`latest` with a trailing space", write_latest(step + " \n"),
         ("latest", f"'{step} '", "not the name of a step folder"), ()),
        ("`latest` with 23 digits", write_latest("step-" + "1" * 23 + "\n"),
         ("latest", "1 to 18 digits"), ("stoll",)),
        ("step folder a link out of the dir", link_step_folder,
         ("latest", "link leads out of"), ()),
        ("300 MiB metadata.json", huge_metadata,
         ("metadata.json", "314572800 bytes, more than", "was not read"), ()),
    ]
    for i, (name, damage, needles, absent) in enumerate(cases):
        copy = tmp / "cases" / f"case{i}"
        shutil.copytree(ck, copy, symlinks=True)
        damage(copy)
        result = bt.sharded("--steps", "6", "--resume", "--save-every", "2",
                            "--checkpoint-dir", str(copy), n=2, timeout=40)
        refused(t, name, result, *needles, absent=absent,
                within=5 if name.startswith("300 MiB") else FAST)


def hf_cases(t, tmp):
    single = tmp / "hf"
    made = bt.sharded("--steps", "0", "--export-hf", str(single))
    t.check("setup: --export-hf", "exit 0, config.json + model.safetensors", made,
            made.rc == 0 and (single / "model.safetensors").exists())
    if made.rc != 0:
        raise RuntimeError("the --export-hf run failed:\n" + made.output)
    indexed = tmp / "hf-indexed"
    shutil.copytree(single, indexed)
    (indexed / "model.safetensors").rename(indexed / SHARD)
    write_index(indexed, lambda _: SHARD)
    loads = bt.sharded("--init-from-hf", str(indexed))
    t.check("setup: the indexed folder loads", "exit 0", loads, loads.rc == 0)

    def copy_of(folder, name, damage):
        copy = tmp / "hf-cases" / name
        shutil.copytree(folder, copy)
        damage(copy)
        return copy

    config_fifo = copy_of(single, "config-fifo", lambda c: replace_with_fifo(c / "config.json"))
    refused(t, "HF config.json a FIFO", bt.sharded("--init-from-hf", str(config_fifo)),
            "config.json", "is a FIFO", "regular file")
    shard_fifo = copy_of(indexed, "shard-fifo", lambda c: replace_with_fifo(c / SHARD))
    refused(t, "HF index names a shard that is a FIFO",
            bt.sharded("--init-from-hf", str(shard_fifo)), SHARD, "is a FIFO", "regular file")
    empty_map = copy_of(indexed, "empty-map", lambda c: write_index(c, None))
    refused(t, "HF index with an empty weight_map", bt.sharded("--init-from-hf", str(empty_map)),
            INDEX, '"weight_map" is empty')
    shutil.copy(indexed / SHARD, tmp / "hf-cases" / "x.safetensors")  # exists, beside the folder
    up = copy_of(indexed, "up", lambda c: write_index(c, lambda _: "../x.safetensors"))
    refused(t, "HF index names ../x.safetensors (it exists)",
            bt.sharded("--init-from-hf", str(up)), INDEX, "'../x.safetensors'", "'..' component",
            absent=("does not exist",))


def main():
    bt.run_in_text_folder("bad_files_", "bad-file", TABLE, checkpoint_cases, hf_cases)


if __name__ == "__main__":
    main()
