#!/usr/bin/env bash
# Cost of deterministic mode's MKL pin, MKL_CBWR=AVX2,STRICT, against the
# non-strict MKL_CBWR=AVX2 it replaced: one rollout and one training step of
# the SD3 ~100M config (benchmarks/configs/sd3-100m.json, fp32 forward, LoRA
# off, 8 samples of 2 steps, micro-batches of 2) at 1 rank, alternating the
# two pins REPEATS times (ditrl keeps an MKL_CBWR the environment sets).
# Prints each run's whole-process wall time and its perf/* seconds, the
# medians, the ratio, and whether the two pins gave the same metrics bits.
#   benchmarks/profile/mkl_strict_cost.sh build/ditrl OUT_ROOT [REPEATS]
set -euo pipefail
ditrl=$1
root=$2
repeats=${3:-3}
mkdir -p "$root"
common=(--set train.num_rollouts=1 --set checkpoint.every=0 --set rollout.batch=2 --set rollout.samples_per_prompt=4
  --set rollout.steps=2 --set rollout.window=[0,1] --set rollout.sde_steps=1 --set train.global_batch=8
  --set train.micro_batch=2 --set precision.forward=fp32 --set model.config=benchmarks/configs/sd3-100m.json)
for ((k = 0; k < repeats; ++k)); do
  for pin in strict plain; do
    value=AVX2,STRICT
    [[ $pin == plain ]] && value=AVX2
    out="$root/$pin-$k"
    rm -rf "$out"
    start=$(date +%s.%N)
    MKL_CBWR=$value mpiexec --allow-run-as-root --oversubscribe --mca btl self,vader -n 1 "$ditrl" train \
      inputs/quickstart.toml "${common[@]}" --set run.out_dir="$out" >"$out.log" 2>&1
    echo "$(date +%s.%N) - $start" | bc >"$out.wall"
  done
done
/usr/bin/python3 - "$root" "$repeats" <<'PY'
import sys, statistics, h5py, numpy as np
root, repeats = sys.argv[1], int(sys.argv[2])
keys = ["rollout_seconds", "forward_backward_seconds", "optimizer_seconds"]
def run(path):
    with h5py.File(path + "/metrics.h5", "r") as f:
        perf = {k: float(f["metrics/perf/" + k][-1]) for k in keys}
        series = {}
        f["metrics"].visititems(lambda n, d: series.__setitem__(n, d[()]) if hasattr(d, "shape") and not n.startswith("perf") else None)
    perf["wall"] = float(open(path + ".wall").read())
    return perf, series
print("| pin | run | wall (s) | " + " | ".join(k.replace("_seconds", " (s)") for k in keys) + " |")
print("|---|---|---|" + "---|" * len(keys))
med, bits = {}, {}
for pin, name in (("strict", "AVX2,STRICT"), ("plain", "AVX2")):
    runs = [run(f"{root}/{pin}-{k}") for k in range(repeats)]
    for k, (perf, _) in enumerate(runs):
        print(f"| {name} | {k} | {perf['wall']:.2f} | " + " | ".join(f"{perf[x]:.3f}" for x in keys) + " |")
    med[pin] = {x: statistics.median(r[0][x] for r in runs) for x in ["wall"] + keys}
    bits[pin] = runs[0][1]
for x in ["wall"] + keys:
    print(f"median {x}: STRICT {med['strict'][x]:.3f} / AVX2 {med['plain'][x]:.3f} = {med['strict'][x] / med['plain'][x]:.3f}x")
same = bits["strict"].keys() == bits["plain"].keys() and all(
    np.array_equal(bits["strict"][n], bits["plain"][n], equal_nan=True) for n in bits["strict"])
print("metrics (perf/* aside) bitwise equal between the pins:", same)
PY
