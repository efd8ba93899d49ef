#!/bin/bash
# Two builds' bench_sha256 (benchmarks/profile/sha256.cpp) on the same bytes,
# alternating, the order flipped every round so both see the same background
# load. Prints every run (round, side, best and median GB/s of its passes over
# wall time, the same over CPU time, digest), then for each of those four
# rates: per side the median over rounds, and the paired ratio B/A of each
# round (median, min, max); and whether all digests agree.
# benchmarks/results/sha256.md holds the result.
#   benchmarks/profile/sha256.sh A_BENCH B_BENCH [ROUNDS=10] [-- bench_sha256 arguments...]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 A_BENCH B_BENCH [ROUNDS] [-- bench_sha256 arguments...]" >&2; exit 2; }
A=$(realpath "$1") B=$(realpath "$2")
shift 2
ROUNDS=10
if [ $# -gt 0 ] && [ "$1" != "--" ]; then ROUNDS=$1; shift; fi
[ "${1:-}" = "--" ] && shift

for ((round = 1; round <= ROUNDS; ++round)); do
  sides=(A B)
  ((round % 2)) || sides=(B A)
  for side in "${sides[@]}"; do
    bench=$A
    [ "$side" = B ] && bench=$B
    echo "$round $side $("$bench" "$@")"
  done
done | python3 -c '
import statistics, sys
runs = [line.split() for line in sys.stdin]
for r in runs: print(" ".join(r))
for column, what in ((2, "best wall"), (3, "median wall"), (4, "best CPU"), (5, "median CPU")):
    rate = {s: {int(r[0]): float(r[column]) for r in runs if r[1] == s} for s in "AB"}
    ratios = [rate["B"][k] / rate["A"][k] for k in sorted(rate["A"])]
    sides = ", ".join(f"{s} {statistics.median(rate[s].values()):.3f}" for s in "AB")
    print(f"{what} pass of each run: median rate over rounds {sides}; B/A per round: median "
          f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f} ({len(ratios)} rounds)")
print("digests:", "all equal" if len({r[6] for r in runs}) == 1 else "DIFFER")
'
