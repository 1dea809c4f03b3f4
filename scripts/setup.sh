#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: Debian packages, the project venv (torch 2.13.0 CPU wheel).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="cmake ninja-build g++ libgloo-dev libgtest-dev nlohmann-json3-dev libcli11-dev"
missing=""
for p in $APT_PACKAGES; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q >/dev/null || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q $missing >/dev/null
fi

if ! .venv/bin/python -c "import torch, numpy; assert torch.__version__.startswith('2.13.0')" >/dev/null 2>&1; then
  echo "setup: creating .venv with torch==2.13.0 (CPU wheel)"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 numpy 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
fi

# transformers and safetensors for tests/hf_gpt2_e2e.py (Hugging Face GPT-2 folders in and out).
if ! .venv/bin/python -c "import transformers, safetensors; assert transformers.__version__ == '5.23.0'" >/dev/null 2>&1; then
  echo "setup: installing transformers==5.23.0 and safetensors==0.8.0 into .venv"
  .venv/bin/pip install -q --disable-pip-version-check transformers==5.23.0 safetensors==0.8.0 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import transformers, safetensors"
fi
