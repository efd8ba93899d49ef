#!/usr/bin/env bash
# From nothing to a trained tiny model: dependencies, build, a Flow-GRPO run of
# inputs/quickstart.toml on 2 MPI ranks (with preview sample grids in OUT/samples), and a PNG of its curves.
#   bash scripts/quickstart.sh [--set key=value ...]   (extra args go to `ditrl train`)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh

BUILD_DIR=${DITRL_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$(nproc)" --target ditrl

OUT=runs/quickstart
rm -rf "$OUT"  # a fresh run; `ditrl train ... --resume latest` continues an old one instead
# --oversubscribe: 2 ranks must start even where Open MPI counts fewer slots.
mpirun --allow-run-as-root --oversubscribe -np 2 "$BUILD_DIR/ditrl" train inputs/quickstart.toml \
  --set run.out_dir="$OUT" "$@"

/usr/bin/python3 tools/plot_metrics.py "$OUT/metrics.h5" --out "$OUT/curves.png" --summary
echo "quickstart: metrics $OUT/metrics.h5, checkpoints $OUT/checkpoints/, samples $OUT/samples/, curves $OUT/curves.png"
