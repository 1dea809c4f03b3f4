"""Checkpoints that load are checkpoints that make sense, and outputs that cannot be written are
errors. Each checkpoint case edits a copy of a real checkpoint that a tiny run saved, recomputing
the CRC-32s that metadata.json holds (so only the semantic check can catch it): optimizer state
left out, AdamW steps and extra.step that disagree with each other or with the folder, inf/NaN
moments, a box's shape or DCP_SHARDING_INFO offsets that disagree with metadata.json, extra
fields missing or mistyped. The same for a model's buffers and any torch::optim optimizer's
state (tests/checkpoint_state_tool.cpp: a BatchNorm model): a buffer corrupt, missing, of another
shape or dtype, or one the model lacks; a checkpoint of another optimizer than the resuming one;
an optimizer state entry missing. A refused checkpoint must stay byte for byte as it was. Each
output case writes to a full file system (/dev/full, or a full
tmpfs mounted in a private mount namespace when this test runs as root): the run must end with
a non-zero exit naming the flag and the file, in one line, without a backtrace.

    bad_checkpoint_table.py BIN_DIR [TABLE.md]

Prints a markdown table (case, expected, exit code, seconds, first line of the message) and
writes it to TABLE.md (default /tmp/bad_checkpoint_table.md). Exits 1 if any case fails. Its
runs and helpers are tests/bad_input_table.py's; its data is generated in a temporary folder."""
import array
import json
import os
import shutil
import struct
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bad_input_table as bt  # noqa: E402  (reads BIN_DIR from the same argv)
from bad_files_table import refused  # noqa: E402

TABLE = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/bad_checkpoint_table.md")
STEP = "step-00000002"
TOOL = str(bt.BIN / "checkpoint_tool")
NLOHMANN = "[json.exception"  # raw library text: never in a message


class Checkpoint:
    """A copy of a checkpoint folder (DIR/step-00000002) opened for editing: metadata.json and
    its shard files, whose CRC-32s in metadata.json follow every tensor edited."""

    def __init__(self, folder):
        self.folder = folder
        self.meta = json.loads((folder / "metadata.json").read_text())

    def save(self):
        (self.folder / "metadata.json").write_text(json.dumps(self.meta))

    def params(self):
        return self.meta["params"]

    def read_file(self, name):
        blob = (self.folder / name).read_bytes()
        (length,) = struct.unpack("<Q", blob[:8])
        return json.loads(blob[8:8 + length]), blob[8 + length:]

    def write_file(self, name, header, data):
        """Writes header + data (the header padded with spaces, as safetensors allows) and the
        file's new size into metadata.json."""
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        blob = struct.pack("<Q", len(text)) + text + data
        (self.folder / name).write_bytes(blob)
        for f in self.meta["files"]:
            if f["name"] == name:
                f["bytes"] = len(blob)

    def edit_tensors(self, param, kind, change):
        """Every saved box of tensor `kind` ("param", "exp_avg", "step"...) of `param`: its float
        values replaced by change(values), its CRC-32 recomputed."""
        key = param if kind == "param" else f"state.{param}.{kind}"
        for f in self.meta["files"]:
            header, data = self.read_file(f["name"])
            if key not in header:
                continue
            begin, end = header[key]["data_offsets"]
            values = array.array("f", data[begin:end])
            new = array.array("f", change(list(values))).tobytes()
            data = data[:begin] + new + data[end:]
            self.write_file(f["name"], header, data)
            for piece in f["pieces"]:
                if piece["param"] == param and kind in piece["crc32"] and \
                        (kind != "step" or piece["begin"] == 0):
                    piece["crc32"][kind] = zlib.crc32(new)

    def set_adamw_step(self, value):
        for p in self.params():
            p["optimizer_step"] = value
            self.edit_tensors(p["name"], "step", lambda v: [float(value)] * len(v))

    def drop_optimizer_state(self):
        """A params-only checkpoint: no moments, no steps, in metadata.json and in the files."""
        for p in self.params():
            p["optimizer_step"], p["optimizer_moments"] = None, []
        for f in self.meta["files"]:
            header, data = self.read_file(f["name"])
            kept = {k: v for k, v in header.items() if not k.startswith("state.")}
            out, info = b"", json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
            for k in sorted((k for k in kept if k != "__metadata__"),
                            key=lambda k: kept[k]["data_offsets"][0]):
                begin, end = kept[k]["data_offsets"]
                kept[k] = {**kept[k], "data_offsets": [len(out), len(out) + end - begin]}
                out += data[begin:end]
            kept["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(
                {k: v for k, v in info.items() if not k.startswith("state.")})
            self.write_file(f["name"], kept, out)
            for piece in f["pieces"]:
                piece["crc32"] = {"param": piece["crc32"]["param"]}

    def rewrite_file(self, name, change):
        """Rewrites shard file `name` through change(tensors, info): tensors maps each key to
        [header entry without data_offsets, bytes] (in file order), info is its
        DCP_SHARDING_INFO; both edited in place. Offsets and the file's size follow."""
        header, data = self.read_file(name)
        meta = header.pop("__metadata__")
        info = json.loads(meta["DCP_SHARDING_INFO"])
        tensors = {}
        for key in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
            begin, end = header[key]["data_offsets"]
            tensors[key] = [{k: v for k, v in header[key].items() if k != "data_offsets"},
                            data[begin:end]]
        change(tensors, info)
        out, new = b"", {"__metadata__": {**meta, "DCP_SHARDING_INFO": json.dumps(info)}}
        for key, (entry, blob) in tensors.items():
            new[key] = {**entry, "data_offsets": [len(out), len(out) + len(blob)]}
            out += blob
        self.write_file(name, new, out)

    def buffer(self, name):
        return next(b for b in self.meta["buffers"] if b["name"] == name)

    def piece_file(self, param):
        """The name of the first shard file holding a piece of `param`."""
        return next(f["name"] for f in self.meta["files"]
                    if any(p["param"] == param for p in f["pieces"]))

    def first_matrix_box(self):
        """(file name, tensor key) of the first 2-D parameter box in a shard file."""
        for f in self.meta["files"]:
            header, _ = self.read_file(f["name"])
            for key, entry in header.items():
                if key != "__metadata__" and not key.startswith("state.") and \
                        len(entry["shape"]) == 2:
                    return f["name"], key
        raise RuntimeError("no 2-D box in the checkpoint")

    def edit_header(self, change):
        name, key = self.first_matrix_box()
        header, data = self.read_file(name)
        change(header, key)
        self.write_file(name, header, data)


