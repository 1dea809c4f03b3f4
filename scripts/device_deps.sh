#!/usr/bin/env bash
# Copies into .device-deps/ the build dependencies that a GPU machine without Debian's packages
# lacks (the device tool's H200 has PyTorch, nvcc, CMake and ninja, but no Gloo headers, CLI11,
# nlohmann_json or GoogleTest), so that scripts/device_check.sh can build there:
#
#   bash scripts/device_deps.sh     # here, where scripts/setup.sh installed the Debian packages
#
# then carry .device-deps with the tree (the folder is git-ignored). CMakeLists.txt uses it when
# configured with -DFSDP_DEPS_DIR=<it> (device_check.sh does that):
#   include/gloo, include/nlohmann, include/CLI   headers (Gloo's only for LibTorch's c10d headers)
#   share/cmake/{nlohmann_json,CLI11}             their CMake config files (relocatable)
#   googletest/                                   GoogleTest's sources, built there by its own g++
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=.device-deps
HEADERS=(/usr/include/gloo /usr/include/nlohmann /usr/include/CLI)
CONFIGS=(/usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11)
GTEST_SOURCES=/usr/src/googletest

for path in "${HEADERS[@]}" "${CONFIGS[@]}" "$GTEST_SOURCES"; do
  if [ ! -e "$path" ]; then
    echo "device_deps: $path is missing; run scripts/setup.sh first (Debian packages)" >&2
    exit 1
  fi
done

rm -rf "$DEST"
mkdir -p "$DEST/include" "$DEST/share/cmake"
cp -r "${HEADERS[@]}" "$DEST/include/"
cp -r "${CONFIGS[@]}" "$DEST/share/cmake/"
cp -r "$GTEST_SOURCES" "$DEST/googletest"

echo "device_deps: wrote $DEST ($(du -sh "$DEST" | cut -f1); the device tool carries 64 MiB in all)"
