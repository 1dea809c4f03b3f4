#!/usr/bin/env python3
"""The layer check passes on the repository and fails on an upward include: a copy of src/ and
include/ in which the lowest layer's first header includes a header of the top layer, one in
which a file sits outside every layer folder, one in which param_group.cpp includes fsdp_state.h
(above it inside core), one in which a core header includes <fsdp/fully_shard.h>, and one in
which io's state_dict.cpp includes core/param_group.h instead of the sharded view.

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


def red_after(repo, edit, expected):
    """The check on a copy of the tree with `edit(copy)` applied fails, printing `expected`."""
    with tempfile.TemporaryDirectory() as tmp:
        copy_tree(repo, tmp)
        edit(tmp)
        code, out = run(tmp)
        assert code == 1 and expected in out, out


def append(path, line):
    with open(path, "a") as f:
        f.write(f"\n{line}\n")


def main():
    repo = sys.argv[1]
    code, out = run(repo)
    assert code == 0, f"the repository fails its layer check:\n{out}"

    def upward(tmp):
        low, top = os.path.join(tmp, "src", LAYERS[0]), os.path.join(tmp, "src", LAYERS[-1])
        append(os.path.join(low, first_header(low)), f'#include "{LAYERS[-1]}/{first_header(top)}"')
    red_after(repo, upward, f"of layer '{LAYERS[-1]}', above its own layer '{LAYERS[0]}'")
    red_after(repo, lambda tmp: open(os.path.join(tmp, "src", "stray.cpp"), "w").close(),
              "src/stray.cpp: outside every layer folder")
    # Inside core: a unit calls nothing above it.
    red_after(repo, lambda tmp: append(os.path.join(tmp, "src", "core", "param_group.cpp"),
                                       '#include "core/fsdp_state.h"'),
              'src/core/param_group.cpp: includes "core/fsdp_state.h", above it inside core')
    # No header of the engine includes the public face.
    red_after(repo, lambda tmp: append(os.path.join(tmp, "src", "core", "unit_comm.h"),
                                       "#include <fsdp/fully_shard.h>"),
              "src/core/unit_comm.h: includes <fsdp/fully_shard.h>, the public face")
    # Above core, the engine is seen through the sharded view only.
    red_after(repo, lambda tmp: append(os.path.join(tmp, "src", "io", "state_dict.cpp"),
                                       '#include "core/param_group.h"'),
              'src/io/state_dict.cpp: includes "core/param_group.h", core\'s own')
    print("layer check: green on the repository, red on an upward include, a stray file, an "
          "include above a file inside core, a src/ header that includes the public face and an "
          "engine header included above core")


if __name__ == "__main__":
    main()
