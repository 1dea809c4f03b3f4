"""Where the CPU work of one training step goes, per rank and per thread: fsdp-cpp at W = 2 against
the unsharded floor (gpt_train --reference --world-size 1, one rank's batch), on one configuration.

Run from the repository root:

    .venv/bin/python bench/cpu_breakdown.py [--config small|medium|deep] [--before OLD.json] [--out DIR]

Three measurements, each of the same step after warm-up:
1. callgrind (instruction counts: repeatable on a noisy machine). Every process runs under
   `valgrind --tool=callgrind --separate-threads=yes --dump-before=fsdp::reset_peak_memory(...)`,
   which gpt_train calls at the start of each step, so the compute thread's dump k+2 holds exactly
   step k. A dump so triggered writes only the thread that triggered it: every other thread
   (FSDP's communication thread, Gloo's threads) is counted over the whole run, divided by the
   number of steps (the communication thread works only in steps; Gloo's loop also carries the
   set-up's few collectives and the final gather of the parameters). Per thread, the inclusive
   instructions of the functions that make up a step (forward, backward, optimizer, FSDP's hooks,
   copies, the ring's sends, receives and adds, allocator calls) and the thread's top functions by
   own instructions. Blocking waits cost no instructions, busy waits do; kernel work (socket
   copies, page faults) is not counted: see 2.
2. perf (CPU time, user and kernel): `perf record -e cpu-clock` of two native runs that differ
   only in their number of steps; the difference over the extra steps is the CPU time of one step,
   per thread class, split into user and kernel time.
3. the Chrome trace (gpt_train --trace) of one step: wall time of forward, backward and the
   communication thread's all-gathers and reduce-scatters, and the time the compute thread was
   blocked (the trace's `compute waits` lane: all-gathers, reduce-scatters, the rate limiter).

Writes DIR/cpu-breakdown.md (the command at its top) and DIR/cpu-breakdown.json (DIR defaults to
bench/results; another configuration than small: cpu-breakdown-CONFIG.*). With --before, the tables also show the numbers of an earlier JSON. The processes
run with OMP_NUM_THREADS=1, as in run_bench.py. Takes ~10 minutes for small (callgrind runs
~50x slower than native); medium takes much longer (--skip-callgrind for perf and trace only).
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "bin")
CONFIGS = {
    "small": dict(layers=4, dim=128, heads=4, seq=128, batch=8, perf_steps=(4, 14)),
    "medium": dict(layers=8, dim=512, heads=8, seq=256, batch=4, perf_steps=(3, 7)),
    "deep": dict(layers=48, dim=32, heads=2, seq=16, batch=1, perf_steps=(40, 240)),
}
MEASURED_STEP = 0  # --step; callgrind runs MEASURED_STEP + 2 steps (the last one ends with the teardown)
STEP_MARK = "fsdp::reset_peak_memory(c10::Device*"  # called by gpt_train first thing in each step

# (label, function whose inclusive instructions it counts); indented labels are part of the one above.
COMPUTE_ROWS = [
    ("forward (model; blocks' FSDP hooks included)", "gpt::GPTImpl::forward"),
    ("  FSDP pre_forward: publish (root), unshard, wait for the all-gather", "fsdp::detail::pre_forward"),
    ("  FSDP post_forward: reshard, register hooks", "fsdp::ParamGroup::post_forward"),
    ("loss (cross entropy)", "gpt::lm_loss"),
    ("backward (autograd engine)", "torch::autograd::Engine::execute"),
    ("  AccumulateGrad (gradient into .grad)", "torch::autograd::AccumulateGrad::apply"),
    ("  FSDP pre_backward: unshard, prefetch, wait", "fsdp::FsdpState::backward_reached"),
    ("    the unsharded gradient: allocation, padding", "fsdp::FlatParam::begin_full_grad"),
    ("  FSDP post_backward: reshard, issue the reduce-scatter", "fsdp::ParamGroup::post_backward"),
    ("  FSDP finish_backward: complete the reductions", "fsdp::ParamGroup::finish_backward"),
    ("zero_grad", "torch::optim::Optimizer::zero_grad"),
    ("optimizer step (fused AdamW, gpt_train's default)", "fsdp::optim::AdamW::step"),
    ("loss all-reduce", "fsdp::all_reduce_sum"),
    ("allocator: c10::alloc_cpu", "c10::alloc_cpu"),
    ("allocator: c10::free_cpu", "c10::free_cpu"),
]
COMM_ROWS = [
    ("all-gather task (copy-in + ring)", "fsdp::gather_unit"),
    ("  ring all-gather", "fsdp::(anonymous namespace)::RingCollectives::all_gather"),
    ("reduce task (cast, divide, ring, copy-out)", "fsdp::reduce_unit_gradient"),
    ("  ring reduce-scatter (exchanges + adds)", "fsdp::(anonymous namespace)::RingCollectives::reduce_scatter_sum"),
    ("ring exchanges, both kinds (Gloo send + recv + waits)", "fsdp::(anonymous namespace)::RingCollectives::exchange"),
    ("  Gloo send (post)", "c10d::ProcessGroupGloo::send"),
    ("  Gloo recv (post)", "c10d::ProcessGroupGloo::recv"),
    ("allocator: c10::alloc_cpu", "c10::alloc_cpu"),
    ("allocator: c10::free_cpu", "c10::free_cpu"),
]
# Which thread a callgrind thread is, from a function only it runs.
THREAD_MARKERS = [
    ("compute", "main"),
    ("comm", "fsdp::WorkerThread::run"),
    ("gloo_tcp_loop", "gloo::transport::tcp::Loop::run"),
    ("gloo_worker", "c10d::ProcessGroupGloo::runLoop"),
    ("store (libuv)", "c10d::detail::LibUVStoreDaemon::run"),
]
TOP_SELF = 12


def log(msg):
    print(f"[cpu_breakdown] {msg}", flush=True)


def model_args(c):
    return ["--layers", str(c["layers"]), "--dim", str(c["dim"]), "--heads", str(c["heads"]),
            "--seq", str(c["seq"]), "--batch", str(c["batch"]), "--lr", "1e-3", "--seed", "1234",
            "--data", DATA]


# A small text file: the data only chooses the tokens, and a large corpus takes minutes to load
# under valgrind.
DATA = os.path.join(os.path.dirname(os.__file__), "os.py")


def commands(kind, c, steps, extra=()):
    train = [os.path.join(BIN, "gpt_train")] + model_args(c) + ["--steps", str(steps)] + list(extra)
    if kind == "floor":
        return train + ["--reference", "--world-size", "1"]
    return [os.path.join(BIN, "fsdprun"), "--nproc-per-node", "2", "--"] + train


def env():
    extra = {"FSDP_CPU_COLLECTIVES": COLLECTIVES} if COLLECTIVES else {}
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", FSDP_TIMEOUT_SECONDS="1800", **extra)


COLLECTIVES = None  # --collectives: FSDP_CPU_COLLECTIVES for the cpp runs (None: the default)


def run(cmd, log_path, prefix=()):
    """Runs cmd (under `prefix` for each rank: fsdprun passes the ranks' program through)."""
    if prefix:
        cut = cmd.index("--") + 1 if "--" in cmd else 0
        cmd = cmd[:cut] + list(prefix) + cmd[cut:]
    with open(log_path, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env(), cwd=ROOT)
    if proc.returncode != 0:
        with open(log_path) as f:
            sys.exit(f"[cpu_breakdown] FAILED ({proc.returncode}): {' '.join(cmd)}\n{f.read()[-3000:]}")


def snapshot_binaries(source, work):
    """Runs copies, so that a rebuild meanwhile cannot mix two versions of the code (the library is
    linked statically)."""
    global BIN
    os.makedirs(os.path.join(work, "bin"), exist_ok=True)
    for name in ("gpt_train", "fsdprun"):
        if os.path.abspath(source) != os.path.abspath(os.path.join(work, "bin")):
            shutil.copy2(os.path.join(source, name), os.path.join(work, "bin", name))
    BIN = os.path.join(work, "bin")


# ---------------------------------------------------------------- callgrind


def annotate(path, inclusive):
    out = subprocess.run(["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
                          "--threshold=100", path], capture_output=True, text=True).stdout
    costs, total = {}, 0
    for line in out.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(.*)$", line)
        if not m:
            continue
        value, rest = int(m.group(1).replace(",", "")), m.group(2).strip()
        if rest.startswith("PROGRAM TOTALS"):
            total = value
            continue
        rest = re.sub(r"\s+\[[^\]]*\]$", "", rest)  # the object file
        function = rest.split(":", 1)[1] if ":" in rest else rest
        costs[function] = costs.get(function, 0) + value
    return total, costs


def matching(costs, name):
    """Inclusive cost of `name` (a function, or a prefix ending before its argument list)."""
    best = 0
    for function, value in costs.items():
        if function == name or function.startswith(name + "(") or function.startswith(name + "<"):
            best = max(best, value)
    return best


def callgrind(kind, c, work):
    steps = MEASURED_STEP + 2
    base = os.path.join(work, f"cg-{kind}")
    if any(re.search(r"\.\d+-01$", path) for path in glob.glob(f"{base}.*")):
        return analyse_callgrind(base)  # --work DIR holds a finished run: analyse it again
    prefix = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--dump-before={STEP_MARK}",
              f"--callgrind-out-file={base}.%p"]
    cmd = commands(kind, c, steps)
    if kind == "floor":
        cmd = prefix + cmd
        run(cmd, base + ".log")
    else:
        run(cmd, base + ".log", prefix=prefix)
    return analyse_callgrind(base)


