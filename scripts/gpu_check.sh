#!/usr/bin/env bash
# The GPU check kit: on a bare machine with NVIDIA GPUs, a python3 holding
# torch 2.x with CUDA, cmake, ninja and a C++ compiler (no package registry),
# builds ditrl with CUDA against that torch and the libraries of kit/prefix
# (scripts/prepare_gpu_kit.sh makes it, kit/prefix.tar.xz carries it), then
# runs the `gpu` tests, the quickstart on the GPU and the GPU benchmark
# (benchmarks/gpu/run.sh), and writes every log and result into one folder.
# Without a GPU the same steps run what they can: the build, the gpu tests
# (each reports SKIPPED with its reason), the no-GPU checks of the CUDA build
# instead of the GPU quickstart (the benchmark needs a GPU).
#
#   bash scripts/gpu_check.sh [--build-dir DIR] [--results DIR] [--pack FILE.tar.gz] [--budget SECONDS] [--only STEP,...]
#
# On the device machine (target: 8 minutes in all on one H200; every step passed in 445 s there
# on 2026-12-04), inside one 600 s call (carry: kit/prefix.tar.xz):
#   DITRL_COMMIT=<commit> bash scripts/gpu_check.sh --budget 540 --results /tmp/gpu-check --pack $OUT/gpu_check.tar.gz
# (DITRL_COMMIT names the commit in the summary and `ditrl --version`: the copied tree's .git may be stale)
# --budget: the steps end by then (each one's limit is cut to the time left; one that would start
# with under a minute left is not started) and the results are packed, so a call that runs out
# of time still returns every finished step's log. Steps run in order of what they prove: build,
# gpu tests, the multi-rank suites at 2 and 4 ranks on one GPU over the MPI data backend (mpi_data,
# 150 s), `ditrl preflight` at 1 and 2 ranks on the GPU (preflight, 150 s), quickstart curves,
# the benchmark (one model per step, each with a profile of ditrl's step), real-size loading and
# training from weights files, then deterministic mode's cost at real size and on the quickstart,
# then the whole RL loop per case (benchmarks/gpu/loop.sh). Each gpu test stops after
# DITRL_GPU_TEST_TIMEOUT seconds (default 240: the quickstart case, the longest, took about 175 s on
# an H200 on 2026-12-04; tests/gpu/run_gpu_tests.sh runs it beside the others).
# --only: configure, build and the named steps (a second call on a warm machine, whose build dir
# is kept, runs the steps the first call's budget left NOT RUN).
# Exit status: 0 when every step passed or was skipped for want of a GPU.
# The results folder's raw files go into git only as one archive beside the tables of
# benchmarks/results/gpu_check.md (benchmarks/README.md), never as loose files.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=build-gpu
RESULTS=kit/results/$(date -u +%Y%m%dT%H%M%SZ)
PACK=
BUDGET=
ONLY=
while (($#)); do
  case $1 in
    --build-dir) BUILD=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --pack) PACK=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --only) ONLY=,configure,build,$2,; shift 2 ;;
    *) echo "gpu_check: unknown argument $1 (expected --build-dir, --results, --pack, --budget, --only)"; exit 2 ;;
  esac
