#!/usr/bin/env bash
# Runs decks at several rank counts and compares their metrics.h5 row by row
# (tools/compare_ranks.py, perf/* excluded): which series differ, from which
# optimizer step. Usage (from the repository root, after a build):
#   scripts/rank_invariance.sh [OUT_ROOT] [DECK...]
# Defaults: runs/rank-invariance, the quickstart (3 rollouts) and every recipe proxy.
# RANKS="1 2 4" chooses the rank counts.
set -uo pipefail
out_root=${1:-runs/rank-invariance}
shift || true
decks=("$@")
[[ ${#decks[@]} -gt 0 ]] || decks=(inputs/quickstart.toml tests/standards/proxy_*.toml)
ranks=${RANKS:-1 2 4}
mkdir -p "$out_root"
status=0
for deck in "${decks[@]}"; do
  name=$(basename "$deck" .toml)
  files=()
  for n in $ranks; do
    out="$out_root/$name-$n"
    rm -rf "$out"
    mpiexec --allow-run-as-root --oversubscribe --mca btl self,vader -np "$n" build/ditrl train "$deck" \
      --set run.out_dir="$out" --set train.num_rollouts=3 --set checkpoint.every=0 >"$out_root/$name-$n.log" 2>&1 ||
      { echo "$deck at $n ranks failed: $out_root/$name-$n.log"; status=1; continue; }
    files+=("$out/metrics.h5")
  done
  echo "== $deck"
  /usr/bin/python3 tools/compare_ranks.py "${files[@]}" || status=1
done
exit $status