def steps_of_run(path):
    """The --steps of the command a callgrind file profiled (its header's cmd: line)."""
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("cmd:"):
                return int(re.search(r"--steps (\d+)", line).group(1))
    raise SystemExit(f"[cpu_breakdown] no cmd: line in {path}")


def analyse_callgrind(base):
    """Per process, per thread: the compute thread's dump of the measured step (BASE.PID.PART-01:
    the step's own dump is made when the next step starts, and the set-up may dump more than once,
    so parts are counted back from the last one); any other thread's only dump, at exit
    (BASE.PID-TID), divided by the run's steps."""
    found = [(re.search(r"\.(\d+)(?:\.(\d+))?-(\d+)$", path), path) for path in glob.glob(f"{base}.*-*")]
    found = [(m.group(1), m.group(2), int(m.group(3)), path) for m, path in found if m]
    processes = {}
    for pid, dump, thread, path in sorted(found, key=lambda f: f[3]):
        steps = steps_of_run(path)
        last_part = max(int(d) for p, d, t, _ in found if p == pid and d is not None and t == 1)
        part = last_part - (steps - 2 - MEASURED_STEP)
        compute_step = thread == 1 and dump is not None and int(dump) == part
        other_whole_run = thread != 1 and dump is None
        if not (compute_step or other_whole_run):
            continue
        scale = 1 if thread == 1 else steps
        total, inclusive = annotate(path, inclusive=True)
        if total == 0:
            continue
        _, own = annotate(path, inclusive=False)
        name = next((label for label, marker in THREAD_MARKERS if matching(inclusive, marker)),
                    f"thread {thread}")
        # In a dump taken mid-run, callgrind_annotate gives the frames below the trigger (main and
        # its callers) the whole cost as their own: left out.
        top = sorted(((fn, v) for fn, v in own.items() if v < total),
                     key=lambda kv: -kv[1])[:TOP_SELF]
        threads = processes.setdefault(pid, {})
        if name in threads:  # a second thread of the same kind (Gloo's two workers): added up
            name += " (2nd)"
        threads[name] = {
            "total": total // scale,
            "rows": {fn: matching(inclusive, fn) // scale for _, fn in COMPUTE_ROWS + COMM_ROWS},
            "top_self": [(fn, v // scale) for fn, v in top],
            "per_step_from": "the measured step" if scale == 1 else f"the whole run / {steps}",
        }
    ranks = [processes[p] for p in sorted(processes, key=int)]
    if not ranks:
        sys.exit(f"[cpu_breakdown] no callgrind dump {part} of {base} (see {base}.log)")
    return ranks


# ---------------------------------------------------------------- perf


def perf_cpu(kind, c, work):
    """CPU milliseconds of one step per thread class, user and kernel, per process."""
    n1, n2 = c["perf_steps"]
    per_run = []
    for steps in (n1, n2):
        data = os.path.join(work, f"perf-{kind}-{steps}.data")
        run(["perf", "record", "-q", "-e", "cpu-clock", "-c", "1000000", "-o", data, "--"]
            + commands(kind, c, steps), data + ".log")
        script = subprocess.run(["perf", "script", "-i", data, "-F", "pid,tid,comm,ip,dso"],
                                capture_output=True, text=True).stdout
        counts = {}
        for line in script.splitlines():
            m = re.match(r"^\s*(.+?)\s+(\d+)/(\d+)\s+[0-9a-f]+\s+\((.*)\)\s*$", line)
            if not m:
                continue
            comm, pid, tid, dso = m.group(1), m.group(2), m.group(3), m.group(4)
            if comm in ("fsdprun", "perf", "perf-exec"):
                continue
            if comm == "gpt_train":
                thread = "compute" if pid == tid else "comm"
            elif comm == "fsdp_comm":
                thread = "comm"
            else:
                thread = comm
            mode = "kernel" if "kernel" in dso else "user"
            counts[(thread, mode)] = counts.get((thread, mode), 0) + 1
        per_run.append(counts)
    processes = 1 if kind == "floor" else 2
    keys = set(per_run[0]) | set(per_run[1])
    out = {}
    for thread, mode in keys:
        ms = (per_run[1].get((thread, mode), 0) - per_run[0].get((thread, mode), 0)) / (n2 - n1)
        out.setdefault(thread, {})[mode] = round(ms / processes, 2)  # 1 sample = 1 ms
    return out


# ---------------------------------------------------------------- trace


def trace_summary(c, work):
    pattern = os.path.join(work, "trace-{rank}.json")
    run(commands("cpp", c, 4, ["--trace", pattern]), os.path.join(work, "trace.log"))  # traces step 2
    ranks = []
    for rank in (0, 1):
        with open(pattern.format(rank=rank)) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        kinds, waits = {}, {}
        for e in events:
            words = e["name"].split(" ")
            if e["cat"] == "compute waits":  # "wait all_gather h.3": the compute thread blocked
                waits[words[1]] = waits.get(words[1], 0.0) + e["dur"] / 1000.0
            else:
                kinds[words[0]] = kinds.get(words[0], 0.0) + e["dur"] / 1000.0
        comm = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "communication")
        busy, end = 0.0, -1.0
        for a, b in comm:  # union of the communication spans
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
        root_forward = [e for e in events if e["name"] == "forward root"]
        root_backward = [e for e in events if e["name"] == "backward root"]
        ranks.append({"ms_by_span_kind": {k: round(v, 2) for k, v in kinds.items()},
                      "compute_blocked_ms_by_kind": {k: round(v, 2) for k, v in waits.items()},
                      "communication_busy_ms": round(busy / 1000.0, 2),
                      "forward_ms": round(root_forward[0]["dur"] / 1000.0, 2) if root_forward else None,
                      "backward_root_span_ms": round(root_backward[0]["dur"] / 1000.0, 2) if root_backward else None})
    return ranks


# ---------------------------------------------------------------- report


def mi(value):
    return f"{value / 1e6:,.2f}"


THREAD_ORDER = ["compute", "comm", "gloo_tcp_loop", "gloo_worker", "gloo_worker (2nd)", "store (libuv)"]


def ordered(threads):
    return sorted(threads, key=lambda t: THREAD_ORDER.index(t) if t in THREAD_ORDER else len(THREAD_ORDER))


def callgrind_table(result, before):
    cpp, floor = result["callgrind"]["cpp"], result["callgrind"]["floor"][0]
    old = before["callgrind"] if before else None
    head = "| thread / part (inclusive Minstr) | cpp rank 0 | cpp rank 1 | floor |"
    sep = "|---|---|---|---|"
    if old:
        head += " cpp rank 0 before | floor before |"
        sep += "---|---|"
    lines = [head, sep]

    def row(label, thread, fn):
        cells = [mi(r.get(thread, {}).get("rows", {}).get(fn, 0) if fn else r.get(thread, {}).get("total", 0))
                 for r in cpp + [floor]]
        if old:
            cells += [mi(o.get(thread, {}).get("rows", {}).get(fn, 0) if fn else o.get(thread, {}).get("total", 0))
                      for o in (old["cpp"][0], old["floor"][0])]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    threads = []
    for r in cpp + [floor]:
        threads += [t for t in r if t not in threads]
    for thread in ordered(threads):
        row(f"**{thread} thread, whole step**", thread, None)
        rows = COMPUTE_ROWS if thread == "compute" else COMM_ROWS if thread == "comm" else []
        for label, fn in rows:
            row(label.replace("  ", "&nbsp;&nbsp;"), thread, fn)
    total = lambda procs: sum(t["total"] for t in procs)  # noqa: E731
    lines.append(f"| **all threads, per process** | {mi(total(cpp[0].values()))} | "
                 f"{mi(total(cpp[1].values()))} | {mi(total(floor.values()))} |"
                 + (f" {mi(total(old['cpp'][0].values()))} | {mi(total(old['floor'][0].values()))} |" if old else ""))
    return lines


def top_table(result):
    lines = []
    for thread in ("compute", "comm", "gloo_tcp_loop"):
        data = result["callgrind"]["cpp"][0].get(thread)
        if not data:
            continue
        lines += [f"\ncpp rank 0, {thread} thread: top functions by own instructions (Minstr)\n",
                  "| Minstr | function |", "|---|---|"]
        lines += [f"| {mi(v)} | `{fn[:150]}` |" for fn, v in data["top_self"]]
    data = result["callgrind"]["floor"][0].get("compute")
    if data:
        lines += ["\nfloor, compute thread: top functions by own instructions (Minstr)\n",
                  "| Minstr | function |", "|---|---|"]
        lines += [f"| {mi(v)} | `{fn[:150]}` |" for fn, v in data["top_self"]]
    return lines


def perf_table(result, before):
    lines = ["| thread | cpp user | cpp kernel | floor user | floor kernel |" + (" cpp before (user + kernel) |" if before else ""),
             "|---|---|---|---|---|" + ("---|" if before else "")]
    cpp, floor = result["perf"]["cpp"], result["perf"]["floor"]
    old = before["perf"]["cpp"] if before else {}
    threads = sorted(set(cpp) | set(floor), key=lambda t: (t != "compute", t != "comm", t))
    for t in threads:
        cells = [cpp.get(t, {}).get("user", 0), cpp.get(t, {}).get("kernel", 0),
                 floor.get(t, {}).get("user", 0), floor.get(t, {}).get("kernel", 0)]
        text = f"| {t} | " + " | ".join(f"{v:.1f}" for v in cells) + " |"
        if before:
            text += f" {old.get(t, {}).get('user', 0) + old.get(t, {}).get('kernel', 0):.1f} |"
        lines.append(text)
    sums = [sum(v.get(m, 0) for v in d.values()) for d in (cpp, floor) for m in ("user", "kernel")]
    text = "| **all** | " + " | ".join(f"{v:.1f}" for v in sums) + " |"
    if before:
        text += f" {sum(v.get('user', 0) + v.get('kernel', 0) for v in old.values()):.1f} |"
    lines.append(text)
    return lines


def write_report(result, before, out_dir, command):
    c = result["config"]
    lines = [f"# CPU breakdown of one training step: fsdp-cpp (W = 2) against the unsharded floor\n",
             "```sh", command, "```\n",
             f"Configuration `{result['config_name']}`: {c['layers']} layers x {c['dim']}, {c['heads']} heads, "
             f"seq {c['seq']}, batch {c['batch']} per rank; OMP_NUM_THREADS=1; collectives: "
             f"{result.get('collectives', 'default')}; git {result['git']}"
             f"{' (dirty tree)' if result['dirty'] else ''}; {result['date']}.",
             "cpp = gpt_train under fsdprun, 2 ranks; floor = gpt_train --reference --world-size 1 "
             "(one rank's batch, no sharding, AdamW over all parameters).\n",
             "## 1. Instructions (callgrind), step %d, per thread\n" % MEASURED_STEP,
             "Inclusive counts: an indented row is part of the row above it; a hook called from "
             "inside autograd counts in backward too. Blocking waits cost nothing here; kernel work "
             "(socket copies, page faults) is in section 2.\n"]
    if "callgrind" in result:
        lines += callgrind_table(result, before)
        lines += top_table(result)
    else:
        lines.append("(skipped)")
    n1, n2 = c["perf_steps"]
    lines += ["\n## 2. CPU time per step and process (perf, ms)\n",
              f"`perf record -e cpu-clock -c 1000000` (1 sample = 1 ms of CPU) of a {n1}- and a "
              f"{n2}-step run; (samples of the longer run - the shorter) / {n2 - n1} steps, per "
              "process (cpp: the mean of its 2 ranks). Noisy on a shared machine (±10%).\n"]
    lines += perf_table(result, before)
    lines += ["\n## 3. Wall time of the traced step (gpt_train --trace, ms)\n",
              "Compute thread blocked: the trace's `compute waits` lane, time the compute thread "
              "waited for an all-gather, for the reduce-scatters at the end of backward or in the "
              "rate limiter (exposed communication, and the ranks waiting for each other).\n",
              "| rank | forward (root span) | communication busy (union) | compute thread blocked on | "
              "span sums by kind |",
              "|---|---|---|---|---|"]
    for rank, t in enumerate(result["trace"]):
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(t["ms_by_span_kind"].items()))
        blocked = t.get("compute_blocked_ms_by_kind")
        blocked = "–" if blocked is None else ", ".join(
            [f"{k} {v}" for k, v in sorted(blocked.items())] + [f"**all {sum(blocked.values()):.2f}**"])
        lines.append(f"| {rank} | {t['forward_ms']} | {t['communication_busy_ms']} | {blocked} | {kinds} |")
    if result.get("notes"):
        lines += ["\n## Notes\n", result["notes"]]
    with open(os.path.join(out_dir, report_name(result["config_name"]) + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, report_name(result["config_name"]) + ".json"), "w") as f:
        json.dump(result, f, indent=1)


def report_name(config):
    return "cpu-breakdown" if config == "small" else f"cpu-breakdown-{config}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    parser.add_argument("--before", help="an earlier cpu-breakdown.json to show next to this one")
    parser.add_argument("--skip-callgrind", action="store_true")
    parser.add_argument("--step", type=int, default=0,
                        help="the step callgrind counts (default 0; step 0 includes one-time work, "
                             "such as views and optimizer state made at the first step: 3 is a "
                             "steady step)")
    parser.add_argument("--collectives", choices=("ring", "shm"),
                        help="FSDP_CPU_COLLECTIVES for the runs (default: the library's choice)")
    parser.add_argument("--bin", default=BIN, help="where gpt_train and fsdprun are (default: build/bin)")
    parser.add_argument("--notes", help="a Markdown file appended to the report")
    parser.add_argument("--work", help="keep the runs' files here (default: a temporary folder); "
                        "callgrind runs whose files are there already are analysed again, not rerun")
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_annotate", "perf"):
        if not shutil.which(tool):
            sys.exit(f"[cpu_breakdown] needs {tool} on PATH")
    c = CONFIGS[args.config]
    global COLLECTIVES, MEASURED_STEP
    COLLECTIVES = args.collectives
    MEASURED_STEP = args.step
    before = None
    if args.before:
        with open(args.before) as f:
            before = json.load(f)
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()  # noqa: E731
    result = {"config_name": args.config, "config": c, "collectives": args.collectives or "default", "git": git("rev-parse", "--short", "HEAD"),
              "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    command = ".venv/bin/python bench/cpu_breakdown.py " + " ".join(sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="cpu-breakdown-") as temporary:
        work = args.work or temporary
        os.makedirs(work, exist_ok=True)
        snapshot_binaries(args.bin, work)
        if not args.skip_callgrind:
            log("callgrind: cpp and floor (minutes)")
            result["callgrind"] = {"cpp": callgrind("cpp", c, work), "floor": callgrind("floor", c, work)}
        log("perf: cpp and floor")
        result["perf"] = {kind: perf_cpu(kind, c, work) for kind in ("cpp", "floor")}
        log("trace")
        result["trace"] = trace_summary(c, work)
    if args.notes:
        with open(args.notes) as f:
            result["notes"] = f.read()
    os.makedirs(args.out, exist_ok=True)
    write_report(result, before, args.out, command)
    log(f"wrote {os.path.join(args.out, report_name(args.config) + '.md')}")


if __name__ == "__main__":
    main()
