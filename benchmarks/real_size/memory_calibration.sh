#!/bin/bash
# The memory model of `ditrl plan` (src/app/memory_plan.cpp,
# src/models/activation_memory.cpp) against measured runs where activations
# are a large part of the peak: one LoRA rollout + one training step of a
# ~100-180M-parameter model of each family (benchmarks/configs/memory-*.json,
# seeded init) at two latent grids, 1 rank, bf16 forward, math attention,
# micro-batch 2. Per run: the [load] line's RSS and peak, the peak after the
# rollout's sampling ([memory] line), the whole run's peak (/usr/bin/time),
# next to the plan's load / rollout / training predictions.
#   benchmarks/real_size/memory_calibration.sh [build/ditrl] [WORK_DIR]
#   CASES="sd3:memory-sd3:32 ..." (family:config:grid; default: every family at two grids)
#   SETS="--set rollout.guidance_scale=4.5" (extra deck overrides for every case)
set -euo pipefail
cd "$(dirname "$0")/../.."
DITRL=$(realpath "${1:-build/ditrl}")
WORK=$(realpath -m "${2:-build/bench-memory}")
CASES=${CASES:-sd3:memory-sd3:32 sd3:memory-sd3:64 qwen_image:memory-qwen-image:32 qwen_image:memory-qwen-image:64
wan:memory-wan:32 wan:memory-wan:64 ltx:memory-ltx:16 ltx:memory-ltx:32}
read -r -a EXTRA <<<"${SETS:-}"
MPI=(mpiexec --allow-run-as-root --oversubscribe --mca btl self,vader)
mkdir -p "$WORK"
for case in $CASES; do
  IFS=: read -r family config grid <<<"$case"
  name=$family-$grid${SETS:+-sets}
  out=$WORK/$name
  rm -rf "$out"
  sets=(--set "model.family=$family" --set "model.config=benchmarks/configs/$config.json" --set rollout.frames=1
    --set "rollout.height=$grid" --set "rollout.width=$grid" --set rollout.samples_per_prompt=2
    --set train.global_batch=2 --set train.micro_batch=2 --set "run.out_dir=$out" --set run.deterministic=false
    "${EXTRA[@]}")
  "$DITRL" plan benchmarks/real_size/sd3.5-medium.toml "${sets[@]}" | grep '^#   \(resident\|load\|rollout\|training\) \|^# predicted' >"$out.plan"
  echo "== $name $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  "${MPI[@]}" -n 1 /usr/bin/time -f "peak_rss_kb %M wall_s %e" -o "$out.time" \
    "$DITRL" train benchmarks/real_size/sd3.5-medium.toml "${sets[@]}" >"$out.log" 2>&1 ||
    { echo "$name failed (see $out.log)"; tail -n 5 "$out.log"; continue; }
done
/usr/bin/python3 - "$WORK" <<'PY'
import glob, os, re, sys
work = sys.argv[1]
def gb(pattern, text):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else float("nan")
print("| case | load: peak / predicted | rollout: peak / predicted | run: peak / predicted (training) | peak / predicted peak |")
print("|---|---|---|---|---|")
for plan in sorted(glob.glob(os.path.join(work, "*.plan"))):
    name = os.path.basename(plan)[:-5]
    p = open(plan).read()
    log_path = os.path.join(work, name, "logs", "rank-0.log")
    if not os.path.exists(log_path) or not os.path.exists(os.path.join(work, name + ".time")):
        continue
    log = open(log_path).read()
    t = open(os.path.join(work, name + ".time")).read()
    peak = int(re.search(r"peak_rss_kb (\d+)", t).group(1)) * 1024 / 1e9
    load_peak = gb(r"\[load\].*peak ([\d.]+) GB", log)
    rollout_peak = gb(r"\[memory\].*peak ([\d.]+) GB", log)
    pl, pr, pt = (gb(rf"#   {k}\s+([\d.]+) GB", p) for k in ("load", "rollout", "training"))
    pp = gb(r"predicted peak per rank: ([\d.]+) GB", p)
    print(f"| {name} | {load_peak:.3f} / {pl:.3f} | {rollout_peak:.3f} / {pr:.3f} | {peak:.3f} / {pt:.3f} | {peak / pp:.2f} |")
PY