done
[[ -z $BUDGET || $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu_check: --budget takes whole seconds, got '$BUDGET'"; exit 2; }
mkdir -p "$RESULTS"
RESULTS=$(realpath "$RESULTS")
BUILD=$(realpath -m "$BUILD")
SUMMARY=$RESULTS/summary.md
T0=$(date +%s)
DEADLINE=$((T0 + ${BUDGET:-1000000000}))
failed=0
not_run=()

note() { echo "$*" | tee -a "$SUMMARY"; }
# step NAME TIMEOUT_S COMMAND...: runs it with its output in NAME.log and one summary row;
# under --budget its limit is cut to the time left, and it is not started with under 60 s left.
step() {
  local name=$1 limit=$2 left start rc status
  shift 2
  if [[ -n $ONLY && $ONLY != *",$name,"* ]]; then
    note "| $name | not asked for (--only) | - | - |"
    return 1
  fi
  left=$((DEADLINE - $(date +%s)))
  if ((left < 60)); then
    note "| $name | NOT RUN: the kit's --budget $BUDGET s had ${left} s left | - | - |"
    not_run+=("$name")
    failed=1
    return 1
  fi
  ((limit > left)) && limit=$left
  start=$(date +%s)
  echo "gpu_check: $name ..."
  timeout "$limit" "$@" >"$RESULTS/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=passed ;;
    124) status="FAILED (stopped at $limit s: its own limit or the kit's --budget)"; failed=1 ;;
    *) status="FAILED (exit $rc)"; failed=1 ;;
  esac
  note "| $name | $status | $(($(date +%s) - start)) s | $name.log |"
  ((rc == 0)) || tail -n 30 "$RESULTS/$name.log"
  return $rc
}
finish() {
  note ""
  note "total: $(($(date +%s) - T0)) s; $( ((failed)) && echo 'some steps FAILED' || echo 'every step passed or was skipped for want of a GPU')"
  if ((${#not_run[@]})); then  # what a second call on the warm machine (its build dir kept) should run
    note "not run for the budget: $(IFS=,; echo "${not_run[*]}"); next: bash scripts/gpu_check.sh --build-dir $BUILD \
--only $(IFS=,; echo "${not_run[*]}") --budget <seconds> --results <another dir> --pack <file>"
  fi
  if [[ -n $PACK ]]; then  # one archive and the summary beside it (the device tool returns few files)
    tar -C "$(dirname "$RESULTS")" -czf "$PACK" "$(basename "$RESULTS")"
    cp "$SUMMARY" "${PACK%.tar.gz}.summary.md"
  fi
  exit $failed
}
# Stopped from outside (the device call's own limit): the results so far still get packed.
trap 'note "| (stopped) | FAILED: gpu_check.sh got a signal | - | - |"; failed=1; finish' TERM INT HUP

# --- the kit's libraries -----------------------------------------------------
if [[ ! -f kit/prefix/env.sh && -f kit/prefix.tar.xz ]]; then tar -C kit -xJf kit/prefix.tar.xz; fi
if [[ ! -f kit/prefix/env.sh ]]; then
  echo "gpu_check: no kit/prefix (run scripts/prepare_gpu_kit.sh on a Debian bookworm machine and carry kit/prefix.tar.xz)"
  exit 2
fi
# shellcheck source=/dev/null
source kit/prefix/env.sh
glibc=$(ldd --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+$')
if [[ -n $glibc && $(printf '%s\n%s\n' "$DITRL_KIT_GLIBC" "$glibc" | sort -V | head -1) != "$DITRL_KIT_GLIBC" ]]; then
  echo "gpu_check: this machine's glibc is $glibc; the kit's Debian bookworm libraries need >= $DITRL_KIT_GLIBC"
  exit 2
fi
PY=${DITRL_PYTHON:-$(command -v python3)}
# diffusers (the benchmark's peer) and flow_grpo's pure-Python imports (the loop step) where python3 lacks
# them: the kit's wheels.
if ! "$PY" -c 'import diffusers, absl, ml_collections, peft, accelerate' 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$ROOT/kit/site" kit/prefix/wheels/*.whl ||
    { echo "gpu_check: could not install kit/prefix/wheels"; exit 2; }
  export PYTHONPATH=$ROOT/kit/site${PYTHONPATH:+:$PYTHONPATH}
fi
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
# Open MPI in gVisor-style sandboxes: no cross-memory attach between ranks.
# Unbound ranks: mpirun binds each of up to two ranks to one core, and a
# rank runs no more intra-op threads than the cores it is bound to.
# The H200 image's own PMIx at Debian's path offers a zlib plugin the kit's PMIx
# cannot load: without compression PMIx works, and says so at every start.
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_hwloc_base_binding_policy=none PMIX_MCA_pcompress_base_silence_warning=1

# The tree travels to a lent machine without a current .git (the device tool
# copies the work tree; a .git there can be older than it): the caller names
# the commit in DITRL_COMMIT, which wins.
source_commit() {
  if [ -n "${DITRL_COMMIT:-}" ]; then
    echo "$DITRL_COMMIT (from DITRL_COMMIT)"
  elif git rev-parse --git-dir >/dev/null 2>&1; then
    echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include tests benchmarks scripts || echo ' (+ uncommitted changes)')"
  else
    echo "unknown (the tree has no .git and DITRL_COMMIT is unset)"
  fi
}

{
  echo "# ditrl GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "- commit: $(source_commit)"
  echo "- machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr), glibc ${glibc:-?}"
  gpu_names=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | paste -sd';')
  echo "- GPUs visible to torch: $GPUS; nvidia-smi: ${gpu_names:-none}"
  echo "- python: $PY ($("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1))"
  echo "- $(cmake --version | head -1), ninja $(ninja --version 2>/dev/null || echo absent), $(${CXX:-c++} --version | head -1)"
  echo "- kit: $(head -1 kit/prefix/MANIFEST | sed 's/^# //')"
  echo
  echo "| step | result | time | log |"
  echo "|---|---|---|---|"
} >"$SUMMARY"
cat "$SUMMARY"

