#!/usr/bin/env bash
# Fails when the committed deck reference is not what `ditrl deck-reference`
# writes now: the reference is generated from the deck schema, so a key added,
# renamed or re-documented in config/sections.hpp must come with it.
# Usage: deck_reference_current.sh DITRL COMMITTED_FILE WORK_DIR
set -euo pipefail
ditrl=$1 committed=$2 work=$3
mkdir -p "$work"
fresh="$work/deck-reference.md"
"$ditrl" deck-reference --out "$fresh"
if ! diff -u "$committed" "$fresh"; then
  echo "$committed is stale (the diff above is what the schema says now); regenerate it with:" >&2
  echo "  build/ditrl deck-reference --out docs/deck-reference.md" >&2
  exit 1
fi
echo "$committed is current"
