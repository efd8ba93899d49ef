#!/bin/bash
# Real size on one GPU (issue #18 on a CUDA device; a step of the GPU check kit):
# SD3.5-medium's seeded bf16 weights in the diffusers layout (write_weights.py,
# 2 GB shards + index), read plainly (plain_read.py: into a reused buffer, and
# into fresh memory), then one LoRA rollout at 128 px trained by `ditrl train`
# on the GPU from those files: its [load] line (the slices staged through
# pinned host blocks onto the device), the GPU allocator's peak against `ditrl
# plan`'s prediction for the same deck, and the seconds per rollout.
#   benchmarks/real_size/gpu.sh PYTHON DITRL WORK_DIR      (DEVICE=cpu: the same on the CPU)
# Needs ~5 GB of disk under WORK_DIR; the files are removed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=$1 DITRL=$(realpath "$2") WORK=$(realpath -m "$3")
deck=benchmarks/real_size/sd3.5-medium.toml
weights=$WORK/weights
run=$WORK/run
mkdir -p "$WORK"
trap 'rm -rf "$weights"' EXIT
"$DITRL" plan "$deck" --set model.lora.enabled=false >"$WORK/names"
SECONDS=0
"$PY" benchmarks/real_size/write_weights.py "$WORK/names" "$weights" --max-shard-gb 2 >"$WORK/write.log"
echo "weights written in $SECONDS s: $(du -sh "$weights" | cut -f1)"
"$PY" benchmarks/real_size/plain_read.py "$weights" --warm | tee "$WORK/plain"
rm -rf "$run"
set_weights=(--set "model.weights=$weights/diffusion_pytorch_model.safetensors.index.json" --set "run.device=${DEVICE:-cuda}")
SECONDS=0
"$DITRL" train "$deck" "${set_weights[@]}" --set "run.out_dir=$run" --set run.deterministic=false >"$WORK/train.log" 2>&1 ||
  { tail -n 20 "$WORK/train.log"; exit 1; }
grep -m1 '\[load\]' "$run/logs/rank-0.log" | sed 's/.*\[load\] /load: /' | tee "$WORK/load"
# The load's bandwidth (its bytes over the [load] line's time) against each plain read.
"$PY" - "$WORK/load" "$WORK/plain" <<'PY'
import re, sys
load, plain = (open(path).read() for path in sys.argv[1:3])
gb, s = map(float, re.search(r"slices, ([\d.]+) GB, in ([\d.]+) s", load).groups())
reused = float(re.search(r"plain read: .* = ([\d.]+) GB/s", plain).group(1))
fresh = float(re.search(r"plain read into fresh memory: .* = ([\d.]+) GB/s", plain).group(1))
print(f"load against plain read: {gb / s:.2f} GB/s = {gb / s / reused:.2f}x the reused-buffer read, "
      f"{gb / s / fresh:.2f}x the fresh-memory read")
PY
"$DITRL" plan "$deck" --ranks 1 "${set_weights[@]}" --set run.deterministic=false |
  grep -E "allocator's predicted peak|predicted peak" | sed 's/^# */plan: /'
"$PY" tools/plot_metrics.py "$run/metrics.h5" --no-plot | grep -E '^(peak memory|median seconds)'
echo "ditrl train: $SECONDS s in all (start, load, one rollout, its training step, the checkpoint)"