# --- build -------------------------------------------------------------------
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ -f $BUILD/CMakeCache.txt ]]; then  # keep the generator an existing build dir has
  generator=(-G "$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$BUILD/CMakeCache.txt")")
  # A cache that found its libraries elsewhere would keep them: start it afresh (objects stay).
  grep -q "$KIT_USR" "$BUILD/CMakeCache.txt" || rm -f "$BUILD/CMakeCache.txt"
fi
step configure 300 cmake "${generator[@]}" -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDITRL_CUDA=ON \
  -DDITRL_PYTHON="$PY" -DDITRL_WERROR="${DITRL_WERROR:-OFF}" -DCMAKE_PREFIX_PATH="$KIT_USR" \
  -DMPI_C_COMPILER="$KIT_USR/bin/mpicc" -DMPIEXEC_EXECUTABLE="$KIT_USR/bin/mpiexec" \
  -DHDF5_C_COMPILER_EXECUTABLE="$KIT_USR/bin/h5pcc" -DDITRL_GPU_TEST_TIMEOUT="${DITRL_GPU_TEST_TIMEOUT:-240}" || finish
targets=(ditrl ditrl_gpu_tests ditrl_nccl_tests visible_gpus bench_gpu_step)
step build 3600 cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}" || finish

# --- the gpu tests -----------------------------------------------------------
step gpu_tests 360 env DITRL_GPU_TEST_TIMEOUT="${DITRL_GPU_TEST_TIMEOUT:-240}" bash tests/gpu/run_gpu_tests.sh "$BUILD" "$RESULTS"
grep -sE 'tests passed|\((Skipped|Failed|Not Run|Timeout)\)$|^quickstart case:' "$RESULTS/gpu_tests.log" | sed 's/^/    /' |
  tee -a "$SUMMARY"

# --- the multi-rank suites on one GPU over the MPI data backend (2 and 4 ranks share it) ------
step mpi_data 150 env DITRL_GPU_TEST_TIMEOUT=140 bash tests/gpu/run_mpi_data_tests.sh "$BUILD" "$RESULTS"
grep -sE 'tests passed|\((Skipped|Failed|Not Run|Timeout)\)$|^train cases:' "$RESULTS/mpi_data.log" | sed 's/^/    /' |
  tee -a "$SUMMARY"

# --- `ditrl preflight` on the GPU at 1 and 2 ranks over the MPI data backend (both ranks share
# the one GPU; NCCL would need one each): every check, the report as text and JSON per rank count.
if ((GPUS > 0)); then
  mkdir -p "$RESULTS/preflight"
  step preflight 150 bash -c 'for np in 1 2; do
      echo "== preflight at $np rank(s)"
      "$0" --allow-run-as-root --oversubscribe --bind-to none -np $np "$1" preflight inputs/quickstart.toml \
        --set run.device=cuda --set parallel.data_backend=mpi --set run.out_dir="$2/out" --disk-mib 1024 \
        --json "$2/np$np.json" || exit 1
    done' "$KIT_USR/bin/mpiexec" "$BUILD/ditrl" "$RESULTS/preflight"
  grep -sE '^(== |FAIL|PASS +(all_|reduce_|training|memory|disk)| +FAILED on|preflight:)' "$RESULTS/preflight.log" |
    sed 's/^/    /' | tee -a "$SUMMARY"
