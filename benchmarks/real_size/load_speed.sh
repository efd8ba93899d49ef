#!/bin/bash
# Sliced loading against a plain read of the same files, interleaved over
# ROUNDS rounds on the shared machine (benchmarks/results/real_size.md): per
# round, a plain read of every shard into one reused 64 MB buffer, a plain
# read into fresh memory kept until the end (what any loader that keeps the
# bytes pays: every page faulted in and cleared by the kernel), then ditrl's
# load at 1 and 2 ranks (`train --resume latest` on a run that run.sh
# finished, so each process loads the base weights and its checkpoint, then
# has nothing left to train; the [load] line times the base weights).
#   benchmarks/real_size/load_speed.sh MODEL [build/ditrl] [WORK_DIR]   (after run.sh for MODEL at 2 ranks)
#   ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=$1
DITRL=$(realpath "${2:-build/ditrl}")
WORK=$(realpath -m "${3:-build/bench-real-size}")
ROUNDS=${ROUNDS:-3}
# Unbound ranks, as under Slurm with --cpus-per-task: mpirun binds each of up
# to two ranks to one core, which would leave a 1-rank run one core.
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader)
weights=$WORK/$MODEL/transformer
run=$WORK/$MODEL-np2
[ -f "$run/checkpoints/step-1.h5" ] || { echo "run benchmarks/real_size/run.sh for $MODEL at 2 ranks first" >&2; exit 1; }
out=$WORK/$MODEL.load_speed
: >"$out"
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
  /usr/bin/python3 benchmarks/real_size/plain_read.py "$weights" >>"$out"
  for ranks in 1 2; do
    "${MPI[@]}" -n "$ranks" "$DITRL" train "benchmarks/real_size/$MODEL.toml" \
      --set "model.weights=$weights/diffusion_pytorch_model.safetensors.index.json" --set "run.out_dir=$run" \
      --set run.deterministic=false --resume latest >"$out.np$ranks.log" 2>&1
    for r in $(seq 0 $((ranks - 1))); do
      echo "np$ranks $(grep '\[load\]' "$run/logs/rank-$r.log" | tail -n 1 | sed 's/.*\[load\] //')" >>"$out"
    done
  done
done
/usr/bin/python3 - "$out" <<'PY'
import re, statistics, sys
text = open(sys.argv[1]).read()
reused = [float(x) for x in re.findall(r"plain read: .* = ([\d.]+) GB/s", text)]
fresh = [float(x) for x in re.findall(r"plain read into fresh memory: .* = ([\d.]+) GB/s", text)]
print(f"plain read, reused buffer: median {statistics.median(reused):.2f} GB/s {reused}")
print(f"plain read, fresh memory:  median {statistics.median(fresh):.2f} GB/s {fresh}")
for ranks in (1, 2):
    rows = re.findall(rf"^np{ranks} .*?([\d.]+) GB, in ([\d.]+) s", text, re.M)
    # aggregate per round: every rank's bytes over the slowest rank's time
    agg = []
    for i in range(0, len(rows), ranks):
        group = rows[i:i + ranks]
        agg.append(sum(float(b) for b, _ in group) / max(float(s) for _, s in group))
    if agg:
        m = statistics.median(agg)
        print(f"ditrl at {ranks} rank(s): median {m:.2f} GB/s {[round(a, 2) for a in agg]}: "
              f"{m / statistics.median(reused):.2f}x the reused-buffer read, {m / statistics.median(fresh):.2f}x the fresh-memory read")
PY
