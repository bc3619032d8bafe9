#!/bin/sh
# Builds anvil and runs the whole test suite (CPU, and Vulkan on whatever device the
# machine has — lavapipe in CI). Extra arguments go to ctest.
set -eu
cd "$(dirname "$0")/.."
build=${ANVIL_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${ANVIL_CMAKE_ARGS:-} >/dev/null
cmake --build "$build"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" "$@"
