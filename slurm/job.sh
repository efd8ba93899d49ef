#!/bin/bash
# The body of slurm/train.sbatch and slurm/multinode.sbatch: runs one
# `ditrl train DECK` step over the whole allocation, one rank per task, and
# turns Slurm's pre-timeout signal into checkpoint -> requeue -> resume.
#
#   DECK        the one argument (a TOML deck)
#   DITRL       the ditrl binary (default: $DITRL_HOME/build/ditrl, else ditrl on PATH)
#   DITRL_HOME  the ditrl checkout (default: the submit directory)
#   DITRL_OUT   run directory (default: $SLURM_SUBMIT_DIR/runs/<job name>-<job id>);
#               a requeued job keeps its id, so it finds its own checkpoints
#   DITRL_LAUNCHER  srun (default; --mpi=pmix) or mpirun (Open MPI inside the allocation)
#   DITRL_SET   extra "--set k=v" overrides, space separated
#   DITRL_SRUN_ARGS  extra srun options for the step, space separated (slurm/reward_server.sbatch:
#               --het-group=1, the training component of a heterogeneous job)
#   DITRL_STARTUP_RETRIES  times a step that fails during MPI start-up is rerun (default 1)
#   OMPI_MCA_odls_base_sigkill_timeout  mpirun launcher: seconds from a TERM to mpirun to its
#               TERM to the ranks, and again to SIGKILL (default here 30; Open MPI's own is 1)
set -uo pipefail

DECK=${1:?usage: sbatch slurm/train.sbatch DECK.toml}
[[ -r $DECK ]] || { echo "ditrl job: deck '$DECK' is not readable (paths are relative to $PWD)" >&2; exit 2; }
DITRL_HOME=${DITRL_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}
if [[ -z ${DITRL:-} ]]; then
  DITRL=$DITRL_HOME/build/ditrl
  [[ -x $DITRL ]] || DITRL=$(command -v ditrl || true)
fi
[[ -x $DITRL ]] || { echo "ditrl job: no ditrl binary (set DITRL=/path/to/ditrl)" >&2; exit 2; }
OUT=${DITRL_OUT:-${SLURM_SUBMIT_DIR:-$PWD}/runs/${SLURM_JOB_NAME:-ditrl}-${SLURM_JOB_ID:-local}}
mkdir -p "$OUT"

# Parallel file systems (Lustre, GPFS) often lack the POSIX locks HDF5 takes.
export HDF5_USE_FILE_LOCKING=FALSE
# Deterministic decks also need deterministic cuBLAS workspaces and a fixed
# NCCL algorithm (ditrl pins the CPU kernels itself).
if grep -Eq '^[[:space:]]*deterministic[[:space:]]*=[[:space:]]*true' "$DECK" || [[ ${DITRL_SET:-} == *run.deterministic=true* ]]; then
  export CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_ALGO=Ring
fi
# srun does not inherit --cpus-per-task from sbatch (Slurm >= 22.05).
[[ -n ${SLURM_CPUS_PER_TASK:-} ]] && export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK

echo "ditrl job ${SLURM_JOB_ID:-?} restart ${SLURM_RESTART_COUNT:-0}: $SLURM_NTASKS task(s) on ${SLURM_JOB_NODELIST:-?}, deck $DECK, out $OUT"
args=(train "$DECK" --set "run.out_dir=$OUT" --resume auto)
for kv in ${DITRL_SET:-}; do args+=(--set "$kv"); done
# One rank per task; every rank sees all of its node's GPUs and ditrl picks
# the one of its node-local rank (no --gpus-per-task: that would hide the
# peers from NCCL's peer-to-peer paths).
# Open MPI 4.1's mpirun answers a TERM of its own (plain `scancel`, preemption)
# with SIGCONT to the ranks at once, SIGTERM after this many seconds and
# SIGKILL after as many again (tests/faults/run.sh measures it). Its default
# of 1 s is shorter than a rollout's safe point plus a checkpoint; the ranks
# that Slurm signals itself get the whole of it.
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-30}
launch() {
  # Absent while the step runs: what the step leaves is its own outcome.
  rm -f "$OUT/status"
  if [[ ${DITRL_LAUNCHER:-srun} == mpirun ]]; then
    local root=(); [[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
    mpirun "${root[@]}" -np "$SLURM_NTASKS" --bind-to none "$DITRL" "${args[@]}" &
  else
    local extra=(); read -r -a extra <<< "${DITRL_SRUN_ARGS:-}"
    srun --mpi=pmix --kill-on-bad-exit=1 "${extra[@]}" "$DITRL" "${args[@]}" &
  fi
  step=$!
}

# Slurm signals the batch shell only (--signal=B:USR1@N, scancel --batch):
# pass it to the step (srun and mpirun forward it to every rank), which
# checkpoints at its next safe point and exits 0. Both launchers answer a
# TERM of their own by ending their ranks (srun sends them SIGKILL at once,
# "forcing job termination"; mpirun as above), but forward USR1 and let
# them finish; ditrl treats both alike, so the step always gets USR1
# (tests/slurm/run.sh, scenario 3).
signalled=""
forward() {
  signalled=$1
  kill -USR1 "$step" 2>/dev/null
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
# A trapped signal interrupts `wait` (status 128+signal): wait again until
# the step itself has ended.
wait_step() {
  while :; do
    wait "$step"; rc=$?
    kill -0 "$step" 2>/dev/null || break
  done
  if (( rc > 128 )); then wait "$step" 2>/dev/null; again=$?; (( again != 127 )) && rc=$again; fi
}

# Rank 0 logs `layout:` once every rank is through MPI start-up (it gathers
# their host names). A step that fails before that line is retried:
# Open MPI 4.1's TCP transport can crash a rank inside MPI_Init when the
# ranks leave its start-up fence at different times and a fast one's first
# message reaches a slow one early (open-mpi/ompi#12495; seen here in ~5% of
# multi-host starts). Nothing was computed, so nothing is lost.
layouts() { grep -c "layout:" "$OUT/logs/rank-0.log" 2>/dev/null || true; }
retries=${DITRL_STARTUP_RETRIES:-1}
while :; do
  before=$(layouts)
  launch
  wait_step
  [[ $rc == 0 || -n $signalled || $(layouts) != "$before" || $retries -le 0 ]] && break
  retries=$((retries - 1))
  echo "ditrl job ${SLURM_JOB_ID:-?}: the step failed (exit $rc) before every rank was through MPI start-up; retrying it"
done

status=$(cat "$OUT/status" 2>/dev/null || echo none)
echo "ditrl job ${SLURM_JOB_ID:-?}: step exited $rc, status $status"
if [[ $rc != 0 && $status == preempted ]]; then
  # Rank 0 writes `preempted` only after the checkpoint is committed; mpirun
  # exits 1 after a TERM of its own however its ranks ended.
  echo "ditrl job ${SLURM_JOB_ID:-?}: the ranks checkpointed and stopped as asked; exiting 0"
  rc=0
fi
if [[ $rc == 0 && $status == preempted && $signalled == USR1 && -n ${SLURM_JOB_ID:-} ]]; then
  # Near the time limit: back into the queue; the rerun resumes from latest.
  echo "ditrl job $SLURM_JOB_ID: checkpointed on USR1, requeueing"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
