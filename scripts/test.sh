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

# The CUDA/NCCL sources must compile and link wherever the toolkit is
# installed, even on machines that cannot run them.
if [[ -f /usr/local/cuda/include/nccl.h ]]; then
  cmake -S . -B "$BUILD_DIR-cuda" -DCMAKE_BUILD_TYPE=Release -DDITRL_CUDA=ON -DDITRL_WERROR=ON \
    -DDITRL_BUILD_TESTS=OFF -DDITRL_BUILD_BENCHMARKS=OFF -DCUDAToolkit_ROOT=/usr/local/cuda
  cmake --build "$BUILD_DIR-cuda" -j "$JOBS"
  echo "test.sh: CUDA/NCCL build compiled and linked ($BUILD_DIR-cuda); nothing run (no GPU needed)"
fi

cd "$BUILD_DIR"
ctest --output-on-failure -j "$JOBS"
