#!/usr/bin/env bash
# A CPU-only build on a machine with NVIDIA GPUs (CTest device.unused_gpu_warning):
#   tests/preflight/unused_gpu.sh DITRL "MPIEXEC ARGS" WORK_DIR SOURCE_DIR
# DITRL_FAKE_NVIDIA_GPUS=2 (test-only) stands for the GPUs. run.device = "auto"
# trains on the CPU with a WARNING block on rank 0's log and "2 NVIDIA GPU(s) on
# this machine unused" in metrics.h5's `device` attribute; "cuda" is the named
# error of a CPU-only build. The negative control (no warning, device "cpu"
# without the variable on this GPU-less machine) is in preflight.pass.*, whose
# job starts the same way and prints the same identity.
set -uo pipefail
ditrl=$1 mpiexec=$2 work=$3 src=$4
deck=$src/inputs/quickstart.toml
fail() { echo "FAIL: $*"; exit 1; }
if "$ditrl" --version | grep -q '(CUDA build,'; then
  echo "SKIPPED: a CUDA build (the warning is for CPU-only builds)"; exit 77
fi
if [[ -e /dev/nvidia0 || -d /proc/driver/nvidia/gpus ]]; then
  echo "SKIPPED: this machine has NVIDIA GPUs, so the run without DITRL_FAKE_NVIDIA_GPUS is no control"; exit 77
fi
rm -rf "$work" && mkdir -p "$work"
device_attribute() { h5dump -a /device "$1/metrics.h5" | sed -n 's/^ *(0): "\(.*\)"$/\1/p'; }

# shellcheck disable=SC2086  # the launcher's arguments split on purpose
timeout 300 $mpiexec -np 1 -x DITRL_FAKE_NVIDIA_GPUS=2 "$ditrl" train "$deck" --set run.out_dir="$work/faked" \
  --max-rollouts 1 >"$work/faked.stdout" 2>&1 || { cat "$work/faked.stdout"; fail "the faked-GPU run failed"; }
grep -q "WARNING: this machine has 2 NVIDIA GPU(s), but this ditrl is a CPU-only build" "$work/faked/logs/rank-0.log" ||
  { cat "$work/faked.stdout"; fail "no WARNING block in rank 0's log"; }
attribute=$(device_attribute "$work/faked")
[[ $attribute == "cpu (CPU-only build; 2 NVIDIA GPU(s) on this machine unused)" ]] ||
  fail "metrics.h5 device attribute: '$attribute'"

# shellcheck disable=SC2086
DITRL_FAKE_NVIDIA_GPUS=2 timeout 300 $mpiexec -np 1 -x DITRL_FAKE_NVIDIA_GPUS "$ditrl" train "$deck" \
  --set run.out_dir="$work/cuda" --set run.device=cuda >"$work/cuda.stdout" 2>&1 && fail "run.device = cuda trained"
grep -q "'run.device' = \"cuda\" needs a CUDA build of ditrl" "$work/cuda.stdout" ||
  { cat "$work/cuda.stdout"; fail "run.device = cuda: not the named error"; }
echo "device.unused_gpu_warning: ok"
