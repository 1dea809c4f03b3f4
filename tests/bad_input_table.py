"""Bad input to gpt_train, fsdprun and the FSDP_* variables: every case fails before any work
(or behaves as specified) with a message naming the flag or the cause; never a hang, a crash, a
raw torch error, a C++ backtrace, or a damaged checkpoint.

    bad_input_table.py BIN_DIR [TABLE.md]

Prints a markdown table (case, expected, exit code, seconds, first line of the message) and
writes it to TABLE.md (default /tmp/bad_input_table.md). Exits 1 if any case fails. Its data is
generated in a temporary folder (never the project's sources); the models are tiny."""
import array
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bad_input_pipeline  # noqa: E402  (gpt_train --pp's rows)

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
TABLE = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/bad_input_table.md")
GPT, FSDPRUN = str(BIN / "gpt_train"), str(BIN / "fsdprun")
TINY = ["--layers", "1", "--dim", "16", "--heads", "2", "--seq", "16", "--batch", "2", "--steps", "2"]
# Lines that only a crash or an unfiltered c10::Error prints.
CRASH = re.compile(r"terminate called|Exception raised from|frame #\d|CapturedTraceback|"
                   r"Segmentation fault|core dumped|what\(\):")
BASE_ENV = {**os.environ, "FSDP_TIMEOUT_SECONDS": "20", "OMP_NUM_THREADS": "1"}
for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "TORCH_SHOW_CPP_STACKTRACES"):
    BASE_ENV.pop(name, None)


class Run:
    def __init__(self, rc, seconds, output):
        self.rc, self.seconds, self.output = rc, seconds, output

    def first_line(self):
        lines = [line for line in self.output.splitlines() if "error" in line.lower()]
        line = (lines or self.output.splitlines() or [""])[0]
        return line.replace("|", "\\|")[:160]


def as_nobody():
    """In the child before exec, when this test runs as root: the user nobody, for whom a file of
    mode 000 is unreadable (root reads every file)."""
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)


