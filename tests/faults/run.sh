#!/bin/bash
# Fault injection against real 2-rank `ditrl train` jobs (tests/CMakeLists.txt
# registers one CTest test per scenario):
#   run.sh SCENARIO DITRL "MPIEXEC ARGS" OUT_ROOT SOURCE_DIR
# Each scenario asserts that the job ends (within a bound), its exit code, its
# message, and that nothing committed is lost (`latest` resumes). Signals go
# only to processes this script started (the mpiexec it launched and that
# mpiexec's own children), never to anything found by name.
set -uo pipefail

SCENARIO=$1 DITRL=$2 MPIEXEC=$3 ROOT=$4 SRC=$5
OUT=$ROOT/$SCENARIO
rm -rf "$OUT" && mkdir -p "$OUT"
DECK=$SRC/inputs/quickstart.toml
# Rollouts several times slower than Open MPI's default second between its TERM
# to the ranks and SIGKILL (2.5-8 s here), each denoising step short (~20 ms).
SLOW=(--set rollout.steps=400 --set rollout.height=16 --set rollout.width=16)
# Tiny and fast: 1 optimizer step per rollout, a checkpoint after each.
BASE=(--set run.out_dir="$OUT/run" --set checkpoint.every=1 --set checkpoint.keep=3 --set train.num_rollouts=200)
# DITRL_FAULT_SETS: more deck settings for every job (the GPU variant: --set run.device=cuda).
read -ra EXTRA <<<"${DITRL_FAULT_SETS:-}"
BASE+=("${EXTRA[@]}")

fail() { echo "FAIL [$SCENARIO]: $*" >&2; [[ -f $OUT/job.log ]] && tail -n 30 "$OUT/job.log" >&2; exit 1; }
pass() { echo "PASS [$SCENARIO]: $*"; exit 0; }

job=""
cleanup() {
  # Only what this script started: the launcher and its children.
  if [[ -n $job ]] && kill -0 "$job" 2>/dev/null; then
    for child in $(ps -o pid= --ppid "$job" 2>/dev/null); do kill -CONT "$child" 2>/dev/null; kill -KILL "$child" 2>/dev/null; done
    kill -KILL "$job" 2>/dev/null
  fi
}
trap cleanup EXIT

