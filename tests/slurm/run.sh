#!/bin/bash
# Real-Slurm test: a private one-node Slurm on this machine (2 CPUs), then
#   1. slurm/train.sbatch on a short quickstart deck with 2 tasks: the job
#      completes with exit 0, metrics.h5 holds every row, a checkpoint exists;
#   2. preemption: a deterministic run gets USR1 on its batch shell mid-run
#      (what --signal=B:USR1@120 does near the time limit), checkpoints,
#      requeues itself, comes back with SLURM_RESTART_COUNT=1, resumes from
#      latest, finishes, and its metrics equal an uninterrupted run's;
#   3. both launchers (srun, and mpirun inside the allocation) during
#      rollouts slower than Open MPI's ~1 s kill delay: USR1 to the batch
#      shell checkpoints and requeues, TERM checkpoints and ends the job 0,
#      and a plain `scancel` (TERM to every process of the job, SIGKILL
#      after KillWait) checkpoints before Slurm's SIGKILL.
# Exit 77 (CTest SKIP_RETURN_CODE) with the reason when the daemons cannot
# be set up here. Usage: tests/slurm/run.sh [path/to/ditrl]
set -uo pipefail
SKIP=77
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DITRL=$(realpath "${1:-${DITRL:-$ROOT/build/ditrl}}")
source "$ROOT/tests/slurm/cluster.sh"

skip() { echo "SKIPPED: $*"; exit $SKIP; }
failures=0
check() {  # check "what" command...
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; failures=$((failures + 1)); fi
}
waitfor() {  # waitfor SECONDS command...
  local n=$1; shift
  for ((i = 0; i < n * 5; i++)); do "$@" && return 0; sleep 0.2; done
  return 1
}
state_is() { [[ $(squeue -h -j "$1" -o %T 2>/dev/null) == "$2" ]]; }
job_field() { scontrol show job "$1" 2>/dev/null | grep -o "$2=[^ ]*" | head -1 | cut -d= -f2; }

[[ -x $DITRL ]] || { echo "FAIL: no ditrl binary at $DITRL"; exit 1; }
[[ $(id -u) == 0 ]] || skip "starting slurmctld/slurmd/munged here needs root"
reason=$(slurm_install 2>&1) || skip "cannot install slurm-wlm/munge: $reason"

export WORKDIR=$(mktemp -d /tmp/ditrl-slurm.XXXXXX)
trap 'slurm_down; [[ $failures == 0 ]] && rm -rf "$WORKDIR"' EXIT
reason=$(slurm_up 2>&1) || skip "the Slurm daemons did not come up: $reason"
export SLURM_CONF=$WORKDIR/slurm.conf
echo "slurm up in $WORKDIR ($(sinfo -h -o '%D node, %c CPUs, %t'))"

# The batch scripts run unmodified; the command line sizes them for this
# CPU-only node (two tasks, one core each, no GPUs).
cd "$WORKDIR"
export DITRL DITRL_HOME=$ROOT
SIZE=(--gpus-per-node=0 --ntasks-per-node=2 --cpus-per-task=1 --time=10)

# 1. A short quickstart run.
export DITRL_SET="train.num_rollouts=2 checkpoint.every=2"
job=$(sbatch --parsable "${SIZE[@]}" -J quick -o quick-%j.out --wait "$ROOT/slurm/train.sbatch" "$ROOT/inputs/quickstart.toml")
rc=$?
out=$WORKDIR/runs/quick-$job
check "quickstart job $job exit code 0 (got $rc)" test "$rc" = 0
check "quickstart job state COMPLETED, ExitCode 0:0" \
  test "$(job_field "$job" JobState) $(job_field "$job" ExitCode)" = "COMPLETED 0:0"
check "quickstart status complete" grep -qx complete "$out/status"
check "quickstart metrics.h5 has 2 rows" \
  bash -c "h5dump -H -d /metrics/step '$out/metrics.h5' 2>/dev/null | grep -q 'DATASPACE  SIMPLE { ( 2 )'"
check "quickstart checkpoint step-2 behind latest" \
  bash -c "test -s '$out/checkpoints/latest' && ls '$out'/checkpoints/ | grep -q 'step-2'"
check "quickstart ran 2 ranks under srun" grep -q "on 2 rank(s)" "quick-$job.out"
[[ $failures == 0 ]] || { tail -n 30 "quick-$job.out"; }

