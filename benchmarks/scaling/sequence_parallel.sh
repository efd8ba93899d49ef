#!/bin/bash
# Sequence parallelism on the CPU: one training step (one rollout of 4
# samples, 2 denoising steps, one trained SDE step each) of a ~118M Wan-style
# DiT (benchmarks/configs/wan-100m.json) at 1024 tokens per sample, on 4 ranks
# at parallel.sequence_parallel = 1 (the baseline: each rank one whole sample),
# 2 and 4 (a sample's tokens split over 2 or 4 ranks). Same global batch and
# world, so the ranks do the same arithmetic; what changes is the activation
# memory per rank and the all-to-alls. perf/* rows of each run's metrics.h5
# give peak RSS (max over ranks) and the phase times; the report is
# benchmarks/results/sequence_parallel.md.
#   benchmarks/scaling/sequence_parallel.sh [build/ditrl] [RUNS_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
DITRL=$(realpath "${1:-build/ditrl}")
RUNS=$(realpath -m "${2:-build/bench-sequence-parallel}")
rm -rf "$RUNS" && mkdir -p "$RUNS"
MPI=(mpiexec --allow-run-as-root --oversubscribe --mca btl self,vader)
DECK=tests/e2e/decks/wan_sequence_parallel.toml
ARGS=(--set run.deterministic=false --set model.config=benchmarks/configs/wan-100m.json
      --set rollout.batch=1 --set rollout.samples_per_prompt=4 --set rollout.steps=2 --set "rollout.window=[0,1]"
      --set rollout.sde_steps=1 --set rollout.microgroup=1 --set rollout.frames=1 --set rollout.height=64
      --set rollout.width=64 --set train.global_batch=4 --set train.micro_batch=1 --set train.num_rollouts=1
      --set checkpoint.every=1000 --set data.synthetic_prompts=4)
for sp in 1 2 4; do
  out=$RUNS/sp$sp
  echo "== sequence_parallel = $sp $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "${MPI[*]} -n 4 $DITRL train $DECK ${ARGS[*]} --set parallel.sequence_parallel=$sp --set run.out_dir=$out" >"$RUNS/sp$sp.cmd"
  "${MPI[@]}" -n 4 "$DITRL" train "$DECK" "${ARGS[@]}" --set "parallel.sequence_parallel=$sp" --set "run.out_dir=$out" \
    >"$RUNS/sp$sp.log" 2>&1 || { echo "sp$sp failed (see $RUNS/sp$sp.log)"; tail -n 5 "$RUNS/sp$sp.log"; exit 1; }
  cut -d' ' -f1-3 /proc/loadavg >"$RUNS/sp$sp.load"
  "$DITRL" plan "$DECK" "${ARGS[@]}" --set "parallel.sequence_parallel=$sp" --ranks 4 | grep "^#   sequence_parallel = $sp" >"$RUNS/sp$sp.plan" || true
done
/usr/bin/python3 - "$RUNS" <<'PY'
import sys, h5py
runs = sys.argv[1]
keys = ["perf/peak_rss_bytes", "perf/rollout_seconds", "perf/forward_seconds", "perf/backward_seconds",
        "perf/forward_backward_seconds", "perf/gather_seconds", "perf/reduce_scatter_seconds"]
rows = {}
for sp in (1, 2, 4):
    with h5py.File(f"{runs}/sp{sp}/metrics.h5", "r") as f:
        rows[sp] = {k: float(f["metrics/" + k][-1]) for k in keys if "metrics/" + k in f}
    rows[sp]["plan"] = open(f"{runs}/sp{sp}.plan").read().strip()
    rows[sp]["load"] = open(f"{runs}/sp{sp}.load").read().strip()
print("| metric | SP 1 (baseline) | SP 2 | SP 4 | SP 2 / SP 1 | SP 4 / SP 1 |")
print("|---|---|---|---|---|---|")
for k in keys:
    if k not in rows[1]:
        continue
    scale, unit = (1 / 2**20, " MiB") if k.endswith("bytes") else (1, " s")
    v = [rows[sp][k] * scale for sp in (1, 2, 4)]
    print(f"| {k} | {v[0]:.1f}{unit} | {v[1]:.1f}{unit} | {v[2]:.1f}{unit} | {v[1] / v[0]:.2f} | {v[2] / v[0]:.2f} |")
for sp in (1, 2, 4):
    print(f"\nSP {sp}: load after {rows[sp]['load']}; ditrl plan (model): {rows[sp]['plan']}")
PY