def run(cmd, env=None, timeout=40, preexec_fn=None):
    """Runs `cmd` in its own session; a hang is killed (with its children) and reported."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env={**BASE_ENV, **(env or {})},
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=preexec_fn)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc, out = "hang", out + f"\nHANG: killed after {timeout} s"
    return Run(rc, time.monotonic() - start, out)


DATA = []  # ["--data", the generated text file], set in main()


def gpt_args(*extra):
    """The tiny run's flags with `extra` applied: a flag the tiny run has gets the new value
    (CLI11 refuses a flag given twice), any other is appended."""
    out = [*TINY, *DATA]
    i = 0
    while i < len(extra):
        if extra[i] in out[::2] and i + 1 < len(extra):
            out[out.index(extra[i]) + 1] = extra[i + 1]
            i += 2
        else:
            out.append(extra[i])
            i += 1
    return out


def sharded(*extra, n=1, env=None, timeout=40):
    return run([FSDPRUN, "--nproc-per-node", str(n), GPT, *gpt_args(*extra)], env, timeout)


def digest(folder):
    """Every file below `folder` (or the file itself) with its content hash: a checkpoint must
    stay byte-identical. run.lock, the run lock's file, is no checkpoint data: each run that
    takes the lock writes its name there and empties it when it ends."""
    if Path(folder).is_file():
        return {Path(folder).name: hashlib.sha256(Path(folder).read_bytes()).hexdigest()}
    out = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and path.name != "run.lock":
            out[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_text(path, size):
    rng = random.Random(7)
    words = ["def", "class", "return", "self", "value", "import", "for", "in", "if", "else",
             "print", "list", "dict", "tensor", "rank", "shard", "step", "loss", "(", ")", ":"]
    lines = []
    while sum(map(len, lines)) < size:
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "\n")
    Path(path).write_text("".join(lines)[:size])


class Table:
    def __init__(self):
        self.rows, self.failures = [], []

    def check(self, name, expect, result, ok, why=""):
        crash = CRASH.search(result.output)
        passed = ok and not crash and result.rc != "hang"
        if not passed:
            reason = why or ("crash/backtrace: " + crash.group(0) if crash else "unexpected result")
            self.failures.append(f"{name}: {reason}\n--- output ---\n{result.output[-3000:]}")
        self.rows.append((name, expect, str(result.rc), f"{result.seconds:.1f}",
                          result.first_line(), "ok" if passed else "FAIL"))

    def fails(self, name, result, *needles, untouched=None):
        """Exit code != 0 and every needle in the output (and `untouched`: (folder, digest))."""
        missing = [n for n in needles if n not in result.output]
        damaged = untouched is not None and digest(untouched[0]) != untouched[1]
        why = ("exit code 0" if result.rc == 0 else
               f"message lacks {missing}" if missing else "checkpoint changed" if damaged else "")
        self.check(name, "error naming " + " + ".join(f"`{n}`" for n in needles),
                   result, result.rc not in (0, "hang") and not missing and not damaged, why)

    def markdown(self):
        out = ["| case | expected | exit | s | message (first line) | |", "|---|---|---|---|---|---|"]
        out += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(out)


def run_table(fill, what, table_path):
    """Runs fill(table), prints the table and writes it to `table_path`; exits 1 if any case (or
    the script itself) failed."""
    t = Table()
    try:
        fill(t)
    except Exception as e:  # a broken case must still print the table and fail the test
        import traceback
        t.failures.append(f"the script itself failed: {e!r}\n{traceback.format_exc()}")
    table = t.markdown()
    print(table)
    table_path.write_text(table + "\n")
    if t.failures:
        print("\n\n".join(t.failures), file=sys.stderr)
        print(f"\n{len(t.failures)} problem(s) in {len(t.rows)} cases: FAILED", file=sys.stderr)
        sys.exit(1)
    print(f"\nall {len(t.rows)} {what} cases pass; table in {table_path}")


def run_in_text_folder(prefix, what, table_path, *fills):
    """run_table over `fills` (each fill(table, tmp)), in a temporary folder `tmp` (its name
    starting with `prefix`) that holds the generated text file DATA names (--data)."""
    def all_cases(t):
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            tmp = Path(tmp)
            make_text(tmp / "text.txt", 64 << 10)
            DATA[:] = ["--data", str(tmp / "text.txt")]
            for fill in fills:
                fill(t, tmp)
    run_table(all_cases, what, table_path)


def main():
    run_table(cases, "bad-input", TABLE)


def gpu_flags_without_a_gpu(t):
    """On a machine without a GPU, --device cuda fails before the rendezvous (the lone rank of
    W=2 asked for here would otherwise wait for a peer until FSDP_TIMEOUT_SECONDS), naming the
    cause (a CPU-only build, or no GPU) and the fix."""
    if any(Path("/dev").glob("nvidia[0-9]*")):
        return
    cuda_build = "libtorch_cuda" in run(["ldd", GPT]).output
    cause = "no CUDA GPU" if cuda_build else "CPU-only LibTorch"
    fix = "run on a machine with a GPU" if cuda_build else "scripts/build_cuda.sh"
    lone_rank = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for flags, named in ((["--device", "cuda"], "--device cuda"),
                         (["--cpu-offload", "--device", "cuda"], "--cpu-offload --device cuda"),
                         (["--reference", "--device", "cuda:1"], "--device cuda:1")):
        t.fails(f"{' '.join(flags)}, no GPU", run([GPT, *gpt_args(*flags)], env=lone_rank),
                named, cause, fix, "--device cpu")


def outputs_onto_inputs(t, tmp, text):
    """No output is an input: the same file (directly, through a symbolic or a hard link), a
    file inside an input folder, two outputs on one file. Each refused before any work (a long
    --steps: a late check would time out) with both flags named, and the input unchanged."""
    inputs = tmp / "inputs"
    inputs.mkdir()
    data = inputs / "data.txt"
    shutil.copy(text, data)
    symlink, hardlink = tmp / "data-symlink.txt", tmp / "data-hardlink.txt"
    symlink.symlink_to(data)
    os.link(data, hardlink)
    tokens = inputs / "tokens.bin"  # nanoGPT's format: uint16 ids, all < 256
    tokens.write_bytes(array.array("H", [i % 256 for i in range(8192)]).tobytes())
    folder = tmp / "data-folder"
    folder.mkdir()
    shutil.copy(text, folder / "a.txt")
    unchanged = {p: digest(p) for p in (data, tokens, folder)}
    long_run = ["--steps", "100000"]
    cases = [
        ("--metrics onto --data", gpt_args(*long_run, "--data", str(data), "--metrics", str(data)),
         ("--metrics", "--data", "same file")),
        ("--save-full onto --data", gpt_args(*long_run, "--data", str(data), "--save-full", str(data)),
         ("--save-full", "--data", "same file")),
        ("--trace onto --data", gpt_args(*long_run, "--data", str(data), "--trace", str(data)),
         ("--trace", "--data", "same file")),
        ("--metrics onto a symlink of --data",
         gpt_args(*long_run, "--data", str(data), "--metrics", str(symlink)), ("--metrics", "same file")),
        ("--save-full onto a hard link of --data",
         gpt_args(*long_run, "--data", str(data), "--save-full", str(hardlink)), ("--save-full", "same file")),
        ("--dump-batches onto --data-tokens",
         [*gpt_args(*long_run)[:-2], "--data-tokens", str(tokens), "--dump-batches", str(tokens)],
         ("--dump-batches", "--data-tokens", "same file")),
        ("--eval-out onto --eval-tokens",
         gpt_args(*long_run, "--eval-tokens", str(tokens), "--eval-out", str(tokens)),
         ("--eval-out", "--eval-tokens", "same file")),
        ("--metrics inside the --data folder",
         gpt_args(*long_run, "--data", str(folder), "--metrics", str(folder / "m.jsonl")),
         ("--metrics", "inside the --data folder")),
        ("--checkpoint-dir inside the --data folder",
         gpt_args(*long_run, "--data", str(folder), "--save-every", "2", "--checkpoint-dir",
                  str(folder / "ck")), ("--checkpoint-dir", "inside the --data folder")),
        ("--metrics and --trace one file",
         gpt_args(*long_run, "--metrics", str(tmp / "out.txt"), "--trace", str(tmp / "out.txt")),
         ("--metrics", "--trace", "same file")),
        ("--export-hf below a file (checked before training)",
         gpt_args(*long_run, "--export-hf", str(data / "sub")), ("--export-hf", "not a writable folder")),
    ]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: run([FSDPRUN, "--nproc-per-node", "1", GPT, *c[1]], timeout=30),
                                cases))
    for (name, _, needles), result in zip(cases, results):
        t.fails(name, result, *needles)
    changed = [str(p) for p, d in unchanged.items() if digest(p) != d]
    t.check("... every input unchanged", "data, tokens and folder byte-identical", results[-1],
            not changed, f"changed: {changed}")


def step_in_backward_where_it_cannot_apply(t):
    """--step-in-backward is refused, naming the flag it conflicts with, where it would silently
    not apply (a step that needs every gradient first, another optimizer, no units)."""
    cases = [("--step-in-backward --clip 1", ["--step-in-backward", "--clip", "1"], "--clip"),
             ("--step-in-backward fp16", ["--step-in-backward", "--param-dtype", "fp16"], "fp16"),
             ("--step-in-backward --optimizer torch", ["--step-in-backward", "--optimizer", "torch"],
              "--optimizer fused"),
             ("--step-in-backward --reference", ["--step-in-backward", "--reference"], "--reference")]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: sharded(*c[1], timeout=30), cases))
    for (name, _, named), result in zip(cases, results):
        t.fails(name, result, "--step-in-backward cannot apply", named)


AUTO_GPT = ["--layers", "4", "--dim", "64", "--heads", "4", "--seq", "64", "--batch", "4", "--steps", "3"]


def auto_keeps_its_cap(t):
    """--auto with gradient accumulation at W = 2: the plan counts the gradient shards of earlier
    micro-batches and keeps the planner's margin, so a cap just above the smallest plan is
    refused up front, and at a cap it accepts the run's measured peak stays under the cap; a
    given --strategy it replaces is named."""
    refused = sharded(*AUTO_GPT, "--auto", "--max-memory-gb", "0.0028766", n=2, timeout=60)
    t.fails("--auto, cap below every plan with the margin", refused, "--auto: no configuration fits",
            "margin")
    cap_gb = 0.0035
    ran = sharded(*AUTO_GPT, "--auto", "--max-memory-gb", str(cap_gb), "--strategy", "grad_op", n=2,
                  timeout=90)
    measured = re.search(r"measured ([0-9.]+) MiB \(max over ranks", ran.output)
    under = measured is not None and float(measured.group(1)) <= cap_gb * 1024
    t.check("--auto, cap just above a plan with accumulation", "exit 0, measured peak <= cap", ran,
            ran.rc == 0 and under, "" if under else "no measured peak under the cap")
    named = "instead of the given --strategy grad_op" in ran.output
    t.check("--auto replaces a given --strategy", "says which it trains with instead", ran,
            ran.rc == 0 and named, "" if named else "the replaced --strategy is not named")


def fault_tolerant_messages(t):
    """--fault-tolerant (replicas that survive a lost rank) where it cannot work: refused by name,
    by gpt_train's flags, by fsdp::init_replicas (one replica; a store that rank 0 serves) and by
    fsdprun --fault-tolerant (fewer than 2 replicas)."""
    hybrid = ["--strategy", "hybrid", "--shard-group-size", "2", "--fault-tolerant"]
    t.fails("--fault-tolerant --strategy full", sharded("--fault-tolerant"), "--fault-tolerant needs --strategy hybrid")
    t.fails("--fault-tolerant --tp 2", sharded(*hybrid, "--tp", "2"), "--fault-tolerant does not compose with --tp")
    t.fails("--fault-tolerant --auto", sharded(*hybrid, "--auto", "--max-memory-gb", "1"),
            "--fault-tolerant does not compose with --auto")
    t.fails("--fault-tolerant --optimizer muon", sharded(*hybrid, "--optimizer", "muon"), "not --optimizer muon")
    one = run([FSDPRUN, "--nproc-per-node", "2", "--fault-tolerant", "2", GPT, *gpt_args(*hybrid)], timeout=40)
    t.fails("fsdprun --fault-tolerant 2 with 2 ranks", one, "--fault-tolerant 2 needs at least 2 replicas")
    lone = sharded(*hybrid, n=2, timeout=60)
    t.fails("--fault-tolerant, 1 replica (W=2, F=2)", lone, "is one replica")
    plain = sharded(*hybrid, n=4, timeout=60)
    t.fails("--fault-tolerant without fsdprun --fault-tolerant", plain, "a store that outlives every rank",
            "fsdprun --fault-tolerant 2")


def tensor_parallel_messages(t, tmp):
    """Under --tp the flags at fault are named: hybrid's shard group against the data-parallel
    size (world / tp), not the "world size" of the dp group; --auto --tp-sizes runs with
    checkpoints (gpt_train --tp saves and resumes them) and with Muon (planned under --tp)."""
    bad = sharded("--tp", "2", "--strategy", "hybrid", "--shard-group-size", "3", n=4, timeout=60)
    t.fails("--tp 2 --shard-group-size 3 at W=4", bad, "--shard-group-size 3",
            "data-parallel size 2 (4 ranks / --tp 2)")
    t.check("... not blamed on the world size", "no `world size 2`", bad,
            "world size 2" not in bad.output, "names the dp group's size as the world size")
    ck = tmp / "auto-tp-ck"
    ran = sharded("--auto", "--max-memory-gb", "1", "--tp-sizes", "1,2", "--save-every", "2",
                  "--checkpoint-dir", str(ck), n=2, timeout=90)
    saved = (ck / "latest").exists()
    t.check("--auto --tp-sizes 1,2 --save-every 2", "exit 0, a checkpoint saved", ran,
            ran.rc == 0 and saved and "does not run with" not in ran.output)
    muon = sharded("--auto", "--max-memory-gb", "1", "--tp-sizes", "1,2", "--optimizer", "muon", n=2, timeout=90)
    t.check("--auto --tp-sizes 1,2 --optimizer muon", "exit 0: Muon is planned under --tp", muon,
            muon.rc == 0 and "does not plan" not in muon.output)


def per_rank_outputs(t, tmp):
    """At W = 2 a per-rank output without {rank} would be one file written by both ranks."""
    for flag in ("--metrics", "--trace"):
        t.fails(f"{flag} without {{rank}} at W=2", sharded(flag, str(tmp / "one.jsonl"), n=2),
                flag, "{rank}")


def data_folder_with_an_unreadable_file(t, tmp, text):
    """A folder of text with one file the user cannot read: an error naming that file, never a
    run on the rest (as root the run is started as the user nobody, for whom mode 000 holds)."""
    folder = tmp / "unreadable-data"
    folder.mkdir()
    shutil.copy(text, folder / "a.txt")
    secret = folder / "b-secret.txt"
    shutil.copy(text, secret)
    secret.chmod(0)
    for path in (tmp, folder, folder / "a.txt"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    result = run([GPT, "--reference", *gpt_args("--data", str(folder))], preexec_fn=as_nobody)
    t.fails("--data folder with an unreadable file", result, "--data", "b-secret.txt", "cannot read")
    secret.chmod(0o644)
    closed = folder / "c-closed"  # a folder that cannot be listed, read before the budget is spent
    closed.mkdir()
    shutil.copy(text, closed / "d.txt")
    closed.chmod(0)
    result = run([GPT, "--reference", *gpt_args("--data", str(folder), "--max-data-mb", "1")],
                 preexec_fn=as_nobody)
    t.fails("--data folder with a folder that cannot be listed", result, "--data", "c-closed",
            "cannot list")
    # The same folder past --max-data-mb: never reached, never named; the run trains.
    (folder / "a.txt").write_text(text.read_text() * 20)  # > 1 MiB before c-closed
    result = run([GPT, "--reference", *gpt_args("--data", str(folder), "--max-data-mb", "1")],
                 preexec_fn=as_nobody)
    t.check("... the same folder past --max-data-mb", "exit 0", result, result.rc == 0,
            "a folder beyond what --max-data-mb reads stopped the run")
    closed.chmod(0o755)
    # --data below a folder the user may not enter: named as such, not as missing.
    locked = tmp / "locked"
    locked.mkdir(mode=0o700)
    shutil.copy(text, locked / "data.txt")
    result = run([GPT, "--reference", *gpt_args("--data", str(locked / "data.txt"))],
                 preexec_fn=as_nobody)
    t.fails("--data below a folder closed to the user", result, "--data", "cannot be reached",
            "Permission denied")


def hf_config_too_large(t, tmp):
    """config.json's n_positions sizes wpe: the memory check counts it, and names config.json
    rather than flags the user never passed."""
    hf = tmp / "hf-huge"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "vocab_size": 256, "n_positions": 4294967328, "n_layer": 1,
        "n_embd": 16, "n_head": 2}))
    result = sharded("--init-from-hf", str(hf), "--seq", "16")
    t.fails("HF n_positions 4294967328", result, "config.json", "n_positions 4294967328",
            "choose a smaller model")
    t.check("... and no --layers/--dim blamed", "message names config.json only", result,
            "--layers/--dim" not in result.output, "blames flags the user did not pass")


def token_file_messages(t, tmp):
    """A token file's problems name the flag that named it (--data-tokens, --data or
    --eval-tokens), not always --data-tokens or --data."""
    odd = tmp / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    t.fails("--data-tokens, odd size", run([FSDPRUN, "--nproc-per-node", "1", GPT, *TINY,
                                            "--data-tokens", str(odd)]), "--data-tokens " + str(odd), "odd")
    t.fails("--data-tokens missing", run([FSDPRUN, "--nproc-per-node", "1", GPT, *TINY,
                                          "--data-tokens", str(tmp / "nope.bin")]),
            "--data-tokens " + str(tmp / "nope.bin"), "no such file")
    t.fails("--data FILE.bin, odd size", sharded("--data", str(odd)), "--data " + str(odd), "odd")
    t.fails("--eval-tokens, odd size", sharded("--eval-tokens", str(odd), "--eval-out",
                                               str(tmp / "e.pt")), "--eval-tokens " + str(odd), "odd")
    near_miss = tmp / "near-miss.bin"  # llm.c's header, version 1 and the count, magic off by one
    near_miss.write_bytes(array.array("i", [20240521, 1, 4096] + [0] * 253).tobytes() + bytes(8192))
    t.fails("--data-tokens, llm.c header with a wrong magic",
            run([FSDPRUN, "--nproc-per-node", "1", GPT, *TINY, "--data-tokens", str(near_miss)]),
            "--data-tokens " + str(near_miss), "magic number is 20240521", "20240520")
    swapped = tmp / "swapped.bin"  # llm.c's header and ids written big-endian (byte-swapped)
    header = array.array("i", [20240520, 1, 4096] + [0] * 253)
    header.byteswap()
    swapped.write_bytes(header.tobytes() + bytes(8192))
    t.fails("--data-tokens, llm.c header byte-swapped (big-endian)",
            run([FSDPRUN, "--nproc-per-node", "1", GPT, *TINY, "--vocab", "65536", "--data-tokens", str(swapped)]),
            "--data-tokens " + str(swapped), "byte-swapped", "little-endian")


def hf_config_readings(t, tmp):
    """config.json's keys read typed, as transformers reads them: a wrong type names the key and
    the file (never an abort), and what transformers refuses gpt_train refuses."""
    llama = tmp / "hf-llama"
    made = sharded("--model", "llama", "--steps", "0", "--export-hf", str(llama))
    t.check("setup: a Llama exported", "exit 0", made, made.rc == 0)

    def edited(name, **changes):
        folder = tmp / name
        shutil.copytree(llama, folder)
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        config = {k: v for k, v in config.items() if v is not None}
        (folder / "config.json").write_text(json.dumps(config))
        return str(folder)

    rope = {"rope_type": "llama3", "rope_theta": 1e4, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    cases = [
        ("HF tie_word_embeddings \"true\" (a string)", edited("hf-string-bool", tie_word_embeddings="true"),
         ("config.json", '"tie_word_embeddings" must be true or false', "a JSON string")),
        ("HF use_sliding_window \"false\" (a string)",
         edited("hf-string-window", model_type="qwen2", use_sliding_window="false"),
         ("config.json", '"use_sliding_window" must be true or false')),
        ("HF config.json without model_type", edited("hf-no-type", model_type=None),
         ("config.json", 'has no "model_type"')),
        ("HF rope_type 7 (a number)", edited("hf-number-type", rope_parameters={"rope_type": 7}),
         ("config.json", '"rope_type" must be a string')),
        ("HF llama3 rope without factor", edited("hf-no-factor", rope_parameters=rope),
         ("config.json", 'needs "factor"')),
    ]
    for name, folder, needles in cases:
        t.fails(name, sharded("--model", "llama", "--init-from-hf", folder), *needles)


def resume_under_other_model_math(t, tmp):
    """--resume refuses a Llama checkpoint under another RoPE or head, naming the setting, the
    given and the saved value (every tensor would load: only the math differs)."""
    ck = tmp / "ck-llama"
    llama = ["--model", "llama", "--save-every", "2", "--checkpoint-dir", str(ck)]
    made = sharded(*llama, "--steps", "2")
    t.check("setup: a Llama checkpoint at step 2", "exit 0", made, made.rc == 0)
    saved = (ck, digest(ck))
    t.fails("--resume, other --rope-theta", sharded(*llama, "--steps", "4", "--resume", "--rope-theta", "20000"),
            "--rope-theta 20000.0 (the checkpoint has 10000.0)", untouched=saved)
    t.fails("--resume, --tie-head added", sharded(*llama, "--steps", "4", "--resume", "--tie-head"),
            "--tie-head true (the checkpoint has false)", untouched=saved)


def one_run_per_checkpoint_dir(t, tmp):
    """A second run into a folder that a live run holds is refused at once, naming the holder;
    the lock of a run that was killed is taken over with a line saying so."""
    busy = tmp / "busy"
    holder = subprocess.Popen([FSDPRUN, "--nproc-per-node", "1", GPT, *gpt_args(
        "--steps", "100000", "--save-every", "1000", "--checkpoint-dir", str(busy))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=BASE_ENV, start_new_session=True)
    lock = busy / "run.lock"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.1)
    try:
        second = sharded("--resume", "auto", "--save-every", "2", "--checkpoint-dir", str(busy))
        t.fails("second run into a held --checkpoint-dir", second, "--checkpoint-dir",
                "is in use by another run", "pid ", str(lock))
        t.check("... refused at once", "within 10 s", second, second.seconds < 10, "too slow")
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # dies holding the lock: its line stays
        holder.wait()
    after = sharded("--resume", "auto", "--save-every", "2", "--checkpoint-dir", str(busy))
    t.check("lock of a killed run", "exit 0, 'took over' naming it", after,
            after.rc == 0 and "took over" in after.output and "pid " in after.output)


def holder_line(pid, pid_start, host=None):
    """A run lock's line as RunLock writes it, naming `pid` on this host (or `host`)."""
    return json.dumps({"host": host or socket.gethostname(), "pid": pid, "pid_start": pid_start,
                       "started": "2020-01-01T00:00:00Z"})