# 2. Preemption: USR1 to the batch shell mid-run, self-requeue, resume.
# 20 slower rollouts (40 steps at 16x16, ~0.3 s each on a 2-core VM): the
# signal must land before the run ends (5 rollouts of the plain deck took
# 0.4 s in all, less than the polling and scancel's delivery).
deck=$ROOT/tests/e2e/decks/tiny_grpo.toml
export DITRL_SET="train.num_rollouts=20 checkpoint.every=100 rollout.steps=40 rollout.height=16 rollout.width=16"
ref=$(sbatch --parsable "${SIZE[@]}" -J ref -o ref-%j.out --wait "$ROOT/slurm/train.sbatch" "$deck")
check "uninterrupted reference job $ref completed" grep -qx complete "runs/ref-$ref/status"

job=$(sbatch --parsable "${SIZE[@]}" -J pre -o pre-%j.out "$ROOT/slurm/train.sbatch" "$deck")
out=$WORKDIR/runs/pre-$job
# Signal once the first rollout is done, so the checkpoint lands mid-run.
check "preemption run reached rollout 1/20" waitfor 120 grep -qs "rollout 1/20" "pre-$job.out"
scancel --signal=USR1 --batch "$job"
check "preempted job requeued itself (PENDING)" waitfor 90 state_is "$job" PENDING
grep -h "status\|requeue\|signal" "pre-$job.out" | head -5
check "preempted run wrote status preempted and a checkpoint" \
  bash -c "grep -qx preempted '$out/status' && test -s '$out/checkpoints/latest'"
# Slurm holds a requeued job ~120 s (BeginTime); bring it forward (now+2:
# `now` can revoke the new credential).
scontrol update JobId="$job" StartTime=now+2
check "requeued job finished" waitfor 120 bash -c "[[ -z \$(squeue -h -j $job 2>/dev/null) ]] || [[ \$(squeue -h -j $job -o %T) == COMPLETED ]]"
check "job came back with SLURM_RESTART_COUNT=1" grep -q "restart 1:" "pre-$job.out"
check "rerun resumed from latest mid-run" grep -Eq "resumed from .*rollout ([1-9]|1[0-9])," "pre-$job.out"
check "Restarts=1, COMPLETED, ExitCode 0:0" \
  test "$(job_field "$job" Restarts) $(job_field "$job" JobState) $(job_field "$job" ExitCode)" = "1 COMPLETED 0:0"
check "preempted run status complete" grep -qx complete "$out/status"
"$DITRL" standard record "runs/ref-$ref" ref.json >/dev/null
check "preempted+resumed metrics equal the uninterrupted run's (bitwise, perf/* aside)" \
  "$DITRL" standard check "$out" ref.json

# 3. Slow rollouts (400 steps at 16x16: 2.5-8 s each, ~20 ms a step) under each
# launcher: the signal must reach the ranks as a checkpoint request, not as
# mpirun's kill.
export DITRL_SET="train.num_rollouts=200 checkpoint.every=1000 rollout.steps=400 rollout.height=16 rollout.width=16"
for launcher in srun mpirun; do
  for signal in USR1 TERM cancel; do
    name=$launcher-$signal
    job=$(DITRL_LAUNCHER=$launcher sbatch --parsable "${SIZE[@]}" -J "$name" -o "$name-%j.out" "$ROOT/slurm/train.sbatch" \
      "$ROOT/inputs/quickstart.toml")
    out=$WORKDIR/runs/$name-$job
    check "$name: run reached rollout 2/200" waitfor 300 grep -qs "rollout 2/200" "$name-$job.out"
    if [[ $signal == cancel ]]; then
      # The job ends by Slurm's hand; the ranks' log says how they stopped.
      scancel "$job"
      check "$name: status preempted before Slurm's SIGKILL" waitfor 60 grep -qsx preempted "$out/status"
      check "$name: checkpoint written on scancel" test -s "$out/checkpoints/latest"
      grep -h "signal [0-9]* received" "$out/logs/rank-0.log" | head -1
    else
      scancel --signal="$signal" --batch "$job"
      check "$name: step exited 0 with status preempted" waitfor 120 grep -qs "step exited 0, status preempted" "$name-$job.out"
      check "$name: checkpoint written on $signal" test -s "$out/checkpoints/latest"
    fi
    if [[ $signal == USR1 ]]; then
      check "$name: requeued itself" grep -q "checkpointed on USR1, requeueing" "$name-$job.out"
    else
      check "$name: not requeued on $signal" bash -c "! grep -q requeueing '$name-$job.out'"
    fi
    scancel "$job" 2>/dev/null
    waitfor 60 bash -c "[[ -z \$(squeue -h -j $job 2>/dev/null) ]]"
  done
done

if [[ $failures != 0 ]]; then
  echo "--- $failures check(s) failed; job output and daemon logs in $WORKDIR"
  tail -n 40 "$WORKDIR"/pre-*.out
  exit 1
fi
echo "slurm test passed"