def flatten_box(header, key):
    header[key]["shape"] = [header[key]["shape"][0] * header[key]["shape"][1]]


def shift_box(header, key):
    info = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
    info[key]["saved_offsets"][1] += 1
    header["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(info)


def set_extra(field, value):
    def edit(ck):
        if value is None:
            del ck.meta["extra"][field]
        else:
            ck.meta["extra"][field] = value
    return edit


def first_element(kind, value):
    return lambda ck: ck.edit_tensors(ck.params()[0]["name"], kind, lambda v: [value] + v[1:])


def saved_by_adam(ck):
    """metadata.json names Adam (whose state is AdamW's, tensor for tensor): a checkpoint of a
    program that trained the same GPT with torch::optim::Adam."""
    ck.meta["optimizer"] = "Adam"


def without_exp_avg_in_file(ck):
    """The first parameter's exp_avg gone from a shard file that holds a piece of it;
    metadata.json still lists it."""
    param = ck.params()[0]["name"]
    key = f"state.{param}.exp_avg"

    def change(tensors, info):
        del tensors[key]
        del info[key]
    ck.rewrite_file(ck.piece_file(param), change)


def without_exp_avg_sq(ck):
    ck.params()[0]["optimizer_moments"] = ["exp_avg"]


# The buffers of tests/checkpoint_state_tool.cpp's model (a BatchNorm1d(7) in its unit "block").
MEAN, VAR, COUNT = "block.bn.running_mean", "block.bn.running_var", "block.bn.num_batches_tracked"
FC = "block.fc.weight"


def corrupt_buffer(ck):
    """Bytes of running_mean altered on disk; metadata.json's CRC-32 left as saved."""
    def change(tensors, info):
        blob = tensors[MEAN][1]
        tensors[MEAN][1] = bytes([blob[0] ^ 0xFF]) + blob[1:]
    ck.rewrite_file(ck.buffer(MEAN)["file"], change)


def drop_buffer(ck):
    """running_var gone, from metadata.json and from its file: a checkpoint of a model without it."""
    def change(tensors, info):
        del tensors[VAR]
        del info[VAR]
    ck.rewrite_file(ck.buffer(VAR)["file"], change)
    ck.meta["buffers"] = [b for b in ck.meta["buffers"] if b["name"] != VAR]


def reshape_buffer(ck):
    """running_mean saved as [1, 7] (the same bytes), in metadata.json and in its file."""
    def change(tensors, info):
        tensors[MEAN][0]["shape"] = [1, 7]
        info[MEAN]["saved_offsets"] = [0, 0]
    ck.rewrite_file(ck.buffer(MEAN)["file"], change)
    ck.buffer(MEAN)["shape"] = [1, 7]


def count_as_double(ck):
    """num_batches_tracked (int64) saved as a double of the same value, its CRC-32 recomputed."""
    saved = {}

    def change(tensors, info):
        (count,) = struct.unpack("<q", tensors[COUNT][1])
        tensors[COUNT] = [{**tensors[COUNT][0], "dtype": "F64"}, struct.pack("<d", float(count))]
        saved["crc"] = zlib.crc32(tensors[COUNT][1])
    ck.rewrite_file(ck.buffer(COUNT)["file"], change)
    ck.buffer(COUNT).update(dtype="Double", crc32=saved["crc"])


def count_header_as_double(ck):
    """num_batches_tracked's header says F64 (its 8 bytes and metadata.json's Long unchanged,
    so its CRC-32 holds): read as a double, 2 would become 1e-323, then 0 in the model."""
    def change(tensors, info):
        tensors[COUNT][0]["dtype"] = "F64"
    ck.rewrite_file(ck.buffer(COUNT)["file"], change)


def extra_buffer(ck):
    """A buffer the model does not have ("block.bn.running_max", a copy of running_mean), in
    metadata.json and in the file, its CRC-32 right."""
    name = "block.bn.running_max"

    def change(tensors, info):
        tensors[name] = [dict(tensors[MEAN][0]), tensors[MEAN][1]]
        info[name] = dict(info[MEAN])
    ck.rewrite_file(ck.buffer(MEAN)["file"], change)
    ck.meta["buffers"].append({**ck.buffer(MEAN), "name": name})


def without_momentum_in_metadata(ck):
    """One parameter's momentum_buffer left out of its optimizer_moments; the others keep theirs."""
    next(p for p in ck.params() if p["name"] == FC)["optimizer_moments"] = []


def without_one_momentum(ck):
    """RMSprop (momentum, centered): one parameter's momentum_buffer left out of its
    optimizer_moments, its square_avg, grad_avg and step kept, as the other parameters' all."""
    param = next(p for p in ck.params() if p["name"] == FC)
    param["optimizer_moments"] = [k for k in param["optimizer_moments"] if k != "momentum_buffer"]


def without_momentum_in_file(ck):
    """One parameter's momentum_buffer tensor gone from its shard file; metadata.json lists it."""
    key = f"state.{FC}.momentum_buffer"

    def change(tensors, info):
        del tensors[key]
        del info[key]
    ck.rewrite_file(ck.piece_file(FC), change)


def without_param_groups(ck):
    """As a checkpoint saved before the param groups' options were: no "param_groups"."""
    del ck.meta["param_groups"]


def another_param_group(ck):
    """A second param group (the first's copy) in metadata.json: the saved optimizer had two."""
    ck.meta["param_groups"].append(dict(ck.meta["param_groups"][0]))


def without_lr(ck):
    del ck.meta["param_groups"][0]["lr"]


def lr_as_text(ck):
    ck.meta["param_groups"][0]["lr"] = "0.1"


def edited_copy(source, dest, edit):
    shutil.copytree(source, dest)
    ck = Checkpoint(dest / STEP)
    edit(ck)
    ck.save()
    return dest


def refused_intact(t, name, folder, attempt, *needles, absent=()):
    """refused() for the run attempt() starts, which must also leave `folder` (the checkpoint it
    was refused) byte for byte as it was."""
    before = bt.digest(folder)
    result = attempt()
    if result.rc not in (0, "hang") and bt.digest(folder) != before:
        t.check(name, "error, the checkpoint left intact", result, False,
                "the refused run changed the checkpoint")
        return
    refused(t, name, result, *needles, absent=absent)


def resume(folder, *extra, n=2):
    return bt.sharded("--steps", "4", "--resume", "--save-every", "2", "--checkpoint-dir",
                      str(folder), *extra, n=n)


def final_loss(metrics):
    return [json.loads(line) for line in metrics.read_text().splitlines()][-1]["loss"]


def checkpoint_cases(t, tmp):
    ck = tmp / "ck"
    made = bt.sharded("--save-every", "2", "--checkpoint-dir", str(ck), n=2)
    t.check("setup: 2 ranks, 2 steps, --save-every 2", f"exit 0, {STEP}", made,
            made.rc == 0 and (ck / STEP / "metadata.json").exists())
    if made.rc != 0:
        raise RuntimeError("the setup run failed:\n" + made.output)
    metadata = f"{STEP}/metadata.json"
    cases = [  # name, edit, needles, absent
        ("no AdamW state for any parameter", Checkpoint.drop_optimizer_state,
         (metadata, "has no AdamW state", "--reset-optimizer"), ()),
        ("AdamW step -1", lambda c: c.set_adamw_step(-1),
         (metadata, "AdamW step -1", "optimizer_step"), ()),
        ("AdamW step 3 at extra.step 2", lambda c: c.set_adamw_step(3),
         (metadata, "AdamW step 3", "cannot have (1 to 2)"), ()),
        ("extra.step -2", set_extra("step", -2),
         (metadata, "extra.step is -2, not an integer from 0"), ()),
        ("extra.step a string", set_extra("step", "2"),
         (metadata, "extra.step is \"2\", not an integer from 0"), (NLOHMANN,)),
        ("extra.step missing", set_extra("step", None),
         (metadata, "has no extra.step"), (NLOHMANN,)),
        ("extra.step 3 in folder step-00000002", set_extra("step", 3),
         (metadata, "extra.step is 3 but its folder is step-00000002"), ()),
        ("extra.seed -1", set_extra("seed", -1),
         (metadata, "extra.seed is -1, not an integer from 0"), ("18446744073709551615",)),
        ("extra.seed missing", set_extra("seed", None),
         (metadata, "has no extra.seed"), (NLOHMANN,)),
        # An unsigned 0 once skipped the lower bound: every rank died dividing by it (SIGFPE).
        ("extra.tp 0", set_extra("tp", 0),
         (metadata, "extra.tp is 0, not an integer from 1"), ()),
        ("+inf in an exp_avg_sq", first_element("exp_avg_sq", float("inf")),
         ("exp_avg_sq", "holds inf or NaN", "earlier checkpoint"), ()),
        ("NaN in an exp_avg", first_element("exp_avg", float("nan")),
         ("exp_avg", "holds inf or NaN"), ()),
        ("exp_avg_sq left out of optimizer_moments", without_exp_avg_sq,
         ("metadata.json", "without its 'exp_avg_sq'", "wte.weight"), ("amsgrad",)),
        ("metadata.json names Adam: another optimizer's checkpoint", saved_by_adam,
         (metadata, "holds Adam state but the program's optimizer is AdamW",
          "build an Adam as the saved run did"), ()),
        ("exp_avg missing from its shard file", without_exp_avg_in_file,
         (".safetensors has no tensor 'state.", ".exp_avg' but metadata.json lists it",
          "resume from an intact copy of the checkpoint"), (NLOHMANN,)),
        ("a box's shape flattened in its header", lambda c: c.edit_header(flatten_box),
         ("safetensors", "in the header, but", "is the box"), ()),
        ("DCP_SHARDING_INFO offsets shifted", lambda c: c.edit_header(shift_box),
         ("safetensors", "DCP_SHARDING_INFO places tensor", "is at"), ()),
    ]
    for i, (name, edit, needles, absent) in enumerate(cases):
        copy = edited_copy(ck, tmp / "cases" / f"case{i}", edit)
        refused_intact(t, name, copy, lambda: resume(copy), *needles, absent=absent)
    reset_optimizer_cases(t, tmp, ck)


def reset_optimizer_cases(t, tmp, ck):
    """--reset-optimizer loads the parameters alone: from a checkpoint without AdamW state, and
    from a complete one the same run (AdamW afresh in both: bitwise the same losses)."""
    params_only = edited_copy(ck, tmp / "params-only", Checkpoint.drop_optimizer_state)
    complete = tmp / "complete"
    shutil.copytree(ck, complete)
    runs = {}
    for name, folder in (("params-only", params_only), ("complete", complete)):
        metrics = tmp / f"{name}.jsonl"
        runs[name] = (resume(folder, "--reset-optimizer", "--metrics", str(metrics), n=1), metrics)
    result, metrics = runs["params-only"]
    t.check("--reset-optimizer, checkpoint without AdamW state", "exit 0, announced in one line",
            result, result.rc == 0 and "AdamW starts afresh" in result.output)
    other, other_metrics = runs["complete"]
    same = result.rc == 0 and other.rc == 0 and final_loss(metrics) == final_loss(other_metrics)
    t.check("--reset-optimizer, complete checkpoint: AdamW afresh",
            "exit 0, the same last loss as from the params-only one", other, same,
            "" if same else "the last losses differ: AdamW kept the checkpoint's state")
    alone = bt.sharded("--reset-optimizer")
    t.fails("--reset-optimizer without --resume", alone, "--reset-optimizer", "--resume")
    every_step_skipped(t, tmp)
    muon_freeze_cases(t, tmp)


def muon_freeze_cases(t, tmp):
    """--optimizer muon's param groups follow --freeze (a frozen matrix is in neither optimizer):
    a resume whose --freeze differs is named by the parameter and the flag, not blamed on the
    library's param groups nor on a missing "AdamW state"."""
    muon = ["--optimizer", "muon", "--layers", "2"]
    for name, saved_freeze, resumed_freeze, needles in (
            ("muon resume with --freeze added", [], ["--freeze", "h.0.attn"],
             ("h.0.attn", "trained in the saved run", "--freeze 'h.0.attn' freezes it now",
              "saved run's --freeze")),
            ("muon resume of a frozen matrix that trains now", ["--freeze", "h.0.attn"], [],
             ("'h.0.attn.c_attn.weight' was frozen in the saved run", "trains now",
              "saved run's --freeze"))):
        ck = tmp / name.replace(" ", "-")
        made = bt.sharded(*muon, *saved_freeze, "--save-every", "2", "--checkpoint-dir", str(ck))
        if made.rc != 0:
            raise RuntimeError(f"the {name} setup run failed:\n" + made.output)
        refused_intact(t, name, ck, lambda: resume(ck, *muon, *resumed_freeze, n=1), *needles,
                       absent=("param group", "AdamW state"))


def every_step_skipped(t, tmp):
    """fp16 from a loss scale that overflows every step: AdamW never steps and has no state, and
    the checkpoint says so (extra.optimizer_stepped false): it is complete, and resumes as it is."""
    ck = tmp / "fp16-skipped"
    fp16 = ["--param-dtype", "fp16", "--loss-scale", "1e38"]
    made = bt.sharded(*fp16, "--save-every", "2", "--checkpoint-dir", str(ck))
    ok = made.rc == 0 and (ck / STEP / "metadata.json").exists()
    t.check("setup: fp16, every step skipped, --save-every 2", f"exit 0, {STEP}", made, ok)
    if ok:
        resumed = resume(ck, *fp16, n=1)
        t.check("fp16, every step skipped: --resume without AdamW state", "exit 0, no --reset-optimizer asked",
                resumed, resumed.rc == 0 and "AdamW starts afresh" not in resumed.output)


def checkpoint_tool_cases(t, tmp):
    """checkpoint_tool (the tests' own trainer) on edited checkpoints: one line, never
    "terminate called"; the library's own checks, which gpt_train's come before."""
    ck = tmp / "tool-ck"
    data = bt.DATA[1]
    made = bt.run([bt.FSDPRUN, "--nproc-per-node", "2", TOOL, "--data", data, "--steps", "2",
                   "--save", str(ck)])
    t.check("setup: checkpoint_tool --save", "exit 0", made, made.rc == 0)
    if made.rc != 0:
        raise RuntimeError("the checkpoint_tool run failed:\n" + made.output)
    step = next(p.name for p in ck.iterdir() if p.name.startswith("step-"))
    for name, edit, needles in (
            ("checkpoint_tool, no extra.step", set_extra("step", None),
             ("metadata.json", "has no extra.step")),
            ("checkpoint_tool, AdamW step -1", lambda c: c.set_adamw_step(-1),
             ("metadata.json", "AdamW step -1", "never negative"))):
        copy = tmp / "tool-cases" / name.split(", ")[1].replace(" ", "-")
        shutil.copytree(ck, copy)
        edited = Checkpoint(copy / step)
        edit(edited)
        edited.save()
        result = bt.run([bt.FSDPRUN, "--nproc-per-node", "2", TOOL, "--data", data, "--steps",
                         "1", "--load", str(copy)])
        refused(t, name, result, *needles, absent=(NLOHMANN,))


def state_tool(*flags):
    return bt.run([bt.FSDPRUN, "--nproc-per-node", "2", str(bt.BIN / "checkpoint_state_tool"), *flags])


def state_cases(t, tmp):
    """tests/checkpoint_state_tool.cpp (a BatchNorm model, any torch::optim optimizer, through
    fsdp::save_checkpoint / fsdp::load_sharded) resuming an edited checkpoint, or one another
    optimizer saved: a non-zero exit, one line naming the cause, the file or entry and the fix,
    and the checkpoint byte for byte as it was."""
    saved = {}
    for optimizer in ("sgd", "adamw", "rmsprop"):
        ck = tmp / f"state-{optimizer}"
        made = state_tool("--optimizer", optimizer, "--steps", "2", "--save", str(ck))
        t.check(f"setup: checkpoint_state_tool --optimizer {optimizer} --save", f"exit 0, {STEP}",
                made, made.rc == 0 and (ck / STEP / "metadata.json").exists())
        if made.rc != 0:
            raise RuntimeError("the checkpoint_state_tool run failed:\n" + made.output)
        saved[optimizer] = ck
    for optimizer, ck in saved.items():  # the checks refuse edits, not checkpoints
        copy = tmp / f"state-{optimizer}-intact"
        shutil.copytree(ck, copy)
        resumed = state_tool("--optimizer", optimizer, "--steps", "1", "--load", str(copy))
        t.check(f"unedited {optimizer} checkpoint resumed by {optimizer}", "exit 0, resumed_step 2",
                resumed, resumed.rc == 0 and "resumed_step 2" in resumed.output)
    old = edited_copy(saved["sgd"], tmp / "state-sgd-without-param-groups", without_param_groups)
    resumed = state_tool("--optimizer", "sgd", "--steps", "1", "--load", str(old))
    t.check("sgd checkpoint without param_groups (saved before options were) resumed", "exit 0, resumed_step 2",
            resumed, resumed.rc == 0 and "resumed_step 2" in resumed.output)
    shard0 = "shard-00000-model-00001-of-"
    intact = "resume from an intact copy of the checkpoint"
    cases = [  # name, saved by, edit, resumed by, needles
        ("buffer bytes altered (CRC-32 mismatch)", "sgd", corrupt_buffer, "sgd",
         (shard0, f"buffer '{MEAN}' has CRC-32", "the file is corrupt", intact)),
        ("buffer missing from the checkpoint", "sgd", drop_buffer, "sgd",
         ("metadata.json", f"has no buffer '{VAR}'", "build the model as the saved run did")),
        ("buffer of another shape", "sgd", reshape_buffer, "sgd",
         ("metadata.json", f"buffer '{MEAN}' has shape [1, 7] but the model's is [7]",
          "build the model as the saved run did")),
        ("buffer of another dtype (int64 count saved as double)", "sgd", count_as_double, "sgd",
         ("metadata.json", f"buffer '{COUNT}' is Double but the model's is Long",
          "build the model as the saved run did")),
        ("buffer's header dtype edited (metadata.json's and the CRC-32 unchanged)", "sgd",
         count_header_as_double, "sgd",
         (shard0, f"buffer '{COUNT}' is Double [] in the header but metadata.json says Long []",
          intact)),
        ("a buffer the model does not have", "sgd", extra_buffer, "sgd",
         ("metadata.json", "has buffer 'block.bn.running_max' that the model does not have",
          "build the model as the saved run did")),
        ("saved with SGD (momentum), resumed with AdamW", "sgd", None, "adamw",
         ("metadata.json", "holds SGD state", "the program's optimizer is AdamW",
          "build an SGD as the saved run did", "to switch optimizers")),
        ("saved with AdamW, resumed with SGD (momentum)", "adamw", None, "sgd",
         ("metadata.json", "holds AdamW state", "the program's optimizer is SGD",
          "build an AdamW as the saved run did")),
        ("momentum_buffer left out of one parameter's optimizer_moments", "sgd",
         without_momentum_in_metadata, "sgd",
         ("metadata.json", f"parameter '{FC}' lists no SGD state", "holds its 'momentum_buffer'",
          intact)),
        ("RMSprop: momentum_buffer left out of one parameter's optimizer_moments", "rmsprop",
         without_one_momentum, "rmsprop",
         ("metadata.json", f"parameter '{FC}' has RMSprop state without its 'momentum_buffer'",
          intact)),
        ("momentum_buffer missing from its shard file", "sgd", without_momentum_in_file, "sgd",
         (".safetensors", f"has no tensor 'state.{FC}.momentum_buffer'", "metadata.json lists",
          intact)),
        ("saved with two param groups, resumed with one", "adamw", another_param_group, "adamw",
         ("metadata.json", "the saved optimizer has 2 param group(s) but the program's has 1",
          "build the optimizer with the param groups of the saved run")),
        ("a param group's lr left out", "sgd", without_lr, "sgd",
         ("metadata.json", "option 'lr' is missing", intact)),
        ("a param group's lr a string", "rmsprop", lr_as_text, "rmsprop",
         ("metadata.json", "option 'lr' is of another type", '"0.1"', intact)),
    ]
    for i, (name, by, edit, resumer, needles) in enumerate(cases):
        copy = tmp / "state-cases" / f"case{i}"
        if edit is None:
            shutil.copytree(saved[by], copy)
        else:
            edited_copy(saved[by], copy, edit)
        refused_intact(t, name, copy, lambda: state_tool("--optimizer", resumer, "--steps", "1",
                                                         "--load", str(copy)),
                       *needles, absent=(NLOHMANN, "with other options"))


def full_tmpfs_command(mountpoint, command):
    """`command` in a private mount namespace where `mountpoint` is a 4 KiB tmpfs, filled: every
    write there fails with ENOSPC, as on a full disk (the mount ends with the command)."""
    script = ('mount -t tmpfs -o size=4k tmpfs "$0" && '
              '(dd if=/dev/zero of="$0/fill" bs=1024 count=64 2>/dev/null; true) && exec "$@"')
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(mountpoint),
            *command]