def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def lock_and_pruning(t, tmp, text):
    """The run lock and the pruning touch only their own files: a lock file that is a hard link
    (of --data, or in a `cp -al` snapshot) is refused, never written through; a --checkpoint-dir
    inside another run's checkpoint folder, or holding one, is refused before any work; pruning
    keeps a step folder that holds another run's lock; a lock line with a pid that names no
    process is stale, and what is echoed from it or from a path is escaped and cut; a refused
    --auto leaves no folder behind."""
    root = tmp / "lock-and-pruning"
    root.mkdir()
    orig = root / "orig"
    setup = sharded("--save-every", "2", "--checkpoint-dir", str(orig))
    if setup.rc != 0:
        raise RuntimeError("the lock-and-pruning setup run failed:\n" + setup.output)
    saved = (orig, digest(orig))

    data = root / "data.txt"
    shutil.copy(text, data)
    linked = root / "linked-ck"
    linked.mkdir()
    os.link(data, linked / "run.lock")
    snapshot = root / "snapshot"
    subprocess.run(["cp", "-al", str(orig), str(snapshot)], check=True)
    beside = root / "beside-a-lock"
    beside.mkdir()
    (beside / "run.lock").write_text("")
    outer = root / "outer"
    outer.mkdir()
    shutil.copytree(orig, outer / "inner")
    newline = root / "ck\nnew"
    shutil.copytree(orig, newline)
    long_run = ("--steps", "100000", "--save-every", "2")
    refused = [
        ("ck/run.lock a hard link of --data", ("--data", str(data), *long_run, "--checkpoint-dir", str(linked)),
         ("--checkpoint-dir", "run.lock", "--data", "same file"), (data, digest(data))),
        ("--checkpoint-dir a cp -al snapshot", ("--steps", "4", "--resume", "--save-every", "2",
                                                "--checkpoint-dir", str(snapshot)),
         ("run.lock", "hard link", "cp -al"), saved),
        ("--checkpoint-dir inside another run's step folder",
         (*long_run, "--checkpoint-dir", str(orig / "step-00000002")),
         ("--checkpoint-dir", "lies inside", "checkpoint folder of another run"), saved),
        ("--checkpoint-dir beside another run's run.lock",
         (*long_run, "--checkpoint-dir", str(beside / "mine")), ("lies inside", "run.lock"), None),
        ("--checkpoint-dir holding another run's checkpoint folder",
         (*long_run, "--checkpoint-dir", str(outer)), ("--checkpoint-dir", "holds", "inner"),
         (outer, digest(outer))),
        ("--checkpoint-dir with a newline in its name", (*long_run, "--checkpoint-dir", str(newline)),
         ("ck\\x0anew already holds checkpoints",), None),
        ("refused --auto", ("--auto", "--max-memory-gb", "0.000001", "--save-every", "2",
                            "--checkpoint-dir", str(root / "auto-new")), ("--auto", "no configuration fits"), None),
    ]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: sharded(*c[1], timeout=30), refused))
    for (name, _, needles, untouched), result in zip(refused, results):
        t.fails(name, result, *needles, untouched=untouched)
    by_name = {c[0]: r for c, r in zip(refused, results)}
    snap = by_name["--checkpoint-dir a cp -al snapshot"]
    t.check("... the snapshot not read as in use", "no 'in use'", snap, "in use" not in snap.output)
    t.check("... the data file not written through", "data.txt unchanged, no holder line",
            by_name["ck/run.lock a hard link of --data"], data.read_bytes() == text.read_bytes())
    escaped = by_name["--checkpoint-dir with a newline in its name"]
    t.check("... the newline escaped in its one line", "the error line holds the whole path",
            escaped, any("error" in line and "ck\\x0anew" in line for line in escaped.output.splitlines()))
    t.check("refused --auto: no folder left behind", "auto-new not created", by_name["refused --auto"],
            not (root / "auto-new").exists())

    # Stale lock lines: a pid that names no process, with the pid_start such a pid reads as (-1).
    stale = []
    for name, line in (("pid -1", holder_line(-1, -1)), ("pid 0", holder_line(0, -1)),
                       ("pid 2^40", holder_line(1 << 40, -1)),
                       ("control bytes", holder_line(dead_pid(), 1, "evil\x1b[2J\nnext" + "h" * 3000))):
        folder = root / f"stale {name}"
        folder.mkdir()
        (folder / "run.lock").write_text(line)
        stale.append((name, folder))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: sharded("--save-every", "2", "--checkpoint-dir", str(c[1])), stale))
    for (name, _), result in zip(stale, results):
        took_over = [line for line in result.output.splitlines() if "took over" in line]
        if name == "control bytes":
            t.check("stale lock line with control bytes", "taken over, escaped, one line < 1000 bytes",
                    result, result.rc == 0 and "\x1b" not in result.output and len(took_over) == 1
                    and "evil\\x1b[2J\\x0anext" in took_over[0] and len(took_over[0]) < 1000)
        else:
            t.check(f"stale lock, {name}, pid_start -1", "exit 0, taken over", result,
                    result.rc == 0 and len(took_over) == 1)

    # Pruning: a run saving every step (each save stalled 1.5 s) keeps 2 step folders; another
    # run's lock placed in its oldest one, once published, keeps that folder from being pruned.
    pruned = root / "pruned"
    proc = subprocess.Popen([FSDPRUN, "--nproc-per-node", "1", GPT, *gpt_args(
        "--steps", "3", "--save-every", "1", "--test-pause-after-shard-files", "1500",
        "--checkpoint-dir", str(pruned))], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="replace", env=BASE_ENV, stdin=subprocess.DEVNULL, start_new_session=True)
    start = time.monotonic()
    latest = pruned / "latest"
    while time.monotonic() - start < 30 and proc.poll() is None and not latest.exists():
        time.sleep(0.02)
    planted = latest.exists() and latest.read_text().strip() == "step-00000001"
    if planted:
        (pruned / "step-00000001" / "run.lock").write_text(holder_line(dead_pid(), 1))
    try:
        out, _ = proc.communicate(timeout=60)
        result = Run(proc.returncode, time.monotonic() - start, out)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        result = Run("hang", time.monotonic() - start, proc.communicate()[0])
    t.check("pruning keeps a step folder holding another run's lock", "exit 0, step-1 kept, warned",
            result, planted and result.rc == 0 and (pruned / "step-00000001" / "run.lock").exists()
            and "not removing" in result.output and (pruned / "step-00000003").is_dir(),
            "" if planted else "the lock could not be planted before step 1's folder was pruned")


