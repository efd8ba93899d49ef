#!/usr/bin/env bash
# Cost of the canonical (rank-invariant) gradient sum: one training step of
# the SD3 ~100M config (benchmarks/configs/sd3-100m.json; 8 samples, 1
# trained step each, micro-batches of 1 pair: 4 / 2 local micro-batches at
# 2 / 4 ranks) in deterministic mode with run.rank_invariant = true (the
# canonical tree) and false (the sequential sum), alternating, REPEATS times
# each, at 2 and 4 ranks. Prints the step's perf/* seconds per run and the
# medians side by side.
#   benchmarks/scaling/rank_invariance_cost.sh build/ditrl OUT_ROOT [REPEATS]
set -euo pipefail
ditrl=$1
root=$2
repeats=${3:-3}
mkdir -p "$root"
common=(--set train.num_rollouts=1 --set checkpoint.every=0 --set rollout.batch=2 --set rollout.samples_per_prompt=4
  --set rollout.steps=2 --set rollout.window=[0,1] --set rollout.sde_steps=1 --set train.global_batch=8
  --set train.micro_batch=1 --set model.config=benchmarks/configs/sd3-100m.json)
for ranks in 2 4; do
  for ((k = 0; k < repeats; ++k)); do
    for invariant in true false; do
      out="$root/np$ranks-$invariant-$k"
      rm -rf "$out"
      mpiexec --allow-run-as-root --oversubscribe --mca btl self,vader -n "$ranks" "$ditrl" train inputs/quickstart.toml \
        "${common[@]}" --set run.rank_invariant=$invariant --set run.out_dir="$out" >"$out.log" 2>&1
    done
  done
done
/usr/bin/python3 - "$root" "$repeats" <<'PY'
import sys, statistics, h5py
root, repeats = sys.argv[1], int(sys.argv[2])
keys = ["forward_backward_seconds", "backward_seconds", "reduce_scatter_seconds", "optimizer_seconds"]
def row(path):
    with h5py.File(path + "/metrics.h5", "r") as f:
        return {k: float(f["metrics/perf/" + k][-1]) for k in keys}
print("| ranks | sum | " + " | ".join(k.replace("_seconds", " (s)") for k in keys) + " | step (fwd+bwd+opt, s) |")
print("|---|---|" + "---|" * (len(keys) + 1))
for ranks in (2, 4):
    med = {}
    for inv in ("true", "false"):
        runs = [row(f"{root}/np{ranks}-{inv}-{k}") for k in range(repeats)]
        m = {k: statistics.median(r[k] for r in runs) for k in keys}
        step = statistics.median(r["forward_backward_seconds"] + r["optimizer_seconds"] for r in runs)
        med[inv] = step
        name = "canonical tree" if inv == "true" else "sequential"
        print(f"| {ranks} | {name} | " + " | ".join(f"{m[k]:.3f}" for k in keys) + f" | {step:.3f} |")
    print(f"| {ranks} | ratio | | | | | **{med['true'] / med['false']:.3f}x** |")
PY
