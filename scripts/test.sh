#!/usr/bin/env bash
# From nothing to a tested build: dependencies, configure, build with every
# core, run the whole CTest suite. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh

JOBS=$(nproc)
BUILD_DIR=${DITRL_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDITRL_WERROR=ON
cmake --build "$BUILD_DIR" -j "$JOBS"

# The CUDA/NCCL sources must compile and link here too, against the same
# torch wheel's CUDA LibTorch and its nvidia-* wheels; without a GPU only
# its no-GPU paths run. ccache makes this mostly preprocessing: the CPU build
# above compiled the same translation units.
cmake -S . -B "$BUILD_DIR-cuda" -DCMAKE_BUILD_TYPE=Release -DDITRL_CUDA=ON -DDITRL_WERROR=ON \
  -DDITRL_BUILD_TESTS=OFF -DDITRL_BUILD_BENCHMARKS=OFF
cmake --build "$BUILD_DIR-cuda" -j "$JOBS"
echo "test.sh: CUDA/NCCL build compiled and linked ($BUILD_DIR-cuda)"
if ! nvidia-smi -L >/dev/null 2>&1; then bash tests/cuda/no_gpu.sh "$BUILD_DIR-cuda"; fi

cd "$BUILD_DIR"
ctest --output-on-failure -j "$JOBS"
