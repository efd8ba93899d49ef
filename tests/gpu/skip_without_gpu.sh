#!/usr/bin/env bash
# Runs a `gpu`-labelled test where this process sees enough GPUs; otherwise
# says why not and exits 77, which CTest reports as SKIPPED (SKIP_RETURN_CODE).
# A probe that cannot run (a broken build) fails the test instead.
#   tests/gpu/skip_without_gpu.sh GPUS_NEEDED VISIBLE_GPUS_PROBE COMMAND...
need=$1 probe=$2
shift 2
if ! have=$("$probe"); then
  echo "skip_without_gpu.sh: $probe failed; cannot tell how many GPUs are visible"
  exit 1
fi
if ((have < need)); then
  echo "SKIPPED: needs $need GPU(s), $have visible (CUDA_VISIBLE_DEVICES${CUDA_VISIBLE_DEVICES+=$CUDA_VISIBLE_DEVICES}${CUDA_VISIBLE_DEVICES-" unset"})"
  exit 77
fi
exec "$@"
