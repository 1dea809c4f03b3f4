"""The loop the end-to-end mutation scripts share (tests/llama_mutations.py, muon_mutations.py,
muon_train_mutations.py): for each mutation, replace its original text in WORKTREE, rebuild what
it needs, run each test that must turn red, and restore the file with git checkout; print a
Markdown row per mutation (red with the test's message, or SURVIVED), exit 1 if any survived.

    .venv/bin/python tests/<script>.py WORKTREE [--only ID,...]

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed."""
import argparse
import subprocess
import sys
from pathlib import Path


def sh(cmd, cwd, timeout=None):
    return subprocess.run(cmd, cwd=cwd, text=True, capture_output=True, timeout=timeout)


def verdict(run, keywords):
    """'red (the last line naming the failure)' or 'SURVIVED', from a test's run."""
    if run.returncode == 0:
        return "SURVIVED"
    lines = [l for l in (run.stdout + run.stderr).splitlines() if any(k in l for k in keywords)]
    return f"red ({(lines or ['exit ' + str(run.returncode)])[-1][:160]})"


def command_of(run, bin_dir):
    """A test's command: a Python script with BIN first, or a program of BIN with its arguments."""
    program, *arguments = run
    if program.endswith(".py"):
        return [sys.executable, program, str(bin_dir), *arguments]
    return [str(bin_dir / program), *arguments]


def label_of(run):
    """A test's name in a row: the script's, or the program's arguments (a gtest filter)."""
    return Path(run[0]).name if run[0].endswith(".py") else " ".join(run[1:])


def main(mutations, targets, rebuilds=lambda path: True, keywords=("Error", "assert")):
    """`mutations`: (id, file, original text, mutated text, [tests: a script run as `python test BIN`,
    or (script, *arguments) run as `python script BIN arguments`, or (program, *arguments) for a
    program of BIN (a gtest binary and its filter) run as `BIN/program arguments`]);
    `targets`: what to rebuild; `rebuilds(file)`: whether a mutation of that file needs it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("worktree")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    wt = Path(args.worktree).resolve()
    only = set(filter(None, args.only.split(",")))
    build = ["cmake", "--build", "build", "-j2", "--target", *targets]
    rows, survived = [], 0
    for mid, path, original, mutated, tests in mutations:
        if only and mid not in only:
            continue
        text = (wt / path).read_text()
        if text.count(original) != 1:
            sys.exit(f"{mid}: the original text occurs {text.count(original)} times in {path}")
        try:
            (wt / path).write_text(text.replace(original, mutated))
            if rebuilds(path):
                built = sh(build, wt)
                if built.returncode != 0:
                    sys.exit(f"{mid}: the mutated build failed:\n{built.stdout[-3000:]}")
            runs = [(test,) if isinstance(test, str) else tuple(test) for test in tests]
            verdicts = [verdict(sh(command_of(run, wt / "build" / "bin"), wt, timeout=900), keywords)
                        + ("" if len(runs) == 1 else f" {label_of(run)}")
                        for run in runs]
            survived += any(v.startswith("SURVIVED") for v in verdicts)
            rows.append(f"| {mid} | `{path}` | {'; '.join(verdicts)} |")
            print(rows[-1], flush=True)
        finally:
            sh(["git", "checkout", "--", path], wt)
    sh(build, wt)
    print("| mutation | file | result |\n|---|---|---|\n" + "\n".join(rows))
    sys.exit(1 if survived else 0)
