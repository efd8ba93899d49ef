#!/bin/bash
# Checkpoint write bandwidth vs plain sequential write+fsync of the same bytes
# (page cache, and O_DIRECT; same disk, same run): bench_checkpoint for the quickstart model and
# the ~100M SD3 config at 1, 2 and 4 ranks. Prints the markdown table rows
# that benchmarks/results/checkpoint.md holds.
#   benchmarks/profile/checkpoint.sh [build dir] [scratch dir] [repeats]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=$(realpath "${1:-build}")
SCRATCH=$(realpath -m "${2:-$BUILD/bench-checkpoint}")
REPEATS=${3:-3}
mkdir -p "$SCRATCH"
MPI=(mpiexec --allow-run-as-root --oversubscribe --mca btl self,vader)
echo "| model | ranks | checkpoint MiB | checkpoint s (median) | MiB/s | plain write+fsync s (median) | MiB/s | ratio of medians | median of ratios | O_DIRECT write+fsync s (median) | MiB/s | ratio of medians | median of ratios | delete previous s | load avg after |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for ranks in 1 2 4; do
  "${MPI[@]}" -n "$ranks" "$BUILD/benchmarks/bench_checkpoint" inputs/quickstart.toml "$SCRATCH/quickstart-np$ranks" \
    quickstart "$REPEATS" 2>"$SCRATCH-quickstart-np$ranks.log"
done
for ranks in 1 2 4; do
  "${MPI[@]}" -n "$ranks" "$BUILD/benchmarks/bench_checkpoint" inputs/quickstart.toml "$SCRATCH/sd3-100m-np$ranks" \
    sd3-100m "$REPEATS" model.config=benchmarks/configs/sd3-100m.json 2>"$SCRATCH-sd3-100m-np$ranks.log"
done
