#!/usr/bin/env bash
# The device check's smoke step (scripts/device_check.sh, step "smoke"): two steps of every program
# the check runs, on a tiny model, each within 60 s. A build that cannot run on this GPU, a flag a
# program no longer takes, or a peer that this torch cannot run stops the check here in seconds,
# naming the program and showing the end of its log, instead of failing every run of the
# minutes-long steps after it.
#
#   bash scripts/device_smoke.sh --build BUILD [--device cuda|cpu] [--python PY]
#
# --device cuda (the default) is what the device check runs. --device cpu is its rehearsal on a CPU
# build (ctest device_smoke_rehearsal): the same programs and flags on CPU ranks, CPU offload left
# out (it computes on a GPU by definition), so that a mistake of this script's own shows in CI.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build-gpu
DEVICE=cuda
PY=${PYTHON:-$(command -v python3)}
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=${2:?"--build needs a folder"}; shift ;;
    --device) DEVICE=${2:?"--device needs cuda or cpu"}; shift ;;
    --python) PY=${2:?"--python needs an interpreter"}; shift ;;
    *) echo "usage: $0 --build BUILD [--device cuda|cpu] [--python PY]" >&2; exit 2 ;;
  esac
  shift
done
case "$DEVICE" in
  cuda|cpu) ;;
  *) echo "device_smoke: --device must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;;
esac

SMOKE=$BUILD/smoke
CORPUS=$BUILD/test-corpus
mkdir -p "$SMOKE"
if [ ! -f "$CORPUS/corpus.txt" ]; then  # CMake's configure writes it; regenerated if missing
  "$PY" tests/data/make_corpus.py "$CORPUS/corpus.txt"
fi

TINY_MODEL=(--layers 2 --dim 64 --heads 2 --seq 32 --batch 2 --data "$CORPUS" --max-data-mb 1)
TINY=("${TINY_MODEL[@]}" --steps 2)
GPT=("$BUILD/bin/gpt_train")
RUN1=("$BUILD/bin/fsdprun" --nproc-per-node 1 "$BUILD/bin/gpt_train")
RUN2=("$BUILD/bin/fsdprun" --nproc-per-node 2 "$BUILD/bin/gpt_train")

# The programs run at once (tiny models: the GPU and 16 cores have room for all of them), so the
# step takes as long as its slowest program, not their sum. started NAME COMMAND... starts one, its
# log in $SMOKE/NAME.log; finish waits for all, names each that failed with the end of its log,
# and ends the smoke step if any did.
NAMES=()
PIDS=()
COMMANDS=()
started() {
  local name=$1
  shift
  timeout 60 "$@" >"$SMOKE/$name.log" 2>&1 &
  NAMES+=("$name")
  PIDS+=("$!")
  COMMANDS+=("$*")
}
finish() {
  local i failed=0
  for i in "${!PIDS[@]}"; do
    if wait "${PIDS[$i]}"; then
      printf '  %-16s ok\n' "${NAMES[$i]}"
    else
      echo "device_smoke: smoke run '${NAMES[$i]}' failed: ${COMMANDS[$i]}"
      tail -20 "$SMOKE/${NAMES[$i]}.log"
      failed=1
    fi
  done
  NAMES=()
  PIDS=()
  COMMANDS=()
  [ "$failed" = 0 ] || exit 1
}

# First the FSDP2 peer's inputs (a second of CPU work), which its run reads.
started peer-inputs "${GPT[@]}" --reference "${TINY[@]}" --save-full "$SMOKE/init.pt" \
  --dump-batches "$SMOKE/batches.pt"
# The Llama of bench/gpu_models.py (grouped-query attention, a tied head), as a Hugging Face folder
# for its FSDP2 peer (transformers' LlamaForCausalLM).
LLAMA=(--model llama --kv-heads 1 --tie-head --rope-theta 500000)
rm -rf "$SMOKE/llama-hf"
started llama-inputs "${GPT[@]}" --reference "${LLAMA[@]}" "${TINY_MODEL[@]}" --steps 0 \
  --export-hf "$SMOKE/llama-hf"
finish
started reference "${GPT[@]}" --reference --device "$DEVICE" "${TINY[@]}" --log-every 1
started fsdp-w1 "${RUN1[@]}" --device "$DEVICE" "${TINY[@]}" --log-every 1
# Two ranks on one GPU: NCCL refuses that, so their collectives are staged through Gloo.
started fsdp-w2-staged env FSDP_CUDA_COLLECTIVES=staged "${RUN2[@]}" --device "$DEVICE" "${TINY[@]}" \
  --log-every 1
if [ "$DEVICE" = cuda ]; then
  started offload "${RUN1[@]}" --device cuda --cpu-offload "${TINY[@]}" --log-every 1
fi
started bf16 "${RUN1[@]}" --device "$DEVICE" --param-dtype bf16 --reduce-dtype fp32 "${TINY[@]}"
# fp16: the sharded scaler's overflow check and the fused AdamW dividing by the scale in its kernel.
started fp16 "${RUN1[@]}" --device "$DEVICE" --param-dtype fp16 "${TINY[@]}"
started llama "${RUN1[@]}" --device "$DEVICE" "${LLAMA[@]}" --param-dtype bf16 --reduce-dtype fp32 \
  "${TINY[@]}" --log-every 1
started fsdp2-llama-peer "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
  --log-dir "$SMOKE/torchrun-llama" bench/peer_fsdp2.py --device "$DEVICE" --model llama --seq 32 \
  --batch 2 --steps 2 --param-dtype bf16 --reduce-dtype fp32 --init-from "$SMOKE/llama-hf" \
  --batches "$SMOKE/batches.pt" --fused
started fsdp2-peer "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
  --log-dir "$SMOKE/torchrun" bench/peer_fsdp2.py --device "$DEVICE" --layers 2 --dim 64 --heads 2 --seq 32 --batch 2 --steps 2 \
  --init-from "$SMOKE/init.pt" --batches "$SMOKE/batches.pt"
finish
echo "device_smoke: every program ran in $SECONDS s"