def lone_ranks_give_up_in_time(t):
    """A rank whose peers never come gives up within FSDP_TIMEOUT_SECONDS (plus start-up), with
    one line naming the rendezvous and no backtrace: rank 0 alone, rank 1 alone, and fsdprun's
    node 1 of 2 alone."""
    timeout = 5
    for rank in (0, 1):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
               "FSDP_TIMEOUT_SECONDS": str(timeout)}
        alone = run([GPT, *gpt_args()], env=env, timeout=60)
        t.fails(f"RANK={rank} of 2 alone, FSDP_TIMEOUT_SECONDS={timeout}", alone, f"rank {rank}",
                "rendezvous", "FSDP_TIMEOUT_SECONDS")
        t.check(f"... gives up in time", f"< {timeout + 5} s, one error line", alone,
                alone.seconds < timeout + 5 and alone.output.count("error") == 1,
                f"{alone.seconds:.1f} s, {alone.output.count('error')} error lines")
    # c10d's own wait for the workers counted whole seconds: 0.5 s became 1 s, said to be 0.5 s.
    short = 0.5
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "FSDP_TIMEOUT_SECONDS": str(short)}
    alone = run([GPT, *gpt_args()], env=env, timeout=60)
    waited = re.search(r"after ([0-9.]+) s \(FSDP_TIMEOUT_SECONDS", alone.output)
    t.check(f"RANK=0 of 2 alone, FSDP_TIMEOUT_SECONDS={short}", "exit != 0, says it waited <= the timeout",
            alone, alone.rc not in (0, "hang") and waited is not None
            and float(waited.group(1)) <= short + 0.1 <= alone.seconds + 0.1,
            f"waited {waited.group(1) if waited else '(not said)'} s, {alone.seconds:.1f} s in all")
    node1 = run([FSDPRUN, "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1",
                 "--master-addr", "127.0.0.1", "--master-port", str(free_port()), GPT, *gpt_args()],
                env={"FSDP_TIMEOUT_SECONDS": str(timeout)}, timeout=60)
    t.fails("fsdprun --nnodes 2 --node-rank 1 alone", node1, "rank 1", "rendezvous")
    t.check("... gives up in time", f"< {timeout + 5} s", node1, node1.seconds < timeout + 5,
            f"{node1.seconds:.1f} s")


