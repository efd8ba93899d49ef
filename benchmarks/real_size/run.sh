#!/bin/bash
# Real-size models on CPU ranks (benchmarks/results/real_size.md): for
# SD3.5-medium and Wan2.1-T2V-1.3B, seeded random bf16 weights in the diffusers
# layout (sharded safetensors + index, write_weights.py), then one LoRA rollout
# at 128 px on 1 and 2 ranks, each rank under /usr/bin/time for its peak RSS,
# next to `ditrl plan` at the same rank count and a plain read of the same
# bytes. A 2-rank run's checkpoint is then loaded at 1 rank (another rank
# count: `--resume latest` with nothing left to train) and exported merged
# (the streamed export, under /usr/bin/time). Finally `ditrl plan` for the
# larger presets at 8 and 32 ranks.
#   benchmarks/real_size/run.sh [build/ditrl] [WORK_DIR]
#   CASES="sd3.5-medium:2 wan2.1-t2v-1.3b:1" (default: every model at 1 and 2 ranks)
# Needs ~9 GB of disk under WORK_DIR and ~7 GB of RAM (the 1-rank SD3 run).
set -euo pipefail
cd "$(dirname "$0")/../.."
DITRL=$(realpath "${1:-build/ditrl}")
WORK=$(realpath -m "${2:-build/bench-real-size}")
PY=${PY:-$HOME/.cache/ditrl/venv/bin/python}
CASES=${CASES:-sd3.5-medium:1 sd3.5-medium:2 wan2.1-t2v-1.3b:1 wan2.1-t2v-1.3b:2}
# Unbound ranks, as under Slurm with --cpus-per-task: mpirun binds each of up
# to two ranks to one core, which would leave a 1-rank run one core.
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader)
mkdir -p "$WORK"
echo "# $(date -u +%FT%TZ) $(uname -n) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) $(nproc) cores" >"$WORK/machine"

weights_of() { echo "$WORK/$1/transformer/diffusion_pytorch_model.safetensors.index.json"; }

prepare() {  # $1 model: the weights once, then the plain-read baseline right before its runs
  local model=$1 deck=benchmarks/real_size/$1.toml weights=$WORK/$1/transformer
  if [ ! -f "$(weights_of "$model")" ]; then
    "$DITRL" plan "$deck" --set model.lora.enabled=false >"$WORK/$model.names"
    "$PY" benchmarks/real_size/write_weights.py "$WORK/$model.names" "$weights" --max-shard-gb 2
  fi
  # Every shard's bytes read plainly (benchmarks/real_size/plain_read.py).
  /usr/bin/python3 benchmarks/real_size/plain_read.py "$weights" --warm >"$WORK/$model.plain"
}

for case in $CASES; do
  model=${case%%:*} ranks=${case#*:}
  deck=benchmarks/real_size/$model.toml
  prepare "$model"
  out=$WORK/$model-np$ranks
  rm -rf "$out"
  "$DITRL" plan "$deck" --ranks "$ranks" | grep -v "^[a-z].*  \[[0-9]" >"$out.plan"  # all but the parameter rows
  echo "== $model $ranks ranks $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$out.load"
  "${MPI[@]}" -n "$ranks" sh -c '/usr/bin/time -f "rank $OMPI_COMM_WORLD_RANK peak_rss_kb %M wall_s %e" \
      -o "$0.time.$OMPI_COMM_WORLD_RANK" "$@"' "$out" "$DITRL" train "$deck" --set "model.weights=$(weights_of "$model")" \
      --set "run.out_dir=$out" --set run.deterministic=false >"$out.log" 2>&1 ||
    { echo "$model np$ranks failed (see $out.log)"; tail -n 5 "$out.log"; continue; }
  echo "   done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out.load"
  [ "$ranks" = 2 ] || continue
  # The 2-rank checkpoint at 1 rank: its slabs read by another layout, then
  # nothing left to train.
  echo "== $model resume np2 -> np1 $(date -u +%H:%M:%S)"
  "${MPI[@]}" -n 1 /usr/bin/time -f "rank 0 peak_rss_kb %M wall_s %e" -o "$out.resume.time" \
    "$DITRL" train "$deck" --set "model.weights=$(weights_of "$model")" --set "run.out_dir=$out" \
    --set run.deterministic=false --resume latest >"$out.resume.log" 2>&1 ||
    { echo "$model resume failed (see $out.resume.log)"; tail -n 5 "$out.resume.log"; }
  # The streamed export of the same checkpoint: adapters and the merged model.
  echo "== $model export --merged $(date -u +%H:%M:%S)"
  /usr/bin/time -f "peak_rss_kb %M wall_s %e" -o "$out.export.time" \
    "$DITRL" export "$out/checkpoints/step-1.h5" --out "$out/export" --merged --dtype bf16 --max-shard-size 2GB \
    >"$out.export.log" 2>&1 || { echo "$model export failed (see $out.export.log)"; tail -n 5 "$out.export.log"; }
done

# (Wan2.2 A14B's low-noise expert needs its own guidance scale: 1, no CFG, as the deck's.)
for preset in sd3:sd3.5-large wan:wan2.2-t2v-a14b qwen_image:qwen-image ltx:ltx-2.3; do
  for ranks in 8 32; do
    extra=()
    [ "${preset#*:}" = wan2.2-t2v-a14b ] && extra=(--set rollout.guidance_scale_2=1.0)
    "$DITRL" plan benchmarks/real_size/sd3.5-medium.toml --set "model.family=${preset%%:*}" "${extra[@]}" \
      --set "model.preset=${preset#*:}" --ranks "$ranks" | grep -v "^[a-z].*  \[[0-9]" >"$WORK/plan-${preset#*:}-np$ranks"
  done
done
echo "done: $WORK"
