"""Bad input to the planner (fsdp_plan, gpt_train --plan / --auto): impossible sizes that would
overflow int64 (a config.json's vocab_size 2^62, a --model-json shape [2^32, 2^32], --batches
beyond int64), meaningless numbers in a --model-json description, JSON nested 100,000 deep, a
FIFO or a folder in place of a file, work beyond what it plans in seconds, absurd device rates.
Every case fails within seconds with one line naming the cause (the file and its JSON path, or
the flag) and the fix; never "fits", a hang, a crash or library text.

    bad_plan_table.py BIN_DIR [TABLE.md]

Prints a markdown table (case, expected, exit code, seconds, first line of the message) and
writes it to TABLE.md (default /tmp/bad_plan_table.md). Exits 1 if any case fails. Its runs and
helpers are tests/bad_input_table.py's; its data is generated in a temporary folder."""
import copy
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bad_files_table as bf  # noqa: E402
import bad_input_table as bt  # noqa: E402  (reads BIN_DIR from the same argv)

TABLE = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/bad_plan_table.md")
PLAN = str(bt.BIN / "fsdp_plan")
# The planner's own flags for a tiny GPT on a GPU preset (no probe of this machine: fast).
TINY_PLAN = ["--layers", "1", "--dim", "16", "--heads", "2", "--seq", "16", "--batch", "2",
             "--gpu", "h200"]
FAST = 10       # seconds: every refusal comes before any real work
ONE_LINE = 600  # characters: a message that dumps a user's value is longer
RAW = ("nlohmann", "basic_filebuf", "filesystem error", "[json.exception", "type_error")


def plan(*extra, timeout=30, preexec_fn=None):
    return bt.run([PLAN, *TINY_PLAN, *extra], timeout=timeout, preexec_fn=preexec_fn)


def refused(t, name, result, *needles, within=FAST):
    """bad_files_table's refusal, with no raw library text and the whole output short."""
    bf.refused(t, name, result, *needles, absent=RAW, within=within, max_chars=ONE_LINE)


def description(tmp):
    """The tiny GPT's description as fsdp_plan writes it (the start every case edits)."""
    path = tmp / "gpt.json"
    made = plan("--write-model-json", str(path))
    if made.rc != 0:
        raise RuntimeError("--write-model-json failed:\n" + made.output)
    return json.loads(path.read_text())


def model_json_cases(t, tmp):
    """--model-json: each meaningless number refused by its JSON path."""
    base = description(tmp)

    def edited(name, edit):
        d = copy.deepcopy(base)
        edit(d)
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(d))
        return path

    def set_in(*keys_and_value):
        *keys, value = keys_and_value

        def edit(d):
            for k in keys[:-1]:
                d = d[k]
            d[keys[-1]] = value
        return edit

    unit0 = base["units"][0]
    cases = [  # name, edit, needles
        ("--model-json shape [2^32, 2^32]",
         set_in("units", 0, "params", 0, "shape", [4294967296, 4294967296]),
         ("units[0].params[0].shape", "int64")),
        ("--model-json resident_bytes -1", set_in("resident_bytes", -1),
         ("resident_bytes", "-1", "whole number in [0, 2^63)")),
        ("--model-json saved -1", set_in("units", 0, "activations", "saved", -1),
         ("units[0].activations.saved", "-1")),
        ("--model-json saved 1e30", set_in("units", 0, "activations", "saved", 1e30),
         ("units[0].activations.saved", "1e+30", "whole number")),
        ("--model-json saved 2^64-1", set_in("units", 0, "activations", "saved", 2**64 - 1),
         ("units[0].activations.saved", "2^63")),
        ("--model-json sequence_tokens -5", set_in("sequence_tokens", -5),
         ("sequence_tokens", "-5")),
        # Planned as "0 tokens/s" before; the file is named with the key.
        ("--model-json sequence_tokens 0", set_in("sequence_tokens", 0),
         ("--model-json_sequence_tokens_0.json", "sequence_tokens is 0", "count >= 1")),
        ("--model-json forward_flops -1", set_in("units", 0, "forward_flops", -1.0),
         ("units[0].forward_flops", "finite number >= 0")),
        ("--model-json a parameter named twice",
         set_in("units", 0, "params", 1, "name", unit0["params"][0]["name"]),
         ("units[0].params[1].name", "units[0].params[0].name", "its own name")),
        ("--model-json a unit named twice", lambda d: d["units"].append(copy.deepcopy(unit0)),
         ("units[1].name", "units[0].name", "its own name")),
        ("--model-json a unit that is a number", set_in("units", 0, 7),
         ("units[0]", "JSON object")),
        ("--model-json dtype of 10,000 characters",
         set_in("units", 0, "params", 0, "dtype", "x" * 10000),
         ("units[0].params[0].dtype", "fp32")),
        ("--model-json sizes past 1 EiB at batch 2",
         set_in("units", 0, "activations", "saved", 2**62),
         ("1 EiB", "batch 2", "real sizes")),
    ]
    for name, edit, needles in cases:
        refused(t, name, plan("--model-json", str(edited(name.replace(" ", "_"), edit))), *needles)


