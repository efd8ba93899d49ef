# A private one-node Slurm (slurmctld + slurmd + munged) for tests, sourced
# by tests/slurm/run.sh. Recipe: Debian's slurm-wlm and munge, proctrack/
# linuxproc, task/none, no cgroups (the freezer controller is unusable in
# containers). Everything lives in $WORKDIR with its own munge socket, ports
# and job ids, so concurrent runs on one machine do not collide.

# Installs the packages if missing; returns non-zero with a reason on stderr.
slurm_install() {
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    command -v apt-get >/dev/null || { echo "no slurm-wlm/munge and no apt-get to install them" >&2; return 1; }
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null 2>&1 ||
      { echo "apt-get install slurm-wlm munge failed" >&2; return 1; }
  fi
}

slurm_up() {
  : "${WORKDIR:?}"
  mkdir -p "$WORKDIR"/{state,spool,log} && chmod 0755 "$WORKDIR"
  mkdir -m 0755 -p "$WORKDIR/munge"
  mungekey --create --keyfile="$WORKDIR/munge/munge.key" 2>/dev/null || { echo "mungekey failed" >&2; return 1; }
  munged --key-file="$WORKDIR/munge/munge.key" --socket="$WORKDIR/munge/munge.sock" \
    --pid-file="$WORKDIR/munge/munged.pid" --log-file="$WORKDIR/munge/munged.log" \
    --seed-file="$WORKDIR/munge/munged.seed" || { echo "munged did not start" >&2; return 1; }
  local base=$((20000 + ($$ % 2000) * 4))
  cat >"$WORKDIR/slurm.conf" <<CONF
ClusterName=ditrltest
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
FirstJobId=$((1000 + ($$ % 2000) * 100))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$WORKDIR/munge/munge.sock
StateSaveLocation=$WORKDIR/state
SlurmdSpoolDir=$WORKDIR/spool
SlurmctldPidFile=$WORKDIR/slurmctld.pid
SlurmdPidFile=$WORKDIR/slurmd.pid
SlurmctldLogFile=$WORKDIR/log/slurmctld.log
SlurmdLogFile=$WORKDIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
SchedulerParameters=sched_interval=1,bf_interval=1
$(slurmd -C | head -n1) NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF="$WORKDIR/slurm.conf"
  slurmctld -D -c -f "$SLURM_CONF" >"$WORKDIR/log/slurmctld.out" 2>&1 &
  echo $! >"$WORKDIR/slurmctld.bgpid"
  slurmd -D -f "$SLURM_CONF" >"$WORKDIR/log/slurmd.out" 2>&1 &
  echo $! >"$WORKDIR/slurmd.bgpid"
  for _ in $(seq 100); do [[ $(sinfo -h -o %t 2>/dev/null) == idle ]] && return 0; sleep 0.2; done
  echo "the node did not reach idle in 20 s:" >&2
  tail -n 5 "$WORKDIR"/log/*.out "$WORKDIR"/log/*.log >&2
  return 1
}

# Stops what slurm_up started, by recorded PID (a zombie counts as gone).
slurm_down() {
  [[ -n ${WORKDIR:-} && -f $WORKDIR/slurm.conf ]] || return 0
  export SLURM_CONF="$WORKDIR/slurm.conf"
  alive() { [[ -r /proc/$1/stat ]] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat"; }
  if [[ -s $WORKDIR/slurmctld.bgpid ]] && alive "$(cat "$WORKDIR/slurmctld.bgpid")"; then
    scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 100); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.1; done
  fi
  local f p
  for f in slurmd.bgpid slurmctld.bgpid munge/munged.pid; do
    [[ -s $WORKDIR/$f ]] || continue
    p=$(cat "$WORKDIR/$f")
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 100); do alive "$p" || break; sleep 0.1; done
    alive "$p" && kill -KILL "$p" 2>/dev/null
    rm -f "$WORKDIR/$f"
  done
}
