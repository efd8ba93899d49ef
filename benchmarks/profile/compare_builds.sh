#!/bin/bash
# Two ditrl builds on one deck, before/after a change: alternating runs (the
# order flips every round, so both see the same background load), then per
# phase the paired ratio B/A of each round's median over rollouts 3..N, and
# whether every metric outside perf/ is bitwise equal between the builds.
#   benchmarks/profile/compare_builds.sh A_DITRL B_DITRL DECK OUT [ROUNDS=6] [-- train arguments...]
# e.g. benchmarks/profile/compare_builds.sh /tmp/ditrl-before build/ditrl /tmp/fg/work/ditrl.toml /tmp/cmp 6 -- \
#        --max-rollouts 15 --set parallel.recompute=false
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 A_DITRL B_DITRL DECK OUT [ROUNDS] [-- train arguments...]" >&2; exit 2; }
A=$(realpath "$1") B=$(realpath "$2") DECK=$3 OUT=$4
shift 4
ROUNDS=6
if [ $# -gt 0 ] && [ "$1" != "--" ]; then ROUNDS=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  order="A B"
  [ $((r % 2)) = 0 ] && order="B A"
  for side in $order; do
    bin=$A
    [ "$side" = B ] && bin=$B
    rm -rf "${OUT:?}/$side-$r"
    "$bin" train "$DECK" --set "run.out_dir=\"$OUT/$side-$r\"" "$@" >"$OUT/$side-$r.log" 2>&1 ||
      { echo "compare_builds: $side round $r failed, see $OUT/$side-$r.log" >&2; exit 1; }
  done
done
/usr/bin/python3 - "$OUT" "$ROUNDS" "$A" "$B" <<'PY'
import h5py, numpy as np, sys
out, rounds, a_bin, b_bin = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
files = {(s, r): h5py.File(f"{out}/{s}-{r}/metrics.h5") for s in "AB" for r in range(1, rounds + 1)}
print(f"A = {a_bin}\nB = {b_bin}\n{rounds} rounds; per phase, B/A of each round's median over rollouts 3..N")
for key in sorted(files[("A", 1)]["metrics/perf"]):
    if not key.endswith("_seconds"):
        continue
    ratios = []
    for r in range(1, rounds + 1):
        a, b = (np.median(files[(s, r)]["metrics/perf"][key][2:]) for s in "AB")
        if a > 0:
            ratios.append(b / a)
    if ratios:
        print(f"  {key}: median {np.median(ratios):.3f} (rounds {', '.join(f'{x:.3f}' for x in ratios)})")
names = []
files[("A", 1)].visit(lambda n: names.append(n) if isinstance(files[("A", 1)][n], h5py.Dataset) else None)
differ = [n for n in names if "/perf/" not in n
          and not np.array_equal(files[("A", 1)][n][()], files[("B", 1)][n][()], equal_nan=True)]
print("metrics outside perf/: " + ("bitwise equal" if not differ else "DIFFER: " + ", ".join(differ)))
PY
