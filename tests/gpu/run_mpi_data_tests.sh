#!/usr/bin/env bash
# The multi-rank CUDA tests on ONE GPU over the MPI data backend, as the check
# kit's mpi_data step runs them: the `ditrl train` cases tagged [mpi_data]
# (1, 2 and 4 ranks bitwise alike, resume at another rank count) straight from
# their binary, beside `ctest -R mpi_data` for the multi-rank suites at 2 and 4
# ranks and gpu.faults.stopped_rank.mpi_data. Several ranks share the GPU
# anyway, so these run in parallel (docs/gpus-and-clusters.md).
#   tests/gpu/run_mpi_data_tests.sh BUILD_DIR RESULTS_DIR
# Exit status: 0 when every test passed or was skipped.
set -uo pipefail
build=$1 results=$2
timeout "${DITRL_GPU_TEST_TIMEOUT:-900}" "$build/tests/ditrl_gpu_tests" -w NoTests "[mpi_data]" \
  >"$results/mpi_data_train_cases.log" 2>&1 &
pid=$!
ctest --test-dir "$build" -R 'mpi_data' -j 4 --output-on-failure --output-junit "$results/mpi_data_tests.xml"
rc=$?
wait "$pid"
t=$?
echo "--- ditrl_gpu_tests [mpi_data] (run beside the others) ---"
cat "$results/mpi_data_train_cases.log"
case $t in
  0) echo "train cases: passed" ;;
  77) echo "train cases: SKIPPED" ;;
  124) echo "train cases: FAILED (stopped after DITRL_GPU_TEST_TIMEOUT=${DITRL_GPU_TEST_TIMEOUT:-900} s)"; rc=1 ;;
  *) echo "train cases: FAILED (exit $t)"; rc=1 ;;
esac
exit $rc