def started_by_hand(t):
    """No launcher's variable: the program is one rank, its store on a port the OS picks (two at
    once do not collide); one variable alone is still an error naming the missing ones."""
    with ThreadPoolExecutor(2) as pool:
        alone = list(pool.map(lambda _: run([GPT, *gpt_args()], timeout=60), (0, 1)))
    for i, result in enumerate(alone):
        t.check(f"no launcher's variable, run {i + 1} of 2 at once", "exit 0, one rank", result,
                result.rc == 0 and "error" not in result.output.lower())
    t.fails("MASTER_PORT alone (no launcher)", run([GPT, *gpt_args()], env={"MASTER_PORT": "1"}),
            "RANK", "MASTER_ADDR", "not set")


def port_of_a_running_job(t):
    """A second job given the MASTER_PORT of a job that is running: its ranks say so (not 'another
    process also has RANK=1')."""
    port = str(free_port())
    env = lambda r: {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "FSDP_TIMEOUT_SECONDS": "10"}
    first = [subprocess.Popen([GPT, *gpt_args("--steps", "100000", "--log-every", "1")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**BASE_ENV, **env(r)}, start_new_session=True) for r in (0, 1)]
    try:
        first[0].stdout.readline()  # the first job trains
        with ThreadPoolExecutor(2) as pool:
            second = list(pool.map(lambda r: run([GPT, *gpt_args()], env(r), 40), (0, 1)))
    finally:
        for proc in first:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    t.fails("second job on a running job's MASTER_PORT (rank 1)", second[1], "MASTER_PORT " + port,
            "in use by another job")
    t.check("... and its rank 0", "exit != 0 naming the port", second[0],
            second[0].rc not in (0, "hang") and port in second[0].output)


