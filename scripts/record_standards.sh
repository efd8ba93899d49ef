#!/usr/bin/env bash
# Re-records the e2e standards in tests/standards/ from fresh runs of their
# decks (2 ranks, deterministic mode). Tolerances already in a standard file
# are kept with their reasons. Review the diff before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DITRL_BIN:-build/ditrl}
for deck in tests/standards/*.toml; do
  name=$(basename "$deck" .toml)
  out=$(mktemp -d)
  mpiexec --allow-run-as-root --oversubscribe -np 2 "$BIN" train "$deck" --set run.out_dir="$out"
  "$BIN" standard record "$out" "tests/standards/$name.json"
  rm -rf "$out"
done
