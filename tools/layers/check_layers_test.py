#!/usr/bin/env python3
"""The layer check passes on the repository and fails on an upward include: a copy of src/ and
include/ in which the lowest layer's first header includes a header of the top layer, and one in
which a file sits outside every layer folder.

    python3 tools/layers/check_layers_test.py REPO
"""
import os
import shutil
import subprocess
import sys
import tempfile

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_layers.py")
sys.path.insert(0, os.path.dirname(CHECK))
from check_layers import LAYERS  # noqa: E402


def run(repo):
    result = subprocess.run([sys.executable, CHECK, repo], capture_output=True, text=True)
    return result.returncode, result.stdout


def copy_tree(repo, into):
    for part in ("src", "include"):
        shutil.copytree(os.path.join(repo, part), os.path.join(into, part))


def first_header(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".h"))[0]


def main():
    repo = sys.argv[1]
    code, out = run(repo)
    assert code == 0, f"the repository fails its layer check:\n{out}"

    with tempfile.TemporaryDirectory() as tmp:
        copy_tree(repo, tmp)
        low, top = os.path.join(tmp, "src", LAYERS[0]), os.path.join(tmp, "src", LAYERS[-1])
        victim = os.path.join(low, first_header(low))
        with open(victim, "a") as f:
            f.write(f'\n#include "{LAYERS[-1]}/{first_header(top)}"\n')
        code, out = run(tmp)
        assert code == 1 and f"of layer '{LAYERS[-1]}', above its own layer '{LAYERS[0]}'" in out, out

    with tempfile.TemporaryDirectory() as tmp:
        copy_tree(repo, tmp)
        open(os.path.join(tmp, "src", "stray.cpp"), "w").close()
        code, out = run(tmp)
        assert code == 1 and "src/stray.cpp: outside every layer folder" in out, out
    print("layer check: green on the repository, red on an upward include and on a stray file")


if __name__ == "__main__":
    main()
