# Two commands do everything on a fresh machine: `make demo` (the main job) and `make test`.
# Each installs what it needs first (Debian packages, the venv with torch 2.13.0, the build).

BUILD      ?= build
JOBS       ?= 2
PYTHON     := .venv/bin/python
NPROC      ?= 2
CCACHE     := $(shell command -v ccache 2>/dev/null)
CMAKE_ARGS := -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_WARNINGS_AS_ERRORS=ON $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

.PHONY: setup build test demo bench bench-collectives clean

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) $(CMAKE_ARGS)

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 900

# The demo trains on the sources of Python's standard library: text every machine has.
demo: build
	$(BUILD)/bin/fsdprun --nproc-per-node $(NPROC) $(BUILD)/bin/gpt_train \
	  --data "$$($(PYTHON) -c 'import os; print(os.path.dirname(os.__file__))')" \
	  --layers 4 --dim 128 --heads 4 --seq 128 --batch 8 \
	  --steps 400 --lr 3e-3 --warmup-steps 20 --log-every 20 --sample 300 \
	  --metrics $(BUILD)/demo-metrics-rank{rank}.jsonl

# Side by side with PyTorch FSDP2 (same GPT, weights and batches) and the unsharded floor;
# writes bench/results/latest.{json,md,png}. Run it on an otherwise idle machine.
bench: build
	$(PYTHON) bench/run_bench.py

# The CPU collectives nccl-tests style (ring over Gloo, shared memory, Gloo's own, vs memcpy) at
# W = 2, 3, 4; writes bench/results/collectives.{md,png}.
bench-collectives: build
	$(PYTHON) bench/collectives_bench.py

clean:
	rm -rf $(BUILD)
