#!/usr/bin/env bash
# From nothing to a trained tiny model: dependencies, build, a Flow-GRPO run of
# inputs/quickstart.toml (with preview sample grids in OUT/samples), and a PNG of its curves. Where an NVIDIA GPU is
# visible (nvidia-smi -L, or /dev/nvidia0), the CUDA variant is built
# (-DDITRL_CUDA=ON against the venv's torch, which carries CUDA LibTorch) and
# the quickstart trains on the GPU, one rank per GPU as slurm/train.sbatch and
# the GPU kit run it; otherwise the CPU-only build trains on 2 MPI ranks.
#   bash scripts/quickstart.sh [--set key=value ...]   (extra args go to `ditrl train`)
#   DITRL_QUICKSTART_DEVICE=cpu bash scripts/quickstart.sh   (the CPU path on a GPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh

gpus=0
if [[ ${DITRL_QUICKSTART_DEVICE:-auto} != cpu ]]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L | grep -c '^GPU ')
  elif [[ -e /dev/nvidia0 ]]; then
    gpus=1
  fi
fi

OUT=runs/quickstart
rm -rf "$OUT"  # a fresh run; `ditrl train ... --resume latest` continues an old one instead
# --oversubscribe: the ranks must start even where Open MPI counts fewer slots.
if ((gpus > 0)); then
  BUILD_DIR=${DITRL_BUILD_DIR:-build-cuda}
  echo "quickstart: $gpus NVIDIA GPU(s) visible: building the CUDA variant in $BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDITRL_CUDA=ON \
    -DDITRL_PYTHON="${DITRL_PYTHON:-$HOME/.cache/ditrl/venv/bin/python}"
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target ditrl
  # The deck's 16 samples per step split evenly: 1, 2, 4 or 8 ranks.
  ranks=1
  while ((ranks * 2 <= gpus && ranks < 8)); do ranks=$((ranks * 2)); done
  # One rank per GPU, unbound (the ranks pick their GPU by node-local rank):
  # what slurm/train.sbatch and scripts/gpu_check.sh do. run.device = "cuda"
  # so that a GPU the build cannot use is an error, not a silent CPU run.
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" "$BUILD_DIR/ditrl" train \
    inputs/quickstart.toml --set run.out_dir="$OUT" --set run.device=cuda "$@"
else
  BUILD_DIR=${DITRL_BUILD_DIR:-build}
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target ditrl
  mpirun --allow-run-as-root --oversubscribe -np 2 "$BUILD_DIR/ditrl" train inputs/quickstart.toml \
    --set run.out_dir="$OUT" "$@"
fi

/usr/bin/python3 tools/plot_metrics.py "$OUT/metrics.h5" --out "$OUT/curves.png" --summary
echo "quickstart: metrics $OUT/metrics.h5, checkpoints $OUT/checkpoints/, samples $OUT/samples/, curves $OUT/curves.png"
