#!/bin/bash
# Real-size models on CPU ranks (benchmarks/results/real_size.md): for
# SD3.5-medium and Wan2.1-T2V-1.3B, seeded random bf16 weights in the diffusers
# layout (sharded safetensors + index, write_weights.py), then one LoRA rollout
# at 128 px on 1 and 2 ranks, each rank under /usr/bin/time for its peak RSS,
# next to `ditrl plan` at the same rank count and a plain read of the same
# bytes; then a resume of the 2-rank checkpoint at 1 rank (another rank count).
# Finally `ditrl plan` for the larger presets at 8 and 32 ranks.
#   benchmarks/real_size/run.sh [build/ditrl] [WORK_DIR]
# Needs ~9 GB of disk under WORK_DIR and ~7 GB of RAM (the 1-rank SD3 run).
set -euo pipefail
cd "$(dirname "$0")/../.."
DITRL=$(realpath "${1:-build/ditrl}")
WORK=$(realpath -m "${2:-build/bench-real-size}")
PY=${PY:-$HOME/.cache/ditrl/venv/bin/python}
MPI=(mpiexec --allow-run-as-root --oversubscribe --mca btl self,vader)
mkdir -p "$WORK"
echo "# $(date -u +%FT%TZ) $(uname -n) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) $(nproc) cores" >"$WORK/machine"

for model in sd3.5-medium wan2.1-t2v-1.3b; do
  deck=benchmarks/real_size/$model.toml
  weights=$WORK/$model/transformer
  index=$weights/diffusion_pytorch_model.safetensors.index.json
  if [ ! -f "$index" ]; then
    "$DITRL" plan "$deck" --set model.lora.enabled=false >"$WORK/$model.names"
    "$PY" benchmarks/real_size/write_weights.py "$WORK/$model.names" "$weights" --max-shard-gb 2
  fi
  # The baseline: every shard's bytes read once, plainly, right before the runs
  # (both from the page cache when it holds them: same conditions).
  /usr/bin/python3 - "$weights" >"$WORK/$model.plain" <<'PY'
import os, sys, time
files = sorted(os.path.join(sys.argv[1], f) for f in os.listdir(sys.argv[1]) if f.endswith(".safetensors"))
buf = bytearray(64 << 20)
start, n = time.perf_counter(), 0
for path in files:
    with open(path, "rb", buffering=0) as f:
        while (k := f.readinto(buf)):
            n += k
s = time.perf_counter() - start
print(f"plain read: {n / 1e9:.3f} GB in {s:.2f} s = {n / 1e9 / s:.2f} GB/s")
PY
  for ranks in 1 2; do
    out=$WORK/$model-np$ranks
    rm -rf "$out"
    "$DITRL" plan "$deck" --ranks "$ranks" | tail -n 9 >"$out.plan"
    echo "== $model $ranks ranks $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    "${MPI[@]}" -n "$ranks" sh -c '/usr/bin/time -f "rank $OMPI_COMM_WORLD_RANK peak_rss_kb %M wall_s %e" \
        -o "$0.time.$OMPI_COMM_WORLD_RANK" "$@"' "$out" "$DITRL" train "$deck" --set "model.weights=$index" \
        --set "run.out_dir=$out" --set run.deterministic=false >"$out.log" 2>&1 ||
      { echo "$model np$ranks failed (see $out.log)"; tail -n 5 "$out.log"; continue; }
  done
  # The 2-rank run's checkpoint resumed at 1 rank: one more rollout.
  out=$WORK/$model-np2
  echo "== $model resume np2 -> np1 $(date -u +%H:%M:%S)"
  "${MPI[@]}" -n 1 sh -c '/usr/bin/time -f "rank 0 peak_rss_kb %M wall_s %e" -o "$0.resume.time" "$@"' "$out" \
    "$DITRL" train "$deck" --set "model.weights=$index" --set "run.out_dir=$out" --set run.deterministic=false \
    --set train.num_rollouts=2 --resume latest >"$out.resume.log" 2>&1 ||
    { echo "$model resume failed (see $out.resume.log)"; tail -n 5 "$out.resume.log"; }
done

for preset in sd3:sd3.5-large wan:wan2.2-t2v-a14b qwen_image:qwen-image ltx:ltx-2.3; do
  for ranks in 8 32; do
    "$DITRL" plan benchmarks/real_size/sd3.5-medium.toml --set "model.family=${preset%%:*}" \
      --set "model.preset=${preset#*:}" --ranks "$ranks" | tail -n 9 >"$WORK/plan-${preset#*:}-np$ranks"
  done
done
echo "done: $WORK"