def file_cases(t, tmp):
    """What --model-json and --write-model-json name: never blocking, never unbounded."""
    fifo = tmp / "fifo.json"
    os.mkfifo(fifo)
    refused(t, "--model-json a FIFO", plan("--model-json", str(fifo)),
            "fifo.json", "is a FIFO", "regular file")
    refused(t, "--write-model-json a FIFO", plan("--write-model-json", str(fifo)),
            "--write-model-json", "fifo.json", "not a regular file")
    refused(t, "--model-json a folder", plan("--model-json", str(tmp)),
            str(tmp), "is a folder", "--model-json")
    huge = tmp / "huge.json"
    huge.write_bytes(b"")
    os.truncate(huge, 100 << 20)  # sparse: written in no time
    refused(t, "--model-json of 100 MB", plan("--model-json", str(huge)),
            "huge.json", "104857600 bytes, more than", "was not read")
    deep = tmp / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    refused(t, "--model-json nested 100,000 deep", plan("--model-json", str(deep)),
            "deep.json", "more than 64 deep")


def hf_folder(tmp, name, **config):
    """A folder holding only config.json: the planner reads no weights."""
    folder = tmp / name
    folder.mkdir()
    base = {"model_type": "gpt2", "vocab_size": 256, "n_positions": 16, "n_layer": 1,
            "n_embd": 16, "n_head": 2}
    config = {k: v for k, v in {**base, **config}.items() if v is not None}  # None: key left out
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def hf_cases(t, tmp):
    """config.json's sizes bounded as --layers/--vocab/--seq bound them, in fsdp_plan and in
    gpt_train --plan (the same check as training); a deep value refused before anything dumps it."""
    hf_only = ["--gpu", "h200", "--batch", "2"]  # the sizes come from config.json
    for key, value, flag in (("vocab_size", 2**62, "--vocab"), ("n_positions", 2**62, "no model"),
                             ("n_layer", 1000000000, "--layers")):
        folder = hf_folder(tmp, f"hf-{key}", **{key: value})
        refused(t, f"fsdp_plan config.json {key} {value}",
                bt.run([PLAN, *hf_only, "--init-from-hf", str(folder)]),
                "config.json", f'"{key}" is {value}', flag)
    wide = hf_folder(tmp, "hf-wpe", n_positions=2**40, n_embd=65536)
    refused(t, "fsdp_plan config.json n_positions 2^40, n_embd 65536 (wpe 2^56 elements)",
            bt.run([PLAN, *hf_only, "--seq", "16", "--init-from-hf", str(wide)]),
            "1 EiB", "real sizes")
    scores = hf_folder(tmp, "hf-scores", n_positions=2**22, n_embd=65536, n_head=65536)
    refused(t, "fsdp_plan --mingpt, H*T^2 past int64 (n_positions 2^22, n_head 65536)",
            bt.run([PLAN, *hf_only, "--mingpt", "--init-from-hf", str(scores)]),
            "more bytes than int64", "smaller model")
    folder = tmp / "hf-n_layer"
    refused(t, "gpt_train --plan config.json n_layer 1000000000",
            bt.run([bt.GPT, "--plan", *hf_only, *bt.DATA, "--init-from-hf", str(folder)]),
            "config.json", '"n_layer" is 1000000000', "--layers")
    deep = tmp / "hf-deep"
    deep.mkdir()
    (deep / "config.json").write_text('{"model_type": ' + "[" * 100000 + "]" * 100000 + "}")
    refused(t, "gpt_train --init-from-hf model_type nested 100,000 deep",
            bt.run([bt.GPT, *bt.gpt_args("--init-from-hf", str(deep))]),
            "config.json", "more than 64 deep")
    refused(t, "fsdp_plan --init-from-hf model_type nested 100,000 deep",
            bt.run([PLAN, *hf_only, "--init-from-hf", str(deep)]), "config.json", "more than 64 deep")
    long = hf_folder(tmp, "hf-long", model_type=[[1] * 50] * 1000)
    refused(t, "config.json model_type a 100 KB value", bt.run([PLAN, *hf_only, "--init-from-hf", str(long)]),
            "config.json", '"model_type" must be a string')
    quoted = hf_folder(tmp, "hf-quoted", tie_word_embeddings="true")
    refused(t, "fsdp_plan config.json tie_word_embeddings \"true\" (a string)",
            bt.run([PLAN, *hf_only, "--init-from-hf", str(quoted)]),
            "config.json", '"tie_word_embeddings" must be true or false')
    null_tie = hf_folder(tmp, "hf-null-tie")
    config = json.loads((null_tie / "config.json").read_text())
    for model_type in ("gpt2", "llama"):  # a Llama read null as false: untied, silently
        config.update(model_type=model_type, tie_word_embeddings=None)
        if model_type == "llama":
            config.update(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=16)
        (null_tie / "config.json").write_text(json.dumps(config))
        refused(t, f"fsdp_plan config.json ({model_type}) tie_word_embeddings null",
                bt.run([PLAN, *hf_only, "--init-from-hf", str(null_tie)]),
                "config.json", '"tie_word_embeddings" is null', "true or false")
    untyped = hf_folder(tmp, "hf-untyped", model_type=None)
    refused(t, "fsdp_plan config.json without model_type",
            bt.run([PLAN, *hf_only, "--init-from-hf", str(untyped)]), "config.json", 'has no "model_type"')


