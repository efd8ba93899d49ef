#!/bin/bash
# Drives the train-step and scaling benchmarks: short `ditrl train` runs
# (quickstart shapes: 2 rollouts, the second measured; 50M-300M: one) under mpiexec at
# 1, 2 and 4 ranks, then plain sequential writes of each checkpoint's bytes
# (page cache, O_DIRECT) on the same disk right after it. tools/train_step_report.py turns the runs
# into benchmarks/results/{train_step,scaling}.md and the PNG plots.
#   benchmarks/scaling/train_step.sh [build/ditrl] [RUNS_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
DITRL=$(realpath "${1:-build/ditrl}")
RUNS=$(realpath -m "${2:-build/bench-train-step}")
rm -rf "$RUNS" && mkdir -p "$RUNS"
# Unbound: mpirun binds each of up to two ranks to one core (a 1-rank run would get one).
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader)

# Benchmarks measure the default (fast) kernels: intra-op threads = cores / ranks.
COMMON=(--set run.deterministic=false --set train.num_rollouts=2 --set checkpoint.every=2 --set checkpoint.keep=1)
# A small rollout for the 50M-300M models (this 2-core machine is shared):
# 4 samples, 2 denoising steps, one trained SDE step each (global batch 4
# pairs, micro-batch 1 so 4 ranks split it), one rollout per run (cold: no warm-up rollout).
SMALL=(--set rollout.batch=1 --set rollout.samples_per_prompt=4 --set rollout.steps=2 --set "rollout.window=[0,1]"
       --set rollout.sde_steps=1 --set train.global_batch=4 --set train.micro_batch=1 --set train.num_rollouts=1
       --set checkpoint.every=1)

run() {  # run NAME RANKS ditrl-args...
  local name=$1 ranks=$2; shift 2
  local out=$RUNS/$name
  echo "== $name ($ranks ranks) $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "${MPI[*]} -n $ranks $DITRL train $* --set run.out_dir=$out" >"$RUNS/$name.cmd"
  "${MPI[@]}" -n "$ranks" "$DITRL" train "$@" --set "run.out_dir=$out" >"$RUNS/$name.log" 2>&1 ||
    { echo "$name failed (see $RUNS/$name.log)"; tail -n 5 "$RUNS/$name.log"; return 0; }
  cut -d' ' -f1-3 /proc/loadavg >"$RUNS/$name.load"
  # The baselines: the checkpoint's own bytes (read into memory first), written
  # sequentially and fsynced on the same disk, once through the page cache
  # (plain) and once with O_DIRECT (the disk's speed), each after `sync` and a
  # 5 s pause (this VM's disk slows down after a burst).
  local ckpt; ckpt=$(ls "$out"/checkpoints/step-*.h5 | tail -1)
  /usr/bin/python3 - "$ckpt" "$out/plain.bin" >"$RUNS/$name.plain" <<'PY'
import mmap, os, sys, time
n = os.path.getsize(sys.argv[1])
data = mmap.mmap(-1, n)  # page-aligned, as O_DIRECT needs
with open(sys.argv[1], "rb") as f:
    f.readinto(data)
block, view, times = 4 << 20, memoryview(data), []
for direct in (False, True):
    os.sync(); time.sleep(5)
    start = time.perf_counter()
    fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0))
    bulk = n // 4096 * 4096 if direct else n
    for at in range(0, bulk, block):
        os.write(fd, view[at:min(at + block, bulk)])
    if bulk < n:  # the tail under one block, through the page cache
        tail = os.open(sys.argv[2], os.O_WRONLY)
        os.pwrite(tail, view[bulk:], bulk)
        os.close(tail)
    os.fsync(fd)
    os.close(fd)
    times.append(time.perf_counter() - start)
    os.remove(sys.argv[2])
print(n, *times)
PY
  rm -f "$out/plain.bin"
}

QS=inputs/quickstart.toml
M100=(--set model.config=benchmarks/configs/sd3-100m.json)
machine() {
  {
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include || echo ' (+ uncommitted changes)')"
    echo "machine: $(nproc) vCPU $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(. /etc/os-release; echo "$PRETTY_NAME"), $(mpirun --version | head -1)"
  } >"$RUNS/machine.txt"
}
machine
# Most informative first: a shared machine may not give the whole matrix time.
for n in 1 2 4; do run "quickstart-np$n" $n $QS "${COMMON[@]}"; done
run sd3-100m-np2 2 $QS "${COMMON[@]}" "${SMALL[@]}" "${M100[@]}"
run size-tiny-np2 2 $QS "${COMMON[@]}" "${SMALL[@]}"
run size-50m-np2 2 $QS "${COMMON[@]}" "${SMALL[@]}" --set model.config=benchmarks/configs/sd3-50m.json
for n in 1 4; do run "sd3-100m-np$n" $n $QS "${COMMON[@]}" "${SMALL[@]}" "${M100[@]}"; done
# Weak scaling: 4 samples per rank (batch N prompts x 4 samples).
for n in 1 2 4; do
  run "weak-np$n" $n $QS "${COMMON[@]}" --set rollout.batch=$n --set train.global_batch=$((4 * n)) --set train.micro_batch=4
done
run size-300m-np2 2 $QS "${COMMON[@]}" "${SMALL[@]}" --set model.config=benchmarks/configs/sd3-300m.json
echo "end: $(date -u '+%Y-%m-%d %H:%M UTC')" >>"$RUNS/machine.txt"
echo "runs in $RUNS; report: /usr/bin/python3 tools/train_step_report.py $RUNS"
