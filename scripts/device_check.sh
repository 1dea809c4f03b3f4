#!/usr/bin/env bash
# The device check (bench/README.md, "On a GPU"), on a machine with an NVIDIA GPU (made for the
# device tool's H200: its own python3 with a CUDA PyTorch, nvcc, CMake, ninja, g++, no Debian dev
# packages, no network). In under 8 minutes in all:
#   1. builds gpt_train and fsdprun against that machine's PyTorch (Release, Ninja) into build-gpu/,
#      then runs two steps of every program on a tiny model (the smoke step: seconds; it stops the
#      check at the first program that fails, naming it);
#   2. tests/gpu_check.py: parity with plain LibTorch over NCCL (W = 1), in the staged mode (W = 2
#      and 4 sharing the GPU), with CPU offload and in bf16; memory against the bound;
#   3. bench/gpu_bench.py: the 1.3 B GPT in bf16, interleaved rounds of fsdp-cpp, plain LibTorch
#      and PyTorch FSDP2 (foreach and fused AdamW), then offload;
#   4. bench/gpu_models.py: a Llama-3.2-1B-shaped model and GPT-2 124M's shapes at batch 2 (where
#      the host's overhead shows), fsdp-cpp against FSDP2 with fused AdamW, interleaved;
#   5. bench/plan_vs_gpu.py: gpt_train --plan for that benchmark (the GPU probed) against it;
# writes bench/results/gpu-check.json, gpu-bench.{json,md} and gpu-models.{json,md}, and copies them
# with the log to $OUT
# when OUT is set (the device tool brings that folder back).
#
#   bash scripts/device_deps.sh              # first, here: .device-deps/ (Gloo's headers, ...)
#   bash scripts/device_check.sh             # there, with .device-deps carried along
#   bash scripts/device_check.sh --build-only
#
# Environment: PYTHON (default: python3 on PATH), CUDA_HOME (default: /usr/local/cuda, else from
# the nvcc on PATH), JOBS (default: nproc), TORCH_CUDA_ARCH_LIST (default 9.0, Hopper).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build-gpu
LOG=$BUILD/device-check.log

# The outer call: runs the check with its output in $LOG (and in $OUT as it goes, so that a run
# stopped from outside still brings its log back), then packs the runs' logs into $OUT.
if [ -z "${DEVICE_CHECK_INNER:-}" ]; then
  mkdir -p "$BUILD" ${OUT:+"$OUT"}
  set +e
  DEVICE_CHECK_INNER=1 bash "$0" "$@" 2>&1 | tee "$LOG" ${OUT:+"$OUT/device-check.log"}
  rc=${PIPESTATUS[0]}
  set -e
  if [ -n "${OUT:-}" ]; then
    # Configure log, every run's log and metrics (not the 5 GB checkpoint nor the batches).
    tar -czf "$OUT/gpu-runs.tar.gz" --exclude='*.pt' --exclude='*.safetensors' -C "$BUILD" \
      configure.log initial-weights.log smoke gpu-check gpu-bench gpu-models 2>/dev/null || true
  fi
  exit "$rc"
fi

# Copies a result to $OUT, when set, as soon as it is written.
deliver() {
  if [ -n "${OUT:-}" ] && [ -f "$1" ]; then cp "$1" "$OUT/"; fi
}

BUILD_ONLY=0
case "${1:-}" in
  "") ;;
  --build-only) BUILD_ONLY=1 ;;
  *) echo "usage: $0 [--build-only]" >&2; exit 2 ;;
esac

STEP="start"
STEP_TIMES=()
STEP_START=$SECONDS
SCRIPT_START=$SECONDS
report_failure() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "device_check: FAILED in step '$STEP' (exit $rc) after $((SECONDS - SCRIPT_START)) s"
  fi
}
trap report_failure EXIT

# Starts the step $1; the time of the one before is kept for the summary.
step() {
  if [ "$STEP" != start ]; then
    STEP_TIMES+=("$(printf '%-12s %4d s' "$STEP" $((SECONDS - STEP_START)))")
  fi
  STEP=$1
  STEP_START=$SECONDS
  echo "=== device_check: $STEP"
}

PY=${PYTHON:-$(command -v python3)}
export PYTHONUNBUFFERED=1

step environment
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
  "GPU", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device visible")'
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi

