"""What bf16 can buy on this CPU: its model, whether it has native bf16 arithmetic (the ISA flags and
torch's own check) and one thread's 1024×1024 matmul throughput in fp32 and in bf16.

    .venv/bin/python bench/cpu_bf16.py      # prints the JSON that make bench records

Native bf16 means dot-product instructions on bf16 (x86: avx512_bf16 or amx_bf16; Arm: the bf16
feature). torch.ops.mkldnn._is_mkldnn_bf16_supported() only says that oneDNN has bf16 kernels for
this CPU: it is true on AVX-512 cores without avx512_bf16 too, where oneDNN converts to fp32.
Without either (an AVX2-only core), a bf16 matmul is far slower than fp32: measured 0.6 against
50 GFLOP/s on one thread of an AVX2 AMD EPYC.
"""

import json
import platform
import time

import torch

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 flags; "bf16" is Arm's feature name
MATMUL_N = 1024
MIN_SECONDS = 0.5


def cpu_model_and_flags():
    """The first processor's model name and ISA flags from /proc/cpuinfo (x86 "flags", Arm
    "Features"); platform.processor() and no flags where there is no /proc/cpuinfo."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = fields.get("model name") or fields.get("Model") or platform.processor() or "unknown"
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    return model, flags


def matmul_gflops(dtype, n=MATMUL_N, min_seconds=MIN_SECONDS):
    """One thread's n×n×n matmul throughput: one untimed call (kernel selection, JIT), then as many
    calls as fit in min_seconds (at least one)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    calls, start = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - start < min_seconds:
        torch.mm(a, b)
        calls += 1
    return 2 * n ** 3 * calls / (time.perf_counter() - start) / 1e9


def probe():
    model, flags = cpu_model_and_flags()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fp32, bf16 = matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16)
    finally:
        torch.set_num_threads(threads)
    native = [f for f in NATIVE_BF16_FLAGS if f in flags]
    return {
        "cpu_model": model,
        "isa_flags": sorted(f for f in flags if f.startswith(("avx", "amx")) or f in NATIVE_BF16_FLAGS),
        "native_bf16": bool(native),
        "native_bf16_flags": native,
        "torch_mkldnn_bf16_supported": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "matmul_n": MATMUL_N,
        "matmul_1thread_gflops": {"fp32": fp32, "bf16": bf16},
        "matmul_bf16_speedup": bf16 / fp32,
    }


if __name__ == "__main__":
    print(json.dumps(probe(), indent=2))
