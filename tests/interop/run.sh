#!/usr/bin/env bash
# Runs an interop driver with the venv's Python (scripts/deps.sh makes it);
# SKIPPED (exit 77) with the reason when that Python is absent.
python=$1
shift
if [[ ! -x "$python" ]]; then
  echo "SKIPPED: no Python venv at $python (run scripts/deps.sh, or set DITRL_VENV / -DDITRL_PYTHON)"
  exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$python" "$@"