def cases(t):
    with tempfile.TemporaryDirectory(prefix="bad_input_") as tmp:
        tmp = Path(tmp)
        text = tmp / "text.txt"
        make_text(text, 64 << 10)
        DATA[:] = ["--data", str(text)]

        # ---- flags checked before any work: one process each, two at a time. "--flag:" is how
        # the check of the flag's value starts (a later failure that merely mentions it differs).
        flag_cases = [
            ("--batch 0", ["--batch", "0"], "--batch:"),
            ("--batch -5", ["--batch", "-5"], "--batch:"),
            ("--steps -1", ["--steps", "-1"], "--steps:"),
            ("--lr inf", ["--lr", "inf"], "--lr:"),
            ("--lr nan", ["--lr", "nan"], "--lr:"),
            ("--clip nan", ["--clip", "nan"], "--clip:"),
            ("--warmup-steps -3", ["--warmup-steps", "-3"], "--warmup-steps:"),
            ("--log-every 0", ["--log-every", "0"], "--log-every:"),
            ("--max-data-mb -1", ["--max-data-mb", "-1"], "--max-data-mb:"),
            ("--max-data-mb 1e12", ["--max-data-mb", "1000000000000"], "--max-data-mb:"),
            ("--seed -1", ["--seed", "-1"], "--seed:"),
            ("--heads 3 (dim 16)", ["--heads", "3"], "--heads"),
            ("--layers 0", ["--layers", "0"], "--layers:"),
            ("--seq 1", ["--seq", "1"], "--seq:"),
            ("--weight-decay -1", ["--weight-decay", "-1"], "--weight-decay:"),
            ("--grad-accum 0", ["--grad-accum", "0"], "--grad-accum:"),
            ("--sample -1", ["--sample", "-1"], "--sample:"),
            ("--loss-scale inf", ["--param-dtype", "fp16", "--loss-scale", "inf"], "--loss-scale:"),
            ("--max-nonfinite-steps 0", ["--max-nonfinite-steps", "0"], "--max-nonfinite-steps:"),
            ("--world-size without --reference", ["--world-size", "2"], "--world-size"),
            ("--save-every without --checkpoint-dir", ["--save-every", "2"], "--checkpoint-dir"),
            ("--checkpoint-dir alone", ["--checkpoint-dir", str(tmp / "unused")], "--save-every"),
            ("--resume without --checkpoint-dir", ["--resume"], "--checkpoint-dir"),
            ("--resume bogus", ["--resume", "bogus", "--checkpoint-dir", str(tmp)], "--resume"),
            ("--metrics in a missing folder", ["--metrics", str(tmp / "no/m.jsonl")], "--metrics"),
            ("--save-full is a folder", ["--save-full", str(tmp)], "--save-full"),
            ("--init-from missing", ["--init-from", str(tmp / "nope.pt")], "--init-from"),
            ("--data missing", ["--data", str(tmp / "nope.txt")], "--data"),
            ("--dim 65536 --layers 1024", ["--dim", "65536", "--layers", "1024"], "--layers/--dim"),
            ("--seq 1048576 --batch 4096", ["--seq", "1048576", "--batch", "4096"], "--seq/--batch"),
            ("--data /dev/zero", ["--data", "/dev/zero", "--max-data-mb", "1"], ("--data", "not a regular file")),
            ("--data /dev/urandom", ["--data", "/dev/urandom"], ("--data", "not a regular file")),
            ("--freeze matching nothing", ["--freeze", "h.0.atn"], ("--freeze 'h.0.atn'", "matches no parameter")),
            ("--freeze h.0 with --deferred-init", ["--freeze", "h.0.attn", "--deferred-init"],
             ("--freeze 'h.0.attn'", "relative to a block")),
            ("--freeze . (every parameter)", ["--freeze", "."],
             ("--freeze '.'", "every parameter", "nothing would train")),
            ("--tp-sizes without --auto", ["--tp-sizes", "1,2"], ("--tp-sizes", "--plan or --auto")),
            ("--batches without --auto", ["--batches", "1,2"], ("--batches", "--plan or --auto")),
            ("--auto --batches", ["--auto", "--max-memory-gb", "1", "--batches", "1,2"],
             ("--batches", "--auto tries the divisors of --batch")),
            ("--device gpu", ["--device", "gpu"], "--device:"),
            ("--cpu-offload with --device cpu", ["--cpu-offload"], ("--cpu-offload", "--device cuda")),
            ("--cpu-offload with --reference", ["--reference", "--cpu-offload"],
             ("--cpu-offload", "not --reference")),
            ("--optimizer adam", ["--optimizer", "adam"], "--optimizer:"),
            ("--muon-lr nan", ["--optimizer", "muon", "--muon-lr", "nan"], "--muon-lr:"),
            ("--adjust-lr bogus", ["--optimizer", "muon", "--adjust-lr", "bogus"], "--adjust-lr:"),
            ("--muon-lr without --optimizer muon", ["--muon-lr", "0.02"],
             ("--muon-lr", "--optimizer muon only")),
            ("--adjust-lr without --optimizer muon", ["--adjust-lr", "original"],
             ("--adjust-lr", "--optimizer muon only")),
            ("--tp 3 with 2 heads", ["--tp", "3"], ("--tp 3", "--heads (the query heads) = 2")),
            ("--tp 2 with --reference", ["--tp", "2", "--reference"], ("--tp", "--world-size WORLD/tp")),
            ("--tp 2 with --sample", ["--tp", "2", "--sample", "10"], ("--tp", "--sample")),
            ("--tp 2 on one rank", ["--tp", "2"], ("--tp 2 does not divide the 1 ranks",)),
            *bad_input_pipeline.flag_cases(tmp),  # gpt_train --pp
        ]
        fifo = tmp / "fifo"
        os.mkfifo(fifo)
        flag_cases.append(("--data FIFO", ["--data", str(fifo)], ("--data", "not a regular file")))
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda c: sharded(*c[1], timeout=30), flag_cases))
        for (name, _, needles), result in zip(flag_cases, results):
            t.fails(name, result, *((needles,) if isinstance(needles, str) else needles))

        gpu_flags_without_a_gpu(t)
        outputs_onto_inputs(t, tmp, text)
        per_rank_outputs(t, tmp)
        data_folder_with_an_unreadable_file(t, tmp, text)
        hf_config_too_large(t, tmp)
        hf_config_readings(t, tmp)
        resume_under_other_model_math(t, tmp)
        token_file_messages(t, tmp)
        one_run_per_checkpoint_dir(t, tmp)
        lock_and_pruning(t, tmp, text)
        started_by_hand(t)
        lone_ranks_give_up_in_time(t)
        port_of_a_running_job(t)
        step_in_backward_where_it_cannot_apply(t)
        auto_keeps_its_cap(t)
        tensor_parallel_messages(t, tmp)
        fault_tolerant_messages(t)
        bad_input_pipeline.under_sharding(t, sharded)

        # ---- checkpoints: a good one at step 6 (step-4 kept too) must survive every case ----
        ck = tmp / "ck"
        good = sharded("--steps", "6", "--save-every", "2", "--checkpoint-dir", str(ck))
        t.check("setup: 6 steps, --save-every 2", "exit 0, latest = step-6", good,
                good.rc == 0 and (ck / "latest").read_text().strip() == "step-00000006"
                if (ck / "latest").exists() else False)
        if good.rc != 0:
            raise RuntimeError("the setup run failed:\n" + good.output)
        saved = (ck, digest(ck))
        ckpt = ["--save-every", "2", "--checkpoint-dir", str(ck)]
        t.fails("fresh run into a checkpoint dir", sharded("--steps", "6", *ckpt),
                "--resume", str(ck), untouched=saved)
        t.fails("--batch 0 --resume --save-every 2", sharded(
            "--batch", "0", "--steps", "10", "--resume", *ckpt), "--batch:", untouched=saved)
        t.fails("--resume, other --heads", sharded(
            "--heads", "4", "--steps", "10", "--resume", *ckpt), "--heads", untouched=saved)
        t.fails("--resume, other --seed", sharded(
            "--seed", "5", "--steps", "10", "--resume", *ckpt), "--seed", untouched=saved)
        t.fails("--resume, --steps below the checkpoint", sharded(
            "--steps", "4", "--resume", *ckpt), "--steps", untouched=saved)
        at_end = sharded("--steps", "6", "--resume", *ckpt)
        t.check("--resume at the last step (--steps 6)", "exit 0, nothing trained, dir intact", at_end,
                at_end.rc == 0 and "nothing left to train" in at_end.output and digest(ck) == saved[1])
        t.fails("--resume, missing dir", sharded(
            "--resume", "--checkpoint-dir", str(tmp / "missing")), "does not exist",
            "--resume")
        a_file = tmp / "a_file"
        a_file.write_text("not a folder\n")
        t.fails("--resume, dir is a file", sharded(
            "--resume", "--checkpoint-dir", str(a_file)), "--checkpoint-dir", "is a file")
        t.fails("--save-every, dir is a file", sharded(
            "--save-every", "2", "--checkpoint-dir", str(a_file)), "--checkpoint-dir",
            "is a file")
        t.fails("--save-every, dir below a file", sharded(
            "--save-every", "2", "--checkpoint-dir", str(a_file / "sub")), "--checkpoint-dir",
            "not a writable folder")
        empty = tmp / "empty"
        empty.mkdir()
        t.fails("--resume, empty dir", sharded(
            "--resume", "--checkpoint-dir", str(empty)), "no complete checkpoint")
        auto = sharded("--resume", "auto", "--save-every", "2", "--checkpoint-dir",
                       str(tmp / "auto"))
        t.check("--resume auto, missing dir", "exit 0, says it starts at step 0", auto,
                auto.rc == 0 and "starting at step 0" in auto.output and
                (tmp / "auto" / "latest").exists())
        # A save killed while publishing left latest.tmp.PID of a process that is gone.
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = ck / f"latest.tmp.{dead.pid}"
        stale.write_text("step-00000004\n")
        resumed = sharded("--steps", "8", "--resume", *ckpt)
        t.check("stale latest.tmp.<dead pid>, --resume", "exit 0, tmp removed, step 8 published",
                resumed, resumed.rc == 0 and not stale.exists() and
                (ck / "latest").read_text().strip() == "step-00000008")

        # ---- NaN: stop after --max-nonfinite-steps, no checkpoint of a NaN model ----
        init = tmp / "init.pt"
        made = run([GPT, "--reference", *gpt_args("--steps", "0", "--save-full", str(init))])
        import torch  # the interpreter that runs this test has torch (TORCH_PYTHON)
        params = torch.load(init)
        params["ln_f.weight"] = torch.full_like(params["ln_f.weight"], float("nan"))
        nan_init = tmp / "nan.pt"
        torch.save(params, nan_init)
        nan_ck = tmp / "nan_ck"
        nan = sharded("--steps", "8", "--init-from", str(nan_init), "--save-every", "1",
                      "--checkpoint-dir", str(nan_ck))
        t.fails("NaN loss (--init-from with NaN)", nan, "--max-nonfinite-steps")
        t.check("... and no checkpoint of the NaN model", "nan_ck holds no step folder", nan,
                made.rc == 0 and not list(nan_ck.glob("step-*")))
        nan1 = sharded("--steps", "8", "--init-from", str(nan_init),
                       "--max-nonfinite-steps", "1", "--save-full", str(tmp / "out.pt"))
        t.fails("NaN, --max-nonfinite-steps 1, --save-full", nan1, "nan", "--max-nonfinite-steps")
        t.check("... and no --save-full of the NaN model", "out.pt not written", nan1,
                not (tmp / "out.pt").exists())

        # ---- --init-from: a damaged tensor, a file that is no torch.save at all ----
        import zipfile
        blob = bytearray(init.read_bytes())
        with zipfile.ZipFile(init) as z:  # the first tensor record's bytes: flip one in the middle
            info = next(i for i in z.infolist() if re.search(r"/data/\d+$", i.filename))
        header = info.header_offset
        name_len, extra_len = (int.from_bytes(blob[header + k:header + k + 2], "little")
                               for k in (26, 28))
        blob[header + 30 + name_len + extra_len + info.file_size // 2] ^= 0x40
        corrupt = tmp / "corrupt.pt"
        corrupt.write_bytes(bytes(blob))
        t.fails("--init-from, one tensor corrupted", sharded(
            "--init-from", str(corrupt)), "CRC-32", "corrupt.pt")
        truncated = tmp / "truncated.pt"
        truncated.write_bytes(init.read_bytes()[:3000])
        t.fails("--init-from, truncated", sharded("--init-from", str(truncated)),
                "truncated.pt", "not a readable torch.save file")
        t.fails("--init-from, a text file", sharded(
            "--init-from", str(text)), "not a readable torch.save file")

        # ---- --data: reads no more than --max-data-mb ----
        big = tmp / "big.txt"
        with open(big, "w") as f:
            line = "the quick brown fox jumps over the lazy dog " * 4 + "\n"
            f.write(line * ((48 << 20) // len(line)))
        rss = [sys.executable, "-c",
               "import resource, subprocess, sys; subprocess.run(sys.argv[1:]); "
               "print('maxrss_kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"]
        small_run = run([*rss, GPT, "--reference", *gpt_args("--steps", "0")])
        big_run = run([*rss, GPT, "--reference", *gpt_args("--steps", "0", "--data", str(big),
                                                            "--max-data-mb", "1")])
        kb = [int(r.output.split("maxrss_kb")[-1]) if "maxrss_kb" in r.output else 0
              for r in (small_run, big_run)]
        big_run.output = f"peak RSS {kb[1] // 1024} MiB vs {kb[0] // 1024} MiB on 64 KiB\n" + big_run.output
        t.check("48 MiB file, --max-data-mb 1", "peak RSS < small file's + 16 MiB", big_run,
                big_run.rc == 0 and 0 < kb[1] < kb[0] + (16 << 10), "reads past --max-data-mb")

        # ---- sampling ----
        empty_prompt = sharded("--sample", "8", "--prompt", "")
        t.check("--prompt '' --sample 8", "exit 0, a sample", empty_prompt,
                empty_prompt.rc == 0 and "--- sample ---" in empty_prompt.output)
        utf8 = sharded("--sample", "4", "--prompt", "é→")
        t.check("--prompt with bytes >= 128", "exit 0, a sample", utf8,
                utf8.rc == 0 and "--- sample ---" in utf8.output)

        # ---- the launcher and the environment ----
        t.fails("fsdprun --grace-seconds nan", run([FSDPRUN, "--nproc-per-node", "1", "--grace-seconds",
                                                    "nan", "true"]), "--grace-seconds")
        t.fails("fsdprun --grace-seconds 1e7", run([FSDPRUN, "--nproc-per-node", "1", "--grace-seconds",
                                                    "1e7", "true"]), "--grace-seconds")
        t.fails("fsdprun --nproc-per-node 100000", run([FSDPRUN, "--nproc-per-node", "100000", "true"]),
                "--nproc-per-node")
        stopped = run([FSDPRUN, "--nproc-per-node", "2", "--grace-seconds", "1", "sh", "-c",
                       'if [ "$RANK" = 1 ]; then kill -STOP $$; else sleep 0.5; exit 1; fi'], timeout=30)
        t.check("fsdprun: a stopped rank, rank 0 fails", "exit != 0 within the grace period",
                stopped, stopped.rc not in (0, "hang") and stopped.seconds < 10 and
                "rank 0 exited with status 1" in stopped.output)
        for value in ("1e10", "nan", "abc", "0", "-5"):
            t.fails(f"FSDP_TIMEOUT_SECONDS={value}", sharded(
                env={"FSDP_TIMEOUT_SECONDS": value}), "FSDP_TIMEOUT_SECONDS")
        t.fails("OMP_NUM_THREADS=abc", sharded(env={"OMP_NUM_THREADS": "abc"}),
                "OMP_NUM_THREADS")
        t.fails("FSDP_CPU_COLLECTIVES=bogus", sharded(n=2, env={"FSDP_CPU_COLLECTIVES": "bogus"}),
                "FSDP_CPU_COLLECTIVES", "shm", "ring")
        t.fails("WORLD_SIZE=0 (no launcher)", run([GPT, *gpt_args()], env={
            "RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}), "WORLD_SIZE")

        # A RANK used twice at W=3: the duplicate is named, the others name the missing rank.
        port = str(free_port())
        env = lambda r: {"RANK": str(r), "WORLD_SIZE": "3", "LOCAL_RANK": str(r),
                         "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                         "FSDP_TIMEOUT_SECONDS": "4"}
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(run, [GPT, *gpt_args()], env(r), 40) for r in (0, 1, 1)]
            ranks = [f.result() for f in futures]
        joined = Run(max((r.rc for r in ranks), key=lambda rc: rc == 0 or rc == "hang"),
                     max(r.seconds for r in ranks), "\n".join(r.output for r in ranks))
        t.fails("RANK=1 twice at W=3", joined, "RANK=1", "rank(s) 2")
        t.check("... every rank exits non-zero", "3 non-zero exits", joined,
                all(r.rc not in (0, "hang") for r in ranks))

        # A peer that dies: the survivor's error says a peer died, without a backtrace; over the
        # shared-memory collectives (the default on one host) and over Gloo's ring.
        peer_killed_mid_training(t, "peer killed mid-training (survivor)", {})
        peer_killed_mid_training(t, "peer killed mid-training, ring (survivor)",
                                 {"FSDP_CPU_COLLECTIVES": "ring"})


def peer_killed_mid_training(t, name, extra_env):
    port = str(free_port())
    env2 = lambda r: {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r),
                      "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                      "FSDP_TIMEOUT_SECONDS": "10", **extra_env}
    procs = [subprocess.Popen([GPT, *gpt_args("--steps", "100000", "--log-every", "1")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**BASE_ENV, **env2(r)}, start_new_session=True)
             for r in (0, 1)]
    start = time.monotonic()
    first = procs[0].stdout.readline()  # rank 0's first progress line: training runs
    procs[1].kill()
    try:
        out, _ = procs[0].communicate(timeout=30)
        rc = procs[0].returncode
    except subprocess.TimeoutExpired:
        os.killpg(procs[0].pid, signal.SIGKILL)
        out, rc = procs[0].communicate()[0] + "\nHANG", "hang"
    procs[1].wait()
    # The shared-memory collectives name the rank they wait for ("waiting for rank 1 on HOST): it
    # exited"); over Gloo the address is rank 1's listening port ("(rank 1)") or the far end of a
    # connection rank 1 opened ("one of rank(s) 1"), depending on which side connected.
    died = Run(rc, time.monotonic() - start, first + out)
    named = ("waiting for rank 1 " in out or "(rank 1)" in out or "one of rank(s) 1 " in out)
    t.check(name, "error naming rank 1", died, rc not in (0, "hang") and named,
            "the survivor does not name rank 1")

if __name__ == "__main__":
    main()
