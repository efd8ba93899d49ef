#!/usr/bin/env bash
# The `gpu` tests as the check kit runs them: the quickstart case (150 rollouts,
# about 3 minutes on an H200, the longest by far) straight from its binary,
# beside `ctest -L gpu` for the rest, so both fit the kit's one device call.
# The other cases keep their RUN_SERIAL among themselves. The multi-rank cases
# on one GPU over the MPI data backend are the kit's next step
# (tests/gpu/run_mpi_data_tests.sh).
#   tests/gpu/run_gpu_tests.sh BUILD_DIR RESULTS_DIR
# Exit status: 0 when every case passed or was skipped.
set -uo pipefail
build=$1 results=$2
quickstart="gpu: the quickstart trains on the GPU and its reward rises"
timeout "${DITRL_GPU_TEST_TIMEOUT:-900}" "$build/tests/ditrl_gpu_tests" -w NoTests "$quickstart" \
  >"$results/gpu_quickstart_test.log" 2>&1 &
pid=$!
ctest --test-dir "$build" -L gpu -E "quickstart trains|MPI data backend|one GPU" --output-on-failure --output-junit "$results/gpu_tests.xml"
rc=$?
wait "$pid"
q=$?
echo "--- $quickstart (run beside the others) ---"
cat "$results/gpu_quickstart_test.log"
case $q in
  0) echo "quickstart case: passed" ;;
  77) echo "quickstart case: SKIPPED" ;;
  124) echo "quickstart case: FAILED (stopped after DITRL_GPU_TEST_TIMEOUT=${DITRL_GPU_TEST_TIMEOUT:-900} s)"; rc=1 ;;
  *) echo "quickstart case: FAILED (exit $q)"; rc=1 ;;
esac
exit $rc