def flag_cases(t, tmp):
    """The planner's flags: range-checked, its work bounded."""
    refused(t, "--batches 99999999999999999999",
            plan("--max-memory-gb", "1", "--batches", "99999999999999999999"),
            "--batches", "[1, 1048576]")
    refused(t, "--batches with 33 sizes", plan("--max-memory-gb", "1", "--batches", ",".join(["1"] * 33)),
            "--batches", "more than 32")
    refused(t, "--layers 1024 --ranks 1048576",
            bt.run([PLAN, "--gpu", "h200", "--layers", "1024", "--ranks", "1048576"], timeout=20),
            "1048576 ranks x 1025 units", "unit-ranks", "fewer ranks")
    # The search's flags without the cap that starts a search: refused, not the --tp 1 plan.
    for flag, value in (("--tp-sizes", "1,2"), ("--batches", "1,2")):
        refused(t, f"fsdp_plan {flag} without --max-memory-gb", plan(flag, value),
                flag, "needs --max-memory-gb")
        refused(t, f"gpt_train --plan {flag} without --max-memory-gb",
                bt.run([bt.GPT, "--plan", *TINY_PLAN, *bt.DATA, flag, value]), flag, "needs --max-memory-gb")
    refused(t, "--tflops-fp32 1e-300", plan("--tflops-fp32", "1e-300"), "--tflops-fp32", "1e-300")
    refused(t, "--memory-gb 1e300", plan("--memory-gb", "1e300"), "--memory-gb", "1e300")
    refused(t, "--latency-us 1e300", plan("--latency-us", "1e300"), "--latency-us")
    # --auto in a run of 2 ranks told --ranks 8: the conflict named, not "ranks per host".
    result = bt.sharded("--auto", "--max-memory-gb", "1", "--ranks", "8", n=2)
    refused(t, "--auto --ranks 8 at W=2", result, "--ranks 8", "world size 2", within=30)
    t.check("... not blamed on ranks per host", "no `ranks per host`", result,
            "ranks per host" not in result.output, "blames ranks per host")


def data_cases(t, tmp):
    """--data for the planner's count of training data: a folder that cannot be listed named in
    one line (as training names it), / counted without walking the whole tree."""
    folder = tmp / "data"
    folder.mkdir()
    shutil.copy(tmp / "text.txt", folder / "a.txt")
    closed = folder / "closed"
    closed.mkdir()
    closed.chmod(0)
    for path in (tmp, folder, folder / "a.txt"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    refused(t, "fsdp_plan --data with a folder that cannot be listed",
            plan("--data", str(folder), preexec_fn=bt.as_nobody), "--data", "closed", "cannot list")
    closed.chmod(0o755)
    result = plan("--data", "/", timeout=60)
    raw = [r for r in RAW if r in result.output]
    ok = not raw and (result.rc == 0 or "--data" in result.output) and result.seconds < 30
    t.check("fsdp_plan --data /", "a plan, or an error naming `--data`, < 30 s", result, ok,
            f"raw text {raw}" if raw else f"rc {result.rc}, {result.seconds:.1f} s")


def all_cases(t):
    with tempfile.TemporaryDirectory(prefix="bad_plan_") as tmp:
        tmp = Path(tmp)
        bt.make_text(tmp / "text.txt", 64 << 10)
        bt.DATA[:] = ["--data", str(tmp / "text.txt")]
        model_json_cases(t, tmp)
        file_cases(t, tmp)
        hf_cases(t, tmp)
        flag_cases(t, tmp)
        data_cases(t, tmp)


def main():
    bt.run_table(all_cases, "bad-plan", TABLE)


if __name__ == "__main__":
    main()