def full_tmpfs_available(tmp):
    if os.geteuid() != 0:
        return "not root"
    probe = bt.run(full_tmpfs_command(tmp, ["true"]))
    return "" if probe.rc == 0 else "unshare/mount failed: " + probe.output.strip()[:100]


def output_cases(t, tmp):
    out = bt.sharded("--metrics", "/dev/full")
    refused(t, "--metrics /dev/full", out, "--metrics /dev/full", "cannot write it",
            "No space left on device")
    full = tmp / "full"
    full.mkdir()
    why = full_tmpfs_available(full)
    if why:
        print(f"skipped the full-tmpfs cases: {why} (they mount a tmpfs)")
        return
    cases = [  # name, flags, W, needles
        ("--metrics on a full tmpfs", ["--metrics", f"{full}/m{{rank}}.jsonl"], 2,
         ("--metrics", "m0.jsonl", "cannot write it")),
        ("--trace on a full tmpfs", ["--trace", f"{full}/t.json"], 1,
         ("--trace", "t.json", "No space left on device")),
        ("--dump-batches on a full tmpfs", ["--dump-batches", f"{full}/b.pt"], 1,
         ("--dump-batches", "b.pt", "No space left on device")),
        ("--save-full on a full tmpfs (W=2)", ["--save-full", f"{full}/p.pt"], 2,
         ("--save-full", "p.pt", "No space left on device")),
        ("--export-hf on a full tmpfs (W=2)", ["--export-hf", f"{full}/hf"], 2,
         ("--export-hf", "hf", "No space left on device")),
    ]
    for name, flags, world, needles in cases:
        command = [bt.FSDPRUN, "--nproc-per-node", str(world), bt.GPT, *bt.gpt_args(*flags)]
        refused(t, name, bt.run(full_tmpfs_command(full, command)), *needles)


def main():
    bt.run_in_text_folder("bad_checkpoint_", "bad-checkpoint", TABLE, checkpoint_cases,
                          checkpoint_tool_cases, state_cases, output_cases)


if __name__ == "__main__":
    main()
