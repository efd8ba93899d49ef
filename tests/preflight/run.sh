#!/usr/bin/env bash
# `ditrl preflight` as a real MPI job on the CPU (CTest preflight.*):
#   tests/preflight/run.sh CASE NP DITRL "MPIEXEC ARGS" WORK_DIR SOURCE_DIR
# CASE pass:   every check passes on the quickstart deck at NP ranks; the JSON
#              report holds every check, each rank's line, and no failure.
# CASE faults: negative controls at NP ranks. A collective fault injected on
#              the last rank (DITRL_TEST_PREFLIGHT_FAULT) fails the bitwise
#              checks naming that rank and only it, and the exit status is 1;
#              an out_dir that cannot be created fails the disk check on
#              every rank, naming the path.
set -uo pipefail
case=$1 np=$2 ditrl=$3 mpiexec=$4 work=$5/$1.np$2 src=$6
rm -rf "$work" && mkdir -p "$work"
deck=$src/inputs/quickstart.toml
fail() { echo "FAIL: $*"; exit 1; }
# Small messages and files: the checks' logic, not this machine's speed, is what CI tests.
small=(--max-elements 65536 --disk-mib 4 --iterations 2)

# json_query FILE PYTHON-EXPRESSION over `r` (the report): prints the value.
json_query() { /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"; }

case $case in
  pass)
    # shellcheck disable=SC2086  # the launcher's arguments split on purpose
    timeout 300 $mpiexec -np "$np" "$ditrl" preflight "$deck" --set run.out_dir="$work/out" --json "$work/report.json" \
      "${small[@]}" >"$work/stdout" 2>&1
    rc=$?
    cat "$work/stdout"
    ((rc == 0)) || fail "preflight exited $rc on a healthy $np-rank job"
    [[ $(json_query "$work/report.json" "r['passed']") == True ]] || fail "the JSON report says not passed"
    [[ $(json_query "$work/report.json" "r['ranks']") == "$np" ]] || fail "the JSON report's rank count is not $np"
    for check in placement "communicator start-up" all_gather "reduce_scatter (deterministic)" "reduce_scatter (fast)" \
      all_to_all all_reduce "all_reduce bandwidth" "training step (stand-in)" "memory vs plan"; do
      status=$(json_query "$work/report.json" "[c['status'] for c in r['checks'] if c['name'] == '$check']")
      [[ $status == "['PASS']" ]] || fail "check '$check': $status, expected PASS"
      lines=$(json_query "$work/report.json" "[len(c['ranks']) for c in r['checks'] if c['name'] == '$check'][0]")
      [[ $lines == "$np" ]] || fail "check '$check' has $lines rank lines, expected $np"
    done
    grep -q "^PASS     disk write $work/out" "$work/stdout" || fail "no passing disk check of $work/out"
    grep -q "preflight: every check passed" "$work/stdout" || fail "no closing line"
    # The control of device.unused_gpu_warning: on this GPU-less machine no warning, device "cpu".
    grep -q "WARNING: this machine has" "$work/stdout" && fail "an unused-GPU warning without GPUs"
    [[ $(grep -c "): local rank [0-9]*/[0-9]*, device cpu, data mpi," "$work/stdout") == "$np" ]] ||
      fail "not every rank's placement reads 'device cpu, data mpi'"
    compgen -G "$work/out/.preflight-*" >/dev/null && fail "the disk check left its file in $work/out"
    echo "preflight.pass.np$np: ok"
    ;;
  faults)
    bad=$((np - 1))
    # shellcheck disable=SC2086
    timeout 300 $mpiexec -np "$np" -x DITRL_TEST_PREFLIGHT_FAULT=$bad "$ditrl" preflight "$deck" \
      --set run.out_dir="$work/out" --json "$work/fault.json" "${small[@]}" >"$work/fault.stdout" 2>&1
    rc=$?
    cat "$work/fault.stdout"
    ((rc == 1)) || fail "an injected collective fault exited $rc, expected 1"
    for check in all_gather "reduce_scatter (deterministic)" all_to_all all_reduce "training step (stand-in)"; do
      failures=$(json_query "$work/fault.json" "[c['failures'] for c in r['checks'] if c['name'] == '$check'][0]")
      named=$(json_query "$work/fault.json" \
        "[len(f) == 1 and f[0].startswith('rank $bad (') for f in (c['failures'] for c in r['checks'] if c['name'] == '$check')]")
      [[ $named == "[True]" ]] || fail "check '$check' names $failures, expected rank $bad alone"
    done
    grep -q "FAILED on rank $bad (" "$work/fault.stdout" || fail "the text report names no failing rank $bad"
    [[ $(json_query "$work/fault.json" "r['passed']") == False ]] || fail "the JSON report says passed"

    # An out_dir below a regular file: no rank can create it (root included).
    touch "$work/a-file"
    # shellcheck disable=SC2086
    timeout 300 $mpiexec -np "$np" "$ditrl" preflight "$deck" --set run.out_dir="$work/a-file/out" \
      --json "$work/disk.json" "${small[@]}" >"$work/disk.stdout" 2>&1
    rc=$?
    cat "$work/disk.stdout"
    ((rc == 1)) || fail "an unwritable out_dir exited $rc, expected 1"
    count=$(json_query "$work/disk.json" "[len(c['failures']) for c in r['checks'] if c['name'].startswith('disk')][0]")
    [[ $count == "$np" ]] || fail "the disk check failed on $count rank(s), expected $np"
    grep -q "cannot create $work/a-file/out/.preflight-rank-0" "$work/disk.stdout" || fail "the disk failure names no path"
    failed=$(json_query "$work/disk.json" "sorted(c['name'] for c in r['checks'] if c['status'] == 'FAIL')")
    [[ $failed == "['disk write $work/a-file/out']" ]] || fail "checks failed: $failed, expected the disk check alone"
    echo "preflight.faults.np$np: ok"
    ;;
  *) fail "unknown case $case" ;;
esac
