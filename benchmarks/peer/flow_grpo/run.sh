#!/usr/bin/env bash
# The whole GRPO job, ditrl vs flow_grpo's own SD3 training loop (issue #20 point 3). See README.md here.
#
#   benchmarks/peer/flow_grpo/run.sh DITRL FLOW_GRPO OUT [ROUNDS] [ITERATIONS]
#
#   DITRL       the ditrl binary (e.g. build/ditrl)
#   FLOW_GRPO   a checkout of github.com/yifan123/flow_grpo (brought in at benchmark time, never committed)
#   OUT         output folder (work inputs, every run's logs and metrics, summary.md, summary.json, PNG)
#   ROUNDS      rounds of (ditrl, flow_grpo), the order alternating per round (default 5)
#   ITERATIONS  GRPO iterations per run (default 30; ~12 min in all with 5 rounds on the 2-core VM)
#
# Environment: PYTHON (default ~/.cache/ditrl/venv/bin/python: torch, diffusers, accelerate, h5py, matplotlib
# and benchmarks/peer/flow_grpo/requirements.txt), MPIRUN (default mpirun), DITRL_2RANKS=0 to skip the extra
# 2-rank ditrl run of each round, FLOW_GRPO_COMMIT (recorded when FLOW_GRPO is not a git checkout),
# PNG (default OUT/flow_grpo_loop.png), DITRL_SET: extra deck settings for ditrl's runs, blank-separated
# (e.g. "parallel.recompute=false precision.attention=flash train.fused_adamw=true"), FLOW_GRPO_PRELOAD: a
# malloc library flow_grpo's Python runs on (LD_PRELOAD; e.g. libtcmalloc_minimal.so.4, its best case here).
set -euo pipefail

if [ $# -lt 3 ]; then
  sed -n 2,17p "$0"
  exit 2
fi
HERE=$(cd "$(dirname "$0")" && pwd)
DITRL=$(realpath "$1")
FLOW_GRPO=$(realpath "$2")
mkdir -p "$3"
OUT=$(realpath "$3")
ROUNDS=${4:-5}
ITERATIONS=${5:-30}
PYTHON=${PYTHON:-$HOME/.cache/ditrl/venv/bin/python}
MPIRUN=${MPIRUN:-mpirun}
DITRL_2RANKS=${DITRL_2RANKS:-1}
DITRL_EXTRA=()
for setting in ${DITRL_SET:-}; do DITRL_EXTRA+=(--set "$setting"); done
PNG=${PNG:-$OUT/flow_grpo_loop.png}

[ -x "$DITRL" ] || { echo "run.sh: $DITRL is not an executable" >&2; exit 2; }
[ -f "$FLOW_GRPO/scripts/train_sd3.py" ] || { echo "run.sh: $FLOW_GRPO has no scripts/train_sd3.py" >&2; exit 2; }

# Both sides: one intra-op thread (ditrl: run.threads = 1 in the deck, per rank).
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

"$PYTHON" "$HERE/prepare.py" "$OUT/work" --iterations "$ITERATIONS"

flow_commit=${FLOW_GRPO_COMMIT:-$(git -C "$FLOW_GRPO" rev-parse HEAD 2>/dev/null || echo unknown)}
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(getconf _NPROCESSORS_ONLN) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "ditrl: $DITRL; benchmark scripts at $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "ditrl version: $("$DITRL" --version 2>/dev/null | head -1)"
  echo "flow_grpo: $FLOW_GRPO @ $flow_commit"
  echo "python: $("$PYTHON" -c 'import sys, torch, diffusers, accelerate; print(sys.version.split()[0], "torch", torch.__version__, "diffusers", diffusers.__version__, "accelerate", accelerate.__version__)')"
  echo "rounds: $ROUNDS, iterations: $ITERATIONS, threads: 1, ditrl 2-rank runs: $DITRL_2RANKS"
  echo "ditrl extra settings: ${DITRL_SET:-none}"
  echo "flow_grpo LD_PRELOAD: ${FLOW_GRPO_PRELOAD:-none: glibc malloc}"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"
: > "$OUT/timeline.tsv"   # round, side, start, end, wall seconds, load averages before

stamp() { date +%s.%N; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

run_ditrl() {  # round ranks
  local name="ditrl-np$2-r$1" t0 t1 l micro
  # Each rank samples and trains its share: 16 / ranks samples, the micro-batch its whole local batch.
  micro=$(( $(grep -m1 '^global_batch' "$OUT/work/ditrl.toml" | tr -dc 0-9) / $2 ))
  rm -rf "${OUT:?}/$name"
  l=$(load)
  t0=$(stamp)
  "$MPIRUN" --allow-run-as-root --oversubscribe -np "$2" "$DITRL" train "$OUT/work/ditrl.toml" \
    --set "run.out_dir=\"$OUT/$name\"" --set "train.micro_batch=$micro" ${DITRL_EXTRA[@]+"${DITRL_EXTRA[@]}"} > "$OUT/$name.log" 2>&1 || { echo "run.sh: $name failed, see $OUT/$name.log" >&2; tail -20 "$OUT/$name.log" >&2; exit 1; }
  t1=$(stamp)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "ditrl-np$2" "$t0" "$t1" "$(echo "$t1 - $t0" | bc)" "$l" >> "$OUT/timeline.tsv"
  echo "round $1: $name $(echo "$t1 - $t0" | bc) s wall (load before: $l)"
}

run_flow_grpo() {  # round
  local name="flow_grpo-r$1" t0 t1 l
  l=$(load)
  t0=$(stamp)
  LD_PRELOAD=${FLOW_GRPO_PRELOAD:-} "$PYTHON" "$HERE/flow_grpo_driver.py" --flow-grpo "$FLOW_GRPO" --settings "$OUT/work/settings.json" \
    --out "$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1 || { echo "run.sh: $name failed, see $OUT/$name.log" >&2; tail -20 "$OUT/$name.log" >&2; exit 1; }
  t1=$(stamp)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "flow_grpo" "$t0" "$t1" "$(echo "$t1 - $t0" | bc)" "$l" >> "$OUT/timeline.tsv"
  echo "round $1: $name $(echo "$t1 - $t0" | bc) s wall (load before: $l)"
}

for r in $(seq 1 "$ROUNDS"); do
  echo "round $r: uptime: $(uptime)" | tee -a "$OUT/uptime.txt"
  if [ $((r % 2)) -eq 1 ]; then
    run_ditrl "$r" 1
    run_flow_grpo "$r"
  else
    run_flow_grpo "$r"
    run_ditrl "$r" 1
  fi
  if [ "$DITRL_2RANKS" = 1 ]; then run_ditrl "$r" 2; fi
done
echo "end: uptime: $(uptime)" | tee -a "$OUT/uptime.txt"

"$PYTHON" "$HERE/summarize.py" "$OUT" --png "$PNG"
