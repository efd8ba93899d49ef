#!/usr/bin/env bash
# Re-records the e2e standards in tests/standards/ from fresh runs of their
# decks (2 ranks, deterministic mode): every deck, or only the named ones
# (e.g. `scripts/record_standards.sh proxy_sd3_grpo proxy_wan22_grpo`).
# Tolerances already in a standard file are kept with their reasons. Review
# the diff before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DITRL_BIN:-build/ditrl}
if [ $# -gt 0 ]; then
  decks=()
  for name in "$@"; do
    [ -f "tests/standards/$name.toml" ] || { echo "no deck tests/standards/$name.toml" >&2; exit 2; }
    decks+=("tests/standards/$name.toml")
  done
else
  decks=(tests/standards/*.toml)
fi
for deck in "${decks[@]}"; do
  name=$(basename "$deck" .toml)
  out=$(mktemp -d)
  mpiexec --allow-run-as-root --oversubscribe -np 2 "$BIN" train "$deck" --set run.out_dir="$out"
  "$BIN" standard record "$out" "tests/standards/$name.json"
  rm -rf "$out"
done
