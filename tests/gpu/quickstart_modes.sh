#!/usr/bin/env bash
# Deterministic mode's cost on the launch-bound quickstart: 8 rollouts with
# run.deterministic = true, = false, and = false with deterministic mode's one
# intra-op thread, each followed by its phases' median seconds (CUDA events on a GPU).
#   tests/gpu/quickstart_modes.sh DITRL PYTHON OUT_DIR [DEVICE (default cuda)]
set -euo pipefail
ditrl=$1 python=$2 out=$3 device=${4:-cuda}
cd "$(dirname "$0")/../.."
mkdir -p "$out"
modes=("run.deterministic=true" "run.deterministic=false" "run.deterministic=false --set run.threads=1")
for i in "${!modes[@]}"; do
  echo "== ${modes[$i]}"
  # shellcheck disable=SC2086  # a mode is one or two --set pairs
  mpiexec --allow-run-as-root -np 1 "$ditrl" train inputs/quickstart.toml --resume none --set run.device="$device" \
    --set train.num_rollouts=8 --set run.out_dir="$out/mode$i" --set ${modes[$i]} >"$out/mode$i.log" 2>&1 ||
    { tail -n 20 "$out/mode$i.log"; exit 1; }
  grep -E "rollout [5-8]/8" "$out/mode$i/logs/rank-0.log" | grep -oE "[0-9.]+ s/rollout" | paste -sd' ' | sed 's/^/rollouts 5-8: /'
  "$python" tools/plot_metrics.py "$out/mode$i/metrics.h5" --no-plot
done