else
  note "| preflight | SKIPPED: no GPU visible to torch (CTest preflight.* runs it on the CPU) | - | - |"
fi

# --- the quickstart on the GPU (or, without one, the CUDA build's no-GPU paths)
if ((GPUS > 0)); then
  # The gpu tests above trained the whole quickstart on the GPU once (`gpu: the quickstart trains on the GPU
  # and its reward rises`, which checks the rise); its metrics and logs give the curves, not a second run.
  quickstart=$BUILD/test-output/gpu_quickstart
  plot=(--out "$RESULTS/quickstart/curves.png" --summary)
  "$PY" -c 'import matplotlib' 2>/dev/null || plot=(--no-plot)  # the summary alone: reward rise, peak memory
  step quickstart_gpu 120 bash -c "mkdir -p '$RESULTS/quickstart' && cp -r '$quickstart/metrics.h5' \
    '$quickstart/logs' '$RESULTS/quickstart/' && '$PY' tools/plot_metrics.py '$RESULTS/quickstart/metrics.h5' ${plot[*]}"
  grep -sE '^(reward mean|peak memory)' "$RESULTS/quickstart_gpu.log" | sed 's/^/    /' | tee -a "$SUMMARY"
  "$BUILD/ditrl" plan inputs/quickstart.toml --ranks 1 2>&1 | grep "allocator's predicted" | sed 's/^# */    /' |
    tee -a "$SUMMARY"
else
  note "| quickstart_gpu | SKIPPED: no GPU visible to torch | - | - |"
  step no_gpu_paths 420 bash tests/cuda/no_gpu.sh "$BUILD"
fi

# --- the GPU benchmark, one model per step, with a profile of ditrl's step by kernel family (without a
# GPU, CTest's bench.gpu_step_tiny runs its tiny CPU size). Batch 2 (SD3.5-medium: MFU 27.7% against
# 24.5% at batch 1, 2026-12-04) is a manual run: BATCH=2 benchmarks/gpu/run.sh ...
for model in sd3.5-medium wan2.1-1.3b; do
  if ((GPUS > 0)); then
    step "benchmark_$model" 600 env MODELS="$model" PROFILE=1 bash benchmarks/gpu/run.sh "$PY" \
      "$RESULTS/benchmark/$model" full "$BUILD/benchmarks/bench_gpu_step"
    [[ -f $RESULTS/benchmark/$model/report.md ]] && cat "$RESULTS/benchmark/$model/report.md" >>"$SUMMARY"
  else
    note "| benchmark_$model | SKIPPED: no GPU visible to torch (bench.gpu_step_tiny covers the tiny size) | - | - |"
  fi
done
# Real size from weights files (issue #18 on a GPU): SD3.5-medium's seeded bf16 weights in the diffusers
# layout, read plainly, then staged onto the GPU by `ditrl train` and trained for one LoRA rollout.
if ((GPUS > 0)); then
  step real_size_gpu 240 bash benchmarks/real_size/gpu.sh "$PY" "$BUILD/ditrl" "$BUILD/real_size"
  grep -sE '^(weights written|plain read|load:|load against|plan:|peak memory|median seconds|ditrl train:)' \
    "$RESULTS/real_size_gpu.log" | sed 's/^/    /' | tee -a "$SUMMARY"
  cp "$BUILD/real_size/run/logs/rank-0.log" "$RESULTS/real_size_rank0.log" 2>/dev/null
else
  note "| real_size_gpu | SKIPPED: no GPU visible to torch | - | - |"
