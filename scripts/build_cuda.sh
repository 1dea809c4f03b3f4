#!/usr/bin/env bash
# Builds fsdp-cpp against a CUDA-enabled LibTorch on a machine with or without a GPU, then runs the
# CPU tests on that build:
#
#   bash scripts/build_cuda.sh                 # torch 2.14.1 (CUDA 13) into build-cuda/: build + unit
#                                              # tests + the 2-rank suite
#   bash scripts/build_cuda.sh --no-test       # build only
#   bash scripts/build_cuda.sh --torch 2.11.0  # the device machine's LibTorch (2.11.0+cu130) into
#                                              # build-cuda-2.11.0/, its venv .venv-cuda-2.11.0/
#
# The CUDA toolkit pieces CMake asks for (nvcc, the runtime headers) come from CUDA_HOME
# (default /usr/local/cuda); the CUDA libraries LibTorch links (NCCL, nvrtc, ...) from the wheel.
# LibTorch 2.14 requires C++20, which CMakeLists.txt selects for it.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH=2.14.1
TEST=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-test) TEST=0 ;;
    --torch) TORCH=${2:?"--torch needs a version, e.g. 2.11.0"}; shift ;;
    *) echo "usage: $0 [--no-test] [--torch VERSION]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$TORCH" = 2.14.1 ]; then
  VENV=.venv-cuda BUILD=build-cuda
else
  VENV=.venv-cuda-$TORCH BUILD=build-cuda-$TORCH
fi

bash scripts/setup.sh  # Debian packages (Gloo's headers, GoogleTest, ...) and the CPU venv

if ! "$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('$TORCH') and torch.version.cuda" \
    >/dev/null 2>&1; then
  echo "build_cuda: creating $VENV with torch==$TORCH (a CUDA build, ~5 GB)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH" numpy 2>&1 | grep -v "^WARNING: Location" || true
fi

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ] || [ ! -f "$CUDA_HOME/include/cuda_runtime.h" ]; then
  echo "build_cuda: no CUDA toolkit at CUDA_HOME=$CUDA_HOME (needs bin/nvcc and include/cuda_runtime.h)." >&2
  echo "  Install CUDA 13's nvcc and runtime headers there (e.g. PyPI's nvidia-cuda-nvcc and" >&2
  echo "  nvidia-cuda-runtime 13.0 packages) or point CUDA_HOME at an existing toolkit." >&2
  exit 1
fi
NVRTC=$("$VENV/bin/python" -c "import glob, os, nvidia; print(sorted(glob.glob(os.path.join(nvidia.__path__[0], '*', 'lib', 'libnvrtc.so.*')))[0])")

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTORCH_PYTHON="$PWD/$VENV/bin/python" \
  -DCUDA_TOOLKIT_ROOT_DIR="$CUDA_HOME" -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" \
  -DCUDA_nvrtc_LIBRARY="$NVRTC" -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
cmake --build "$BUILD" -j "${JOBS:-2}"

[ "$TEST" = 0 ] && exit 0
"$BUILD/bin/fsdp_unit_tests"
"$BUILD/bin/gpt_unit_tests"
FSDP_TIMEOUT_SECONDS=60 OMP_NUM_THREADS=1 "$BUILD/bin/fsdprun" --nproc-per-node 2 \
  "$BUILD/bin/fsdp_dist_tests" --gtest_filter=-Fault.*
FSDP_TIMEOUT_SECONDS=60 OMP_NUM_THREADS=1 "$BUILD/bin/fsdprun" --nproc-per-node 2 \
  "$BUILD/bin/gpt_dist_tests"