# start ARGS...: the job in the background, its output in $OUT/job.log.
start() {
  : >"$OUT/job.log"  # now, not in the background child: wait_for must not read the previous job's log
  $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" "$@" >"$OUT/job.log" 2>&1 &
  job=$!
}
# finish SECONDS: waits for the job at most SECONDS; sets rc and took.
finish() {
  local limit=$1 t0=$SECONDS
  while kill -0 "$job" 2>/dev/null; do
    (( SECONDS - t0 > limit )) && { took=$((SECONDS - t0)); rc=hung; return; }
    sleep 0.2
  done
  wait "$job"; rc=$?; took=$((SECONDS - t0)); job=""
}
# rank_pid R: the pid of rank R among the launcher's children.
rank_pid() {
  local child
  for child in $(ps -o pid= --ppid "$job"); do
    tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$child"; return; }
  done
}
# wait_for PATTERN SECONDS: until the job log shows PATTERN.
wait_for() {
  local t0=$SECONDS
  until grep -q "$1" "$OUT/job.log" 2>/dev/null; do
    (( SECONDS - t0 > $2 )) && fail "no '$1' in the log within $2 s"
    kill -0 "$job" 2>/dev/null || fail "the job ended before '$1'"
    sleep 0.2
  done
}
latest_step() { cat "$OUT/run/checkpoints/latest" 2>/dev/null; }
# children PID: PID's child processes (of all its threads), one per line, cheap enough to poll.
children() { cat /proc/"$1"/task/*/children 2>/dev/null | tr -s ' ' '\n' | grep .; }
# handles PID SIGNAL: whether PID has a handler for SIGNAL (its SigCgt bit).
handles() {
  local mask; mask=$(awk '/^SigCgt/ {print $2}' "/proc/$1/status" 2>/dev/null)
  [[ -n $mask ]] && (( (16#$mask >> ($(kill -l "$2") - 1)) & 1 ))
}
# Where a stop signal took effect, for the tables: from rank 0's own log
# (mpirun stops passing on its ranks' output once it has a TERM of its own).
stop_point() {
  grep -ho "received during start-up: exiting [^(]*\|rollout [0-9/]* dropped [^;]*\|checkpointed after rollout [0-9/]*; exiting" \
    "$OUT/run/logs/rank-0.log" "$OUT/job.log" 2>/dev/null | head -1 | sed -E 's/received during start-up: exiting before (building|rollout [0-9]+).*/start-up before \1/;
      s/rollout ([0-9]+)\/[0-9]+ dropped/r\1 dropped/; s/ \(none of it trained\)//; s/checkpointed after rollout ([0-9]+).*/end of r\1/' | tr ' ' '-'
}
# Where a full disk was met, from the job log, for the tables.
disk_phase() {
  local log=$OUT/job.log
  if grep -q "collective timeout" "$log"; then grep -o "waited [0-9.]* s in io [A-Za-z0-9_]*" "$log" | head -1 | tr ' ' '-'
  elif grep -q "creating the checkpoint\|cannot create file" "$log"; then echo create
  elif grep -q "closing and syncing\|closing (writing its metadata)" "$log"; then echo metadata
  elif grep -q "checkpoint slabs\|bytes at offset" "$log"; then echo slabs
  elif grep -q "status.tmp" "$log"; then echo status
  elif grep -qi "metrics" "$log"; then echo metrics
  else echo other
  fi
}
# The committed state must still resume (each checkpoint is verified on load);
# ARGS: the job's own deck settings.
check_resumes() {
  $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" "$@" --resume latest --max-rollouts 1 >"$OUT/resume.log" 2>&1 ||
    { tail -n 20 "$OUT/resume.log" >&2; fail "resuming from latest ($(latest_step)) failed"; }
  grep -q "resumed from" "$OUT/resume.log" || fail "the resume did not load a checkpoint"
}
# run_to N ARGS...: a job that completes N rollouts (checkpoint after each).
run_to() {
  local n=$1; shift
  $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" --set train.num_rollouts="$n" "$@" >"$OUT/job.log" 2>&1 ||
    fail "a clean run to $n rollouts failed"
}

