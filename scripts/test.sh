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

# The CUDA/NCCL build, made the way the GPU check kit makes it on a bare GPU
# machine: Debian's libraries unpacked into kit/prefix, ditrl built against
# them and the venv's CUDA LibTorch, the `gpu` tests (SKIPPED without a GPU)
# and the CUDA build's no-GPU paths (tests/cuda/no_gpu.sh).
bash scripts/prepare_gpu_kit.sh
DITRL_WERROR=ON DITRL_PYTHON="${DITRL_VENV:-$HOME/.cache/ditrl/venv}/bin/python" \
  bash scripts/gpu_check.sh --build-dir "$BUILD_DIR-cuda" --results "$BUILD_DIR-cuda/gpu-check"

cd "$BUILD_DIR"
ctest --output-on-failure -j "$JOBS"