fi
# Deterministic mode's cost at real size: ditrl's SD3.5-medium step again with --deterministic (the
# switches `ditrl train` sets), against the benchmark's own step above.
if ((GPUS > 0)); then
  fast=$RESULTS/benchmark/sd3.5-medium/sd3.5-medium.ditrl.1.json det=$RESULTS/benchmark/sd3.5-medium/deterministic.json
  step deterministic_step 180 "$BUILD/benchmarks/bench_gpu_step" --model sd3.5-medium --size full --device cuda \
    --warmup 3 --steps 10 --deterministic --out "$det"
  [[ -f $fast && -f $det ]] && "$PY" - "$fast" "$det" <<'PY' | tee -a "$SUMMARY"
import json, sys
fast, det = (json.load(open(path)) for path in sys.argv[1:3])
print(f"    SD3.5-medium step, deterministic mode: {det['step_s_median']:.4f} s against {fast['step_s_median']:.4f} s "
      f"({det['step_s_median'] / fast['step_s_median']:.2f}x); peak {det['peak_memory_gib']:.1f} GiB")
PY
else
  note "| deterministic_step | SKIPPED: no GPU visible to torch | - | - |"
fi
# Deterministic mode's cost on the launch-bound quickstart (2.2-2.4x per rollout on an H200 on 2026-12-04,
# every phase alike): 8 rollouts deterministic, not, and not with deterministic mode's one intra-op
# thread, each with its phases' median CUDA-event seconds.
if ((GPUS > 0)); then
  step quickstart_modes 120 bash tests/gpu/quickstart_modes.sh "$BUILD/ditrl" "$PY" "$RESULTS/modes"
  grep -sE '^(== |rollouts 5-8|median seconds)' "$RESULTS/quickstart_modes.log" | sed 's/^/    /' | tee -a "$SUMMARY"
else
  note "| quickstart_modes | SKIPPED: no GPU visible to torch | - | - |"
fi
# The whole RL loop at real size (issue #52, benchmarks/gpu/loop.sh), one step per case so a cut budget loses one:
# SD3.5-medium LoRA r32 (PickScore-architecture reward) beside flow_grpo's own loop on the same GPU, Qwen-Image and
# Wan2.1-1.3B LoRA, FLUX.1-dev LoRA, FLUX.2 [klein] 4B LoRA; samples per GPU-second, the split, peak against `ditrl plan`. Sized to fit
# (sd3 2 prompts x 8, Qwen and FLUX 8 samples, 1 round of 3 rollouts; the 8 x 8 of the issue is PROMPTS=8 by hand). Last and long: a first
# call's --budget leaves them NOT RUN and the summary names the --only call that runs them on the warm machine.
# flow_grpo's side needs FLOW_GRPO = a checkout carried into the tree (the device machine reaches no network);
# without it the report says SKIPPED. Without a GPU, CTest's bench.loop_tiny runs the tiny CPU size.
for case in sd3 qwen_image wan flux flux2; do
  if ((GPUS > 0)); then
    step "loop_$case" 300 env PYTHON="$PY" PROMPTS="${PROMPTS:-2}" GROUP="${GROUP:-8}" QWEN_SAMPLES="${QWEN_SAMPLES:-8}" \
      FLUX_SAMPLES="${FLUX_SAMPLES:-8}" FLUX2_SAMPLES="${FLUX2_SAMPLES:-8}" \
      bash benchmarks/gpu/loop.sh --ditrl "$BUILD/ditrl" --out "$BUILD/loop/$case" --size real --device cuda \
      --cases "$case" --rounds "${LOOP_ROUNDS:-1}" --rollouts "${LOOP_ROLLOUTS:-3}" ${FLOW_GRPO:+--flow-grpo "$FLOW_GRPO"}
    cp "$BUILD/loop/$case/report.md" "$RESULTS/loop_$case.md" 2>/dev/null && sed 's/^/    /' "$RESULTS/loop_$case.md" >>"$SUMMARY"
  else
    note "| loop_$case | SKIPPED: no GPU visible to torch (bench.loop_tiny covers the tiny CPU size) | - | - |"
  fi
done
finish