# The CUDA toolkit: $CUDA_HOME, else /usr/local/cuda, else the folder above the bin/ of the nvcc
# on PATH (links followed; an nvcc there may also be a wrapper script, hence the order).
find_cuda_home() {
  local nvcc home
  nvcc=$(readlink -f "$(command -v nvcc)" 2>/dev/null || true)
  for home in "${CUDA_HOME:-}" /usr/local/cuda "${nvcc%/bin/nvcc}"; do
    if [ -n "$home" ] && [ -x "$home/bin/nvcc" ] && [ -f "$home/include/cuda_runtime.h" ]; then
      echo "$home"
      return 0
    fi
  done
  echo "device_check: no CUDA toolkit (bin/nvcc and include/cuda_runtime.h) at \$CUDA_HOME," \
    "/usr/local/cuda or above the nvcc on PATH" >&2
  return 1
}
CUDA_HOME=$(find_cuda_home)
echo "CUDA toolkit: $CUDA_HOME, $("$CUDA_HOME/bin/nvcc" --version | tail -1)"
# LibTorch's CMake config asks for nvrtc: the wheel's (what torch runs with), else the toolkit's.
NVRTC=$("$PY" -c 'import glob, os, nvidia
print((sorted(glob.glob(os.path.join(nvidia.__path__[0], "*", "lib", "libnvrtc.so.*"))) or [""])[0])' \
  2>/dev/null || true)
[ -n "$NVRTC" ] || NVRTC=$(find "$CUDA_HOME"/lib* -name 'libnvrtc.so*' 2>/dev/null | sort | head -1 || true)

DEPS=()
if [ -d .device-deps ]; then
  DEPS=(-DFSDP_DEPS_DIR="$PWD/.device-deps")
elif [ ! -d /usr/include/gloo ]; then
  echo "device_check: no Gloo headers: run scripts/device_deps.sh where scripts/setup.sh ran, and" >&2
  echo "  carry .device-deps along" >&2
  exit 1
fi

step configure
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCH_PYTHON="$PY" -DFSDP_CUDA=ON \
  "${DEPS[@]}" -DCUDA_TOOLKIT_ROOT_DIR="$CUDA_HOME" -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" \
  ${NVRTC:+-DCUDA_nvrtc_LIBRARY="$NVRTC"} -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" \
  -Wno-dev >"$BUILD/configure.log" 2>&1 || { tail -40 "$BUILD/configure.log"; exit 1; }
grep -E "fsdp-cpp:|Found Torch|Found CUDA" "$BUILD/configure.log" || true

step build
# Only what the checks run: the test binaries would double the build time.
timeout 420 cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target gpt_train fsdprun
"$BUILD/bin/gpt_train" --help | grep -- "--cpu-offload" >/dev/null ||
  { echo "device_check: gpt_train has no --cpu-offload flag" >&2; exit 1; }

if [ "$BUILD_ONLY" = 1 ]; then
  step summary
  printf '  %s\n' "${STEP_TIMES[@]}"
  exit 0
fi

step smoke
# Two steps of every program the checks run, on a tiny model (scripts/device_smoke.sh, rehearsed
# on the CPU in every `make test`): a broken build or peer stops the check here, in seconds.
bash scripts/device_smoke.sh --build "$BUILD" --device cuda --python "$PY"

# A failed check does not skip the benchmark (one device run should bring back both).
FAILED=()
step gpu-check
# Meanwhile, FSDP2's starting weights for the benchmark (a minute of CPU work; nothing here is timed).
"$PY" bench/gpu_bench.py --build "$BUILD" --initial-weights-only >"$BUILD/initial-weights.log" 2>&1 &
INITIAL_WEIGHTS=$!
timeout 240 "$PY" tests/gpu_check.py --build "$BUILD" --out bench/results/gpu-check.json ||
  FAILED+=("gpu-check (exit $?)")
deliver bench/results/gpu-check.json
wait "$INITIAL_WEIGHTS" ||
  echo "device_check: writing the initial weights failed ($BUILD/initial-weights.log); gpu_bench retries"

step gpu-bench
# Two interleaved rounds of four 1.3 B runs (~20 s each, mostly set-up) and one offload run.
timeout 480 "$PY" bench/gpu_bench.py --build "$BUILD" --out bench/results/gpu-bench.json ||
  FAILED+=("gpu-bench (exit $?)")
deliver bench/results/gpu-bench.json
deliver bench/results/gpu-bench.md

step models
# Two interleaved rounds of fsdp-cpp and FSDP2 on a 1.24 B Llama and a 124 M GPT (~2 minutes).
timeout 240 "$PY" bench/gpu_models.py --build "$BUILD" --out bench/results/gpu-models.json ||
  FAILED+=("models (exit $?)")
deliver bench/results/gpu-models.json
deliver bench/results/gpu-models.md

step plan
# The planner against the benchmark just measured: the GPU probed for a few seconds (issue 22).
timeout 120 "$PY" bench/plan_vs_gpu.py --build "$BUILD" --bench bench/results/gpu-bench.json \
  --out bench/results/gpu-plan.json || FAILED+=("plan (exit $?)")
deliver bench/results/gpu-plan.json

step summary
printf '  %s\n' "${STEP_TIMES[@]}"
if [ "${#FAILED[@]}" -gt 0 ]; then
  STEP="${FAILED[*]}"
  exit 1
fi
echo "device_check: every step passed in $((SECONDS - SCRIPT_START)) s"
