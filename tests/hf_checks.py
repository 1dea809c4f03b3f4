"""What the Hugging Face end-to-end tests (hf_gpt2_e2e.py, hf_llama_e2e.py) share: running gpt_train
(under fsdprun at W = n, or alone), transformers' own loss and logits on gpt_train's eval batch,
token files."""
import os
import subprocess

import numpy as np
import torch

ENV = {**os.environ, "FSDP_TIMEOUT_SECONDS": "60", "OMP_NUM_THREADS": "1"}
for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
    ENV.pop(name, None)  # a test run from a launched shell must not join its world


def run_gpt_train(bin_dir, *args, n=2, check=True, timeout=300):
    """gpt_train ARGS at W = n (n = 0: one process, no launcher)."""
    cmd = ([str(bin_dir / "fsdprun"), "--nproc-per-node", str(n)] if n else []) + \
          [str(bin_dir / "gpt_train"), *map(str, args)]
    result = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def hf_loss_and_logits(model, inputs, targets):
    """transformers' loss (its own shift) and logits on gpt_train's --eval-out batch."""
    with torch.no_grad():
        rows = torch.cat([inputs, targets[:, -1:]], dim=1)  # inputs + the last target
        out = model(input_ids=rows, labels=rows)
        return out.loss.item(), out.logits[:, :-1].float()


def relative(a, b):
    return abs(a - b) / abs(b)


def write_tokens(path, ids, llmc_version=0):
    """ids as nanoGPT's raw uint16 file (llmc_version 0) or llm.c's: version 1 uint16, 2 uint32."""
    ids = np.asarray(ids, dtype="<u4" if llmc_version == 2 else "<u2")
    with open(path, "wb") as f:
        if llmc_version:
            header = np.zeros(256, dtype="<i4")
            header[:3] = [20240520, llmc_version, len(ids)]
            f.write(header.tobytes())
        f.write(ids.tobytes())


def refusal_failure(name, result, needles):
    """Empty when `result` (a refused gpt_train run) exited non-zero naming every needle without a
    backtrace; else what is wrong. Prints the verdict."""
    output = result.stdout + result.stderr
    missing = [n for n in needles if n not in output]
    ok = result.returncode != 0 and not missing and "Exception raised from" not in output
    print(f"bad input: {name}: exit {result.returncode}, {'ok' if ok else 'FAIL'}")
    return "" if ok else f"{name}: lacks {missing}\n{output[-2000:]}"
