#!/usr/bin/env bash
# The CUDA build on a machine without a GPU: `run.device = "cuda"` is a named
# error on every rank (non-zero exit, no hang); "auto" trains on the CPU.
# Usage: tests/cuda/no_gpu.sh BUILD_CUDA_DIR
set -uo pipefail
bin="$1/ditrl"
cd "$(dirname "$0")/../.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
launch=(mpirun --allow-run-as-root --oversubscribe -np 2)
log=$(timeout 120 "${launch[@]}" "$bin" train inputs/quickstart.toml --set run.out_dir="$out/cuda" \
  --set run.device=cuda 2>&1)
rc=$?
fail() { echo "no_gpu.sh: $*"; echo "$log"; exit 1; }
[[ $rc -ne 0 && $rc -ne 124 ]] || fail "run.device=cuda without a GPU exited $rc (expected a non-zero exit, no timeout)"
for rank in 0 1; do
  grep -q "error on rank $rank: run.device = \"cuda\" but no GPU is visible to rank $rank" <<<"$log" ||
    fail "rank $rank did not name the missing GPU"
done
log=$(timeout 300 "${launch[@]}" "$bin" train inputs/quickstart.toml --set run.out_dir="$out/auto" \
  --set run.device=auto --max-rollouts 1 2>&1) || fail "run.device=auto did not train on the CPU"
grep -q "placement: rank 0/2 .* device cpu" "$out/auto/logs/rank-0.log" ||
  fail "run.device=auto: rank 0's log names no CPU device"
echo "no_gpu.sh: cuda -> named error on both ranks (rc $rc); auto -> trained on the CPU"