case $SCENARIO in
  stopped_rank)
    # A rank stopped mid-run (a hung GPU, a stuck collective): the live rank's
    # watchdog names the operation and the missing rank and aborts the job.
    timeout=5
    start --set parallel.collective_timeout_s=$timeout
    wait_for "checkpoint .*step-3.h5" 300
    victim=$(rank_pid 1)
    [[ -n $victim ]] || fail "no rank 1 among the launcher's children"
    kill -STOP "$victim"
    finish $((timeout + 10 + 5))
    [[ $rc == hung ]] && fail "the job did not end within $took s of stopping rank 1"
    (( rc != 0 )) || fail "exit code 0 after a stopped rank"
    grep -q "collective timeout on rank 0" "$OUT/job.log" || fail "no watchdog message"
    grep -q "rank 1 (not responding" "$OUT/job.log" || fail "the message does not name rank 1 as missing"
    grep -q "collective_timeout_s" "$OUT/job.log" || fail "the message does not name the deck key"
    check_resumes
    pass "ended $took s after SIGSTOP (limit ${timeout} s + 10 s), rc $rc, $(grep -o 'waited [0-9.]* s in [^;]*' "$OUT/job.log" | head -1)"
    ;;

  stopped_rank_random)
    # Either rank stopped at a random moment of rollouts 2-3 (sampling,
    # rewards, training, checkpoint and metrics writes): every try ends
    # within the timeout + 10 s, naming the stopped rank.
    timeout=5 tries=${DITRL_FAULT_TRIES:-20} table=""
    RANDOM=21
    for ((i = 0; i < tries; i++)); do
      rm -rf "$OUT/run"
      start --set parallel.collective_timeout_s=$timeout
      wait_for "checkpoint .*step-1.h5" 300
      rank=$((RANDOM % 2)) delay=$((RANDOM % 3000))
      sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
      victim=$(rank_pid $rank)
      [[ -n $victim ]] || fail "try $i: no rank $rank among the launcher's children"
      kill -STOP "$victim"
      finish $((timeout + 10 + 5))
      [[ $rc == hung ]] && fail "try $i (rank $rank stopped $delay ms after step-1): not ended within $took s"
      (( rc != 0 )) || fail "try $i: exit code 0 after a stopped rank"
      grep -q "collective timeout on rank $((1 - rank))" "$OUT/job.log" || fail "try $i: no watchdog message on rank $((1 - rank))"
      grep -q "rank $rank (not responding" "$OUT/job.log" || fail "try $i: the message does not name rank $rank"
      table+="r$rank+${delay}ms:${took}s "
    done
    pass "$tries/$tries tries ended within ${timeout} s + 10 s, naming the stopped rank ($table)"
    ;;

  stopped_rank_in_checkpoint)
    # Stopped inside a checkpoint, before its metadata: rank 0 writes the
    # metadata alone, then waits for rank 1 in the agreement that ends every
    # step of a save, which the watchdog must cover too.
    timeout=5
    DITRL_TEST_STOP_IN_CHECKPOINT=1:2 start --set parallel.collective_timeout_s=$timeout
    finish 120
    [[ $rc == hung ]] && fail "the job did not end within $took s"
    (( rc != 0 )) || fail "exit code 0 after a stopped rank"
    grep -q "collective timeout on rank 0: waited [0-9.]* s in io agreement after closing and syncing the checkpoint" \
      "$OUT/job.log" || fail "no watchdog message naming the checkpoint's agreement"
    grep -q "rank 1 (not responding" "$OUT/job.log" || fail "the message does not name rank 1"
    [[ $(latest_step) == step-1.h5 ]] || fail "latest is '$(latest_step)', not step-1.h5"
    check_resumes
    pass "ended $took s after the start, rc $rc, $(grep -o 'waited [0-9.]* s in [^;]*' "$OUT/job.log" | head -1)"
    ;;

  stopped_rank_at_exit)
    # Stopped after its work, before MPI_Finalize, which waits for every
    # peer; the watchdog is gone by then: a deadline ends the live rank.
    timeout=5
    DITRL_TEST_STOP_BEFORE_FINALIZE=1 start --set parallel.collective_timeout_s=$timeout --set train.num_rollouts=2
    finish 120
    [[ $rc == hung ]] && fail "the job did not end within $took s"
    grep -q "training complete: 2 rollouts" "$OUT/job.log" || fail "the run did not complete its 2 rollouts"
    (( rc == 124 )) || fail "exit code $rc, expected 124 (timed out)"
    grep -q "MPI_Finalize did not finish within $timeout s (\[parallel\] collective_timeout_s)" "$OUT/job.log" ||
      fail "no message naming MPI_Finalize and collective_timeout_s"
    [[ $(latest_step) == step-2.h5 ]] || fail "latest is '$(latest_step)', not step-2.h5"
    check_resumes
    pass "ended $took s after the start, rc $rc, latest step-2.h5 resumes"
    ;;

  stopped_rank_startup)
    # Stopped before training starts: startup_timeout_s applies.
    timeout=6
    start --set parallel.startup_timeout_s=$timeout
    t0=$SECONDS
    until victim=$(rank_pid 1); [[ -n $victim ]]; do (( SECONDS - t0 > 30 )) && fail "no rank 1"; sleep 0.05; done
    kill -STOP "$victim"
    finish $((timeout + 10 + 15))
    [[ $rc == hung ]] && fail "the job did not end within $took s"
    (( rc != 0 )) || fail "exit code 0"
    # Stopped before MPI was up: the bring-up timer; after: the watchdog.
    grep -Eq "collective timeout on rank 0|MPI start-up did not finish" "$OUT/job.log" || fail "no timeout message"
    grep -q "startup_timeout_s" "$OUT/job.log" || fail "the message does not name startup_timeout_s"
    pass "ended $took s after SIGSTOP at start-up, rc $rc"
    ;;

  disk_full_checkpoint)
    # A tmpfs of 3..19 MiB in a private mount namespace fills during a
    # checkpoint or a metrics write, at sizes that fill it at different
    # points (DITRL_FAULT_SIZES: other sizes, e.g. finer steps around one
    # checkpoint's size). Every try must end with exit 1 (the ranks agreed on
    # the error, or rank 0 alone failed outside a checkpoint and ended the
    # job), never at the watchdog's deadline; the cause named ("checkpoint
    # not written: disk full" when a checkpoint hit it); no temporary file
    # left to keep the disk full; and `latest`, where present, on a complete
    # step file. The tmpfs exists only inside the namespace, so its listing
    # is taken there before it goes. All tries run; the failures are listed.
    unshare -m true 2>/dev/null || { echo "SKIPPED: no mount namespaces here"; exit 77; }
    tries=${DITRL_FAULT_TRIES:-20} table="" bad=""
    read -ra sizes <<<"${DITRL_FAULT_SIZES:-}"
    (( ${#sizes[@]} > 0 )) && tries=${#sizes[@]}
    for ((i = 0; i < tries; i++)); do
      size=${sizes[i]:-$((3 + (i * 7) % 17))M}
      rm -rf "$OUT/mnt" "$OUT/left" && mkdir -p "$OUT/mnt"
      unshare -m bash -c "mount -t tmpfs -o size=$size tmpfs '$OUT/mnt' || exit 99
        $MPIEXEC -np 2 '$DITRL' train '$DECK' --set run.out_dir='$OUT/mnt/run' --set checkpoint.every=1 \
          --set checkpoint.keep=2 --set train.num_rollouts=40 --set parallel.collective_timeout_s=10
        rc=\$?
        mkdir -p '$OUT/left' && ls -A '$OUT/mnt/run/checkpoints' >'$OUT/left/files' 2>/dev/null
        cat '$OUT/mnt/run/checkpoints/latest' >'$OUT/left/latest' 2>/dev/null
        df -k --output=avail '$OUT/mnt' | tail -n 1 >'$OUT/left/avail'
        exit \$rc" >"$OUT/job.log" 2>&1 &
      job=$!
      finish 240
      [[ $rc == hung ]] && fail "try $i ($size): hung for $took s"
      (( rc != 99 )) || { echo "SKIPPED: cannot mount a tmpfs in a mount namespace"; exit 77; }
      cp "$OUT/job.log" "$OUT/job-$i.log"
      why=""
      (( rc == 1 )) || why+="exit $rc, expected 1 (124: the watchdog ended a hang); "
      where=$(disk_phase)
      if grep -q "checkpoint not written" "$OUT/job.log"; then
        grep -q "checkpoint not written: disk full" "$OUT/job.log" || why+="the checkpoint error does not say disk full; "
      elif ! grep -Eq "No space left on device|is full|errno 28" "$OUT/job.log"; then
        why+="the error does not name the cause; "
      fi
      left=$(grep -E '\.tmp$' "$OUT/left/files" 2>/dev/null | tr '\n' ' ')
      [[ -z $left ]] || why+="temporary files left on the full disk: $left; "
      named=$(cat "$OUT/left/latest" 2>/dev/null)
      if [[ -n $named ]] && ! { grep -qx "$named" "$OUT/left/files" && [[ $named == step-*.h5 ]]; }; then
        why+="latest names '$named', not a step file there; "
      fi
      [[ -z $why ]] || bad+="try $i ($size): $why"
      table+="$size:rc$rc:$where:${took}s:$(cat "$OUT/left/avail" 2>/dev/null | tr -d ' ')kB-free "
    done
    [[ -z $bad ]] || fail "$bad(all tries: $table)"
    pass "$tries/$tries tries exit 1 with the cause named, no .tmp left, no hang ($table)"
    ;;

  corrupt_latest)
    run_to 3
    latest=$(latest_step)
    [[ $latest == step-3.h5 ]] || fail "latest is '$latest' after 3 rollouts"
    # Flip bytes in the middle of the newest checkpoint: its SHA-256 fails.
    file=$OUT/run/checkpoints/step-3.h5
    size=$(stat -c %s "$file")
    printf '\xde\xad\xbe\xef\xde\xad\xbe\xef' | dd of="$file" bs=1 seek=$((size / 2)) conv=notrunc status=none
    $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" --resume auto --max-rollouts 1 >"$OUT/auto.log" 2>&1 ||
      { tail -n 20 "$OUT/auto.log" >&2; fail "--resume auto did not fall back past a corrupt latest"; }
    grep -q "skipping .*step-3.h5" "$OUT/auto.log" || fail "no warning naming the skipped checkpoint"
    grep -q "resumed from .*step-2.h5" "$OUT/auto.log" || fail "did not resume from step-2.h5"
    # latest deleted, step files present: the newest verifying one is used.
    rm -f "$OUT/run/checkpoints/latest"
    $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" --resume auto --max-rollouts 1 >"$OUT/nolatest.log" 2>&1 ||
      fail "--resume auto without latest failed"
    grep -q "resumed from" "$OUT/nolatest.log" || fail "--resume auto without latest restarted from zero"
    # No --resume while step files exist: an error, nothing overwritten.
    before=$(ls "$OUT/run/checkpoints")
    $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" >"$OUT/fresh.log" 2>&1 && fail "a fresh start over checkpoints succeeded"
    grep -q "already holds checkpoints" "$OUT/fresh.log" || fail "no 'already holds checkpoints' error"
    [[ $(ls "$OUT/run/checkpoints") == "$before" ]] || fail "the refused start changed the checkpoints"
    pass "corrupt latest skipped with a warning, missing latest resumed, fresh start refused"
    ;;

  corrupt_metrics)
    run_to 2
    truncate -s 1000 "$OUT/run/metrics.h5"
    $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" --resume auto --max-rollouts 1 >"$OUT/resume.log" 2>&1 ||
      { tail -n 20 "$OUT/resume.log" >&2; fail "a truncated metrics.h5 blocked the resume"; }
    grep -q "metrics file .* is damaged" "$OUT/resume.log" || fail "no warning about the damaged metrics file"
    [[ -f $OUT/run/metrics.h5.damaged ]] || fail "the damaged file was not kept aside"
    rm -f "$OUT/run/metrics.h5"
    $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" --resume auto --max-rollouts 1 >"$OUT/resume2.log" 2>&1 ||
      fail "a missing metrics.h5 blocked the resume"
    grep -q "metrics file .* is missing" "$OUT/resume2.log" || fail "no warning about the missing metrics file"
    pass "truncated metrics.h5 moved aside, missing one warned, training resumed both times"
    ;;

  changed_deck)
    run_to 1
    $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" --set rollout.batch=2 --set rollout.samples_per_prompt=8 --set run.seed=7 --resume auto \
      --max-rollouts 1 >"$OUT/changed.log" 2>&1 && fail "a resume with a changed batch and seed was accepted"
    grep -q "rollout.batch: checkpoint 4, deck 2" "$OUT/changed.log" || fail "rollout.batch not listed"
    grep -q "rollout.samples_per_prompt: checkpoint 4, deck 8" "$OUT/changed.log" || fail "samples_per_prompt not listed"
    grep -q "run.seed: checkpoint 42, deck 7" "$OUT/changed.log" || fail "run.seed not listed"
    # A changed model or loss fails the checkpoint's load itself; the keys
    # must still be named (before loading), and no advice may delete work.
    before=$(ls -l --time-style=+%s.%N "$OUT/run/checkpoints")
    for change in "model.lora.enabled=true:model.lora.enabled: checkpoint false, deck true" \
                  "train.loss=nft:train.loss: checkpoint grpo, deck nft" \
                  "model.family=wan:model.family: checkpoint sd3, deck wan"; do
      $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" --set "${change%%:*}" --resume auto --max-rollouts 1 \
        >"$OUT/model.log" 2>&1 && fail "a resume with ${change%%:*} was accepted"
      grep -q "${change#*:}" "$OUT/model.log" || { tail -n 5 "$OUT/model.log" >&2; fail "${change%%:*}: the changed key is not named"; }
      grep -q -- "--resume none" "$OUT/model.log" && fail "${change%%:*}: the error suggests --resume none (overwrites the checkpoints)"
    done
    [[ $(ls -l --time-style=+%s.%N "$OUT/run/checkpoints") == "$before" ]] || fail "a refused resume changed the checkpoints"
    $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" --set run.seed=7 --resume auto --max-rollouts 1 \
      --allow-changed-deck >"$OUT/allowed.log" 2>&1 || fail "--allow-changed-deck did not resume"
    pass "changed trajectory keys (batch, seed, LoRA, loss, family) refused with the list, accepted with --allow-changed-deck"
    ;;

  shared_out_dir)
    # A second job on a running job's out_dir (--resume none, then auto) is
    # refused at once, naming the first job, and touches nothing: the first
    # job completes and its metrics.h5 has every series as long as its steps.
    start --set train.num_rollouts=40
    wait_for "rollout 2/40" 300
    for resume in none auto; do
      $MPIEXEC -np 2 "$DITRL" train "$DECK" "${BASE[@]}" --set train.num_rollouts=40 --resume $resume \
        >"$OUT/second-$resume.log" 2>&1 && fail "a second job (--resume $resume) on the same out_dir ran"
      grep -q "is in use by another ditrl job (host $(hostname), PID [0-9]*, since " "$OUT/second-$resume.log" ||
        { tail -n 5 "$OUT/second-$resume.log" >&2; fail "--resume $resume: the refusal does not name the first job"; }
      kill -0 "$job" 2>/dev/null || fail "the first job ended while the second was refused"
    done
    finish 600
    (( rc == 0 )) || fail "the first job exited $rc"
    [[ $(cat "$OUT/run/status") == complete ]] || fail "the first job's status is $(cat "$OUT/run/status")"
    # `standard record` reads every series and refuses one of another length.
    "$DITRL" standard record "$OUT/run" "$OUT/check.json" >"$OUT/read.log" 2>&1 ||
      { cat "$OUT/read.log" >&2; fail "metrics.h5 does not read back"; }
    rows=$(python3 -c "import json; d=json.load(open('$OUT/check.json')); print(len(d['steps']))")
    (( rows == 40 )) || fail "metrics.h5 has $rows rows, expected 40"
    # The lock goes with the job: the next one may resume.
    check_resumes
    pass "second job refused with --resume none and auto, naming the first; first job complete with 40 equal rows"
    ;;

  signal_startup)
    # USR1 to every rank while it starts (model build, before rollout 0): the
    # run comes up, agrees to stop, writes status = preempted and exits 0.
    start
    t0=$SECONDS
    # As soon as both ranks catch USR1 (SigCgt bit 10: the handler `train`
    # installs first thing), before MPI and the model are up.
    catches() { local m; m=$(awk '/^SigCgt/ {print $2}' "/proc/$1/status" 2>/dev/null); [[ -n $m ]] && (( (16#$m >> 9) & 1 )); }
    both_catch() {
      ranks=$(ps -o pid= --ppid "$job")
      [[ $(echo $ranks | wc -w) -ge 2 ]] || return 1
      for p in $ranks; do catches "$p" || return 1; done
    }
    until both_catch; do
      (( SECONDS - t0 > 60 )) && fail "the ranks never installed a USR1 handler"
      sleep 0.02
    done
    for child in $ranks; do kill -USR1 "$child"; done
    grep -q "placement:" "$OUT/job.log" && echo "note: the signal came after start_runtime"
    finish 120
    [[ $rc == hung ]] && fail "hung after a start-up signal"
    (( rc == 0 )) || fail "exit $rc after a start-up signal (expected 0)"
    [[ $(cat "$OUT/run/status" 2>/dev/null) == preempted ]] || fail "status is '$(cat "$OUT/run/status" 2>/dev/null)', not preempted"
    pass "start-up signal: rc 0, status preempted"
    ;;

  signal_mpirun)
    # slurm/job.sh's mpirun path, TERM to the batch shell as `scancel` sends
    # it, during rollouts slower than Open MPI's ~1 s kill delay: the step
    # must still checkpoint and exit 0 (job.sh sends mpirun USR1).
    SLURM_NTASKS=2 DITRL_LAUNCHER=mpirun DITRL="$DITRL" DITRL_OUT="$OUT/run" \
      DITRL_SET="checkpoint.every=1000 train.num_rollouts=200 rollout.steps=40 rollout.height=16 rollout.width=16" \
      bash "$SRC/slurm/job.sh" "$DECK" >"$OUT/job.log" 2>&1 &
    job=$!
    wait_for "rollout 2/200" 600
    kill -TERM "$job"
    finish 300
    [[ $rc == hung ]] && fail "hung after TERM"
    (( rc == 0 )) || fail "job.sh exited $rc after TERM (the ranks were killed?)"
    [[ $(cat "$OUT/run/status" 2>/dev/null) == preempted ]] || fail "status is not preempted"
    [[ -n $(latest_step) ]] || fail "no checkpoint written on TERM"
    pass "TERM through mpirun: rc 0, status preempted, checkpoint $(latest_step)"
    ;;

  signal_startup_early)
    # A stop signal while a rank's libraries run their static initializers
    # (LibTorch's take most of its first second; the handlers used to come
    # only in `train`, 0.36-0.88 s after exec, so such a signal ended the rank
    # with 143/138 and no status): stall_init.c, preloaded into the ranks,
    # holds each one 2 s just before main and says so; both ranks get the
    # signal there. The handlers the executable installs before those
    # initializers must record it: the run comes up, agrees to stop before
    # building the model, writes status = preempted and exits 0. In
    # deterministic mode the process re-executes itself: a signal recorded in
    # the first image must stay pending across the exec (image 1), one in the
    # second image's start-up must be recorded again (image 2).
    stall=${DITRL_FAULT_STALL_LIB:-}
    if [[ ! -f $stall ]]; then  # not built (a build of the ditrl target alone): build it here
      stall=$OUT/stall_init.so
      cc -shared -fPIC -o "$stall" "$SRC/tests/faults/stall_init.c" 2>"$OUT/cc.log" ||
        { echo "SKIPPED: no stall library and cc cannot build tests/faults/stall_init.c: $(head -1 "$OUT/cc.log")"; exit 77; }
    fi
    tries=("TERM false 1" "USR1 false 1" "TERM true 1" "USR1 true 1" "TERM true 2" "USR1 true 2")
    table=""
    for try in "${tries[@]}"; do
      read -r sig det image <<<"$try"
      rm -rf "$OUT/run" "$OUT"/mark.*
      : >"$OUT/job.log"
      $MPIEXEC -np 2 -x LD_PRELOAD="$stall" -x DITRL_TEST_STALL_INIT="$OUT/mark" "$DITRL" train "$DECK" "${BASE[@]}" \
        --set train.num_rollouts=3 --set run.deterministic="$det" >"$OUT/job.log" 2>&1 &
      job=$!
      t0=$SECONDS
      # Both ranks (children of this mpiexec) in image $image's stall.
      until ranks=$(for p in $(children "$job"); do (( $(wc -l <"$OUT/mark.$p" 2>/dev/null || echo 0) >= image )) && echo "$p"; done)
            (( $(wc -w <<<"$ranks") == 2 )); do
        (( SECONDS - t0 > 120 )) && fail "$try: the ranks never reached the stall before main"
        kill -0 "$job" 2>/dev/null || fail "$try: the job ended before both ranks reached the stall"
        sleep 0.02
      done
      at_send=""
      for p in $ranks; do
        handles "$p" "$sig" && at_send+="handler," || at_send+="none,"
        kill -"$sig" "$p"
      done
      finish 180
      [[ $rc == hung ]] && fail "$try: hung after the signal"
      (( rc == 0 )) || fail "$try: exit $rc after $sig before main (handlers at the send: $at_send)"
      [[ $(cat "$OUT/run/status" 2>/dev/null) == preempted ]] ||
        fail "$try: status is '$(cat "$OUT/run/status" 2>/dev/null)', not preempted (the signal was lost?)"
      table+="$sig$([[ $det == true ]] && echo "-det-image$image"):${at_send%,}:$(stop_point) "
    done
    pass "${#tries[@]}/${#tries[@]} tries rc 0, status preempted ($table)"
    ;;

  signal_mpirun_term)
    # TERM to mpirun itself (what `kill`, `timeout` and schedulers that signal
    # only the launcher send), with mpirun's defaults (Open MPI's default delay:
    # the ranks get TERM 1 s after mpirun, SIGKILL 1 s later), at random
    # moments of rollouts slower than that second: the ranks stop at their
    # next safe point, checkpoint and write status = preempted; `latest`
    # resumes. mpirun exits 1 after a TERM of its own however its ranks
    # ended (Open MPI's choice), so its code is recorded, not asserted.
    tries=${DITRL_FAULT_TRIES:-3} table=""
    RANDOM=7
    for ((i = 0; i < tries; i++)); do
      rm -rf "$OUT/run"
      start --set checkpoint.every=1000 "${SLOW[@]}"
      wait_for "rollout 2/200" 600
      delay=$((RANDOM % 6000))
      sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
      kill -TERM "$job"
      finish 60
      [[ $rc == hung ]] && fail "try $i: hung after TERM"
      [[ $(cat "$OUT/run/status" 2>/dev/null) == preempted ]] ||
        fail "try $i (TERM $delay ms after rollout 2): status is '$(cat "$OUT/run/status" 2>/dev/null)', not preempted (rc $rc)"
      saved=$(latest_step)
      [[ -n $saved ]] || fail "try $i: no checkpoint written on TERM"
      check_resumes "${SLOW[@]}"
      table+="+${delay}ms:rc$rc:$(stop_point):$saved:${took}s "
    done
    pass "$tries/$tries tries checkpointed with status preempted ($table)"
    ;;

  signal_jobsh_term)
    # slurm/job.sh's mpirun path during rollouts slower than a second, as a
    # plain `scancel` or a preemption on one node signals it: TERM to the
    # batch shell, mpirun and the ranks at once; then TERM to mpirun alone
    # (its ranks hear of it only when mpirun passes it on, after job.sh's
    # OMPI_MCA_odls_base_sigkill_timeout). Both times the ranks checkpoint,
    # status is preempted and job.sh exits 0 although mpirun exits 1.
    table=""
    for who in all mpirun; do
      rm -rf "$OUT/run"
      : >"$OUT/job.log"  # now: wait_for must not read the previous job's log
      SLURM_NTASKS=2 DITRL_LAUNCHER=mpirun DITRL="$DITRL" DITRL_OUT="$OUT/run" \
        DITRL_SET="checkpoint.every=1000 train.num_rollouts=200 rollout.steps=400 rollout.height=16 rollout.width=16" \
        bash "$SRC/slurm/job.sh" "$DECK" >"$OUT/job.log" 2>&1 &
      job=$!
      wait_for "rollout 2/200" 600
      launcher=""
      for p in $(children "$job"); do [[ $(cat "/proc/$p/comm" 2>/dev/null) == mpirun ]] && launcher=$p; done
      [[ -n $launcher ]] || fail "$who: no mpirun under job.sh"
      targets=$launcher
      if [[ $who == all ]]; then
        targets+=" $job $(children "$launcher" | tr '\n' ' ')"
        (( $(wc -w <<<"$targets") == 4 )) || fail "all: expected job.sh, mpirun and 2 ranks, found: $targets"
      fi
      kill -TERM $targets
      finish 200
      [[ $rc == hung ]] && fail "$who: hung after TERM"
      (( rc == 0 )) || fail "$who: job.sh exited $rc after TERM"
      [[ $(cat "$OUT/run/status" 2>/dev/null) == preempted ]] || fail "$who: status is not preempted"
      saved=$(latest_step)
      [[ -n $saved ]] || fail "$who: no checkpoint written on TERM"
      check_resumes "${SLOW[@]}"
      table+="TERM-$who:$(grep -o 'step exited [0-9]*' "$OUT/job.log" | tr ' ' '-'):$(stop_point):$saved:${took}s "
    done
    pass "TERM through job.sh's mpirun: rc 0, status preempted, checkpoint written ($table)"
    ;;

  *) fail "unknown scenario" ;;
esac
