# A private multi-node Slurm cluster on one machine, sourced by
# tests/multinode/run.sh and benchmarks/scaling/multinode_bytes.sh.
#
# Each test host ("node1".."nodeN") is a set of Linux namespaces held open by
# one marker process: its own network namespace (one interface, eth0, with a
# private address on a bridge in a separate "switch" namespace), its own
# hostname (UTS namespace) and its own mount namespace, where /tmp and
# /dev/shm are private tmpfs (node-local scratch, so no two hosts can meet
# through shared memory or a /tmp file) and /etc/hosts names the cluster.
# Everything else on the file system is shared, as a cluster's shared file
# system is: the checkout, the build and $WORKDIR (the run folder).
#
# The machine's own network is never touched: every interface, address and
# route lives inside namespaces made here, and nothing outside them is
# contacted. Killing a host's processes (and its marker) makes its namespaces
# and its cable vanish.
#
# One munged (root network namespace; Unix socket in $WORKDIR, which does not
# depend on the network namespace) serves every host, as one shared key does
# on a cluster. slurmctld runs on node1, one slurmd per host (node name -N),
# proctrack/linuxproc + task/none (no usable cgroups in these VMs).
#
# Needs: root, util-linux (unshare, nsenter, setsid), iproute2 (ip), procps
# (pgrep), slurm-wlm, munge.

MN_NET=${MN_NET:-10.77.0}  # /24 inside the switch namespace only
MN_MARK=ditrl-multinode-host
source "$(dirname "${BASH_SOURCE[0]}")/../slurm/cluster.sh"  # slurm_install

mn_alive() { [[ -r /proc/$1/stat ]] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }

# Waits (bounded) until a PID has exited; a zombie counts as gone.
mn_wait_gone() {  # mn_wait_gone PID [tenths of a second]
  local i
  for ((i = 0; i < ${2:-100}; i++)); do mn_alive "$1" || return 0; sleep 0.1; done
  return 1
}

mn_holder() { cat "$WORKDIR/ns/$1.pid" 2>/dev/null; }

# Runs a command on a test host (its network, hostname and mounts).
on() {  # on HOST command...
  local host=$1 pid
  shift
  pid=$(mn_holder "$host")
  [[ -n $pid ]] && mn_alive "$pid" || { echo "on $host: the host is not up" >&2; return 1; }
  nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- "$@"
}

# Starts a daemon on a test host in the background, its PID into FILE.
# nsenter execs the command (no fork without --pid), so the PID is the
# daemon's own: `on ... &` would record a subshell's.
mn_daemon() {  # mn_daemon HOST PIDFILE LOGFILE command...
  local host=$1 pidfile=$2 log=$3 pid
  shift 3
  pid=$(mn_holder "$host")
  nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- "$@" </dev/null >"$log" 2>&1 &
  echo $! >"$pidfile"
  disown $!
}

# PIDs of every process in a host's network namespace, its marker included.
# The namespace is known by the inode recorded at creation, so processes
# are found even when the marker has died first.
mn_host_pids() {  # mn_host_pids HOST
  local ns p
  ns=$(cat "$WORKDIR/ns/$1.net" 2>/dev/null)
  [[ -n $ns ]] || return 0
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/ns/net" 2>/dev/null) == "$ns" ]] && echo "${p#/proc/}"
  done
}

# The host's eth0 counters from its own /proc/net/dev: "rx_bytes tx_bytes".
mn_net_bytes() {  # mn_net_bytes HOST
  on "$1" awk '/^ *eth0:/ { sub(/^ *eth0:/, ""); print $1, $9 }' /proc/net/dev
}

# Starts a namespace holder: `unshare` execs a `sleep` renamed to the marker
# "ditrl-multinode-host WORKDIR NAME", whose namespaces make the host. It
# runs in its own session, so a signal to the test's process group (Ctrl-C,
# a CTest timeout) cannot take the marker before the daemons it holds; it
# is found by that command line (setsid forks when it leads a group, so $!
# is not always its PID).
mn_start_holder() {  # mn_start_holder NAME unshare-flags...
  local name=$1 pid i
  shift
  setsid unshare "$@" -- bash -c "exec -a '$MN_MARK $WORKDIR $name' sleep infinity" </dev/null >/dev/null 2>&1 &
  disown $!  # killed on purpose later: no "Killed" notice from bash
  for ((i = 0; i < 50; i++)); do
    pid=$(pgrep -x -f "$MN_MARK $WORKDIR $name infinity" | head -1)
    if [[ -n $pid ]]; then
      echo "$pid" >"$WORKDIR/ns/$name.pid"
      readlink "/proc/$pid/ns/net" >"$WORKDIR/ns/$name.net"
      return 0
    fi
    sleep 0.1
  done
  echo "namespace holder for $name did not start" >&2
  return 1
}

# Hosts that a killed earlier run (SIGKILL, a CTest timeout: no trap ran)
# left behind: their marker names a work directory whose owner test process
# is gone. Every process in their network namespaces goes, and the munged
# that run started (root namespace; its command line names that directory).
mn_sweep_stale() {
  local p q cmd dir owner ns pid
  for p in /proc/[0-9]*; do
    cmd=$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
    [[ $cmd == "$MN_MARK "* ]] || continue
    dir=$(awk '{print $2}' <<<"$cmd")
    owner=$(cat "$dir/owner" 2>/dev/null || echo 0)
    [[ $owner != 0 ]] && mn_alive "$owner" && continue
    echo "multinode: removing a stale test host left by an earlier run ($cmd)" >&2
    ns=$(readlink "$p/ns/net" 2>/dev/null) || continue
    for q in /proc/[0-9]*; do
      [[ $(readlink "$q/ns/net" 2>/dev/null) == "$ns" ]] && kill -KILL "${q#/proc/}" 2>/dev/null
    done
    pid=$(cat "$dir/munge/munged.pid" 2>/dev/null)
    [[ -n $pid ]] && [[ $({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null) == *"$dir/munge/"* ]] &&
      kill -TERM "$pid" 2>/dev/null
  done
  return 0
}

# Creates the switch and N hosts, the cluster's files, munged, slurmctld on
# node1 and one slurmd per host; waits until every node is idle.
mn_up() {  # mn_up N
  : "${WORKDIR:?}"
  local n=$1 i host
  (( n >= 2 && n <= 9 )) || { echo "mn_up: 2-9 hosts, not $n" >&2; return 1; }
  MN_HOSTS=()
  for ((i = 1; i <= n; i++)); do MN_HOSTS+=("node$i"); done
  mkdir -p "$WORKDIR"/{ns,state,spool,log,etc} && chmod 0755 "$WORKDIR"
  echo $$ >"$WORKDIR/owner"
  mn_sweep_stale

  # A private /tmp would hide anything below /tmp from the hosts.
  local private_tmp=1 path
  for path in "$WORKDIR" "${ROOT:-}" "${DITRL:-}"; do [[ $path == /tmp/* ]] && private_tmp=0; done
  [[ $private_tmp == 0 ]] && echo "multinode: a path lies under /tmp: the hosts share the machine's /tmp" >&2

  {
    echo "127.0.0.1 localhost"
    for ((i = 1; i <= n; i++)); do echo "$MN_NET.$i node$i"; done
  } >"$WORKDIR/etc/hosts"

  mn_start_holder switch --net || return 1
  local sw
  sw=$(mn_holder switch)
  nsenter -t "$sw" --net -- sh -c 'ip link set lo up && ip link add br0 type bridge && ip link set br0 up' ||
    { echo "cannot make a bridge in the switch namespace" >&2; return 1; }
  for ((i = 1; i <= n; i++)); do
    host=node$i
    mn_start_holder "$host" --net --uts --mount || return 1
    local pid
    pid=$(mn_holder "$host")
    # The cable: eth0 on the host, port <host> on the switch's bridge.
    ip link add eth0 netns "$pid" type veth peer name "$host" netns "$sw" ||
      { echo "cannot create a veth pair into the namespaces" >&2; return 1; }
    nsenter -t "$sw" --net -- sh -c "ip link set $host master br0 && ip link set $host up" || return 1
    nsenter -t "$pid" --net --uts --mount -- sh -c "
      set -e
      hostname $host
      ip link set lo up
      ip addr add $MN_NET.$i/24 dev eth0
      ip link set eth0 up
      mount --bind '$WORKDIR/etc/hosts' /etc/hosts
      mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm
      if [ $private_tmp = 1 ]; then mount -t tmpfs -o size=2g,mode=1777 tmpfs /tmp; fi
    " || { echo "cannot configure host $host (network, hostname or mounts)" >&2; return 1; }
  done

  mkdir -m 0755 -p "$WORKDIR/munge"
  mungekey --create --keyfile="$WORKDIR/munge/munge.key" 2>/dev/null || { echo "mungekey failed" >&2; return 1; }
  munged --key-file="$WORKDIR/munge/munge.key" --socket="$WORKDIR/munge/munge.sock" \
    --pid-file="$WORKDIR/munge/munged.pid" --log-file="$WORKDIR/munge/munged.log" \
    --seed-file="$WORKDIR/munge/munged.seed" || { echo "munged did not start" >&2; return 1; }

  mn_write_conf "$n" || return 1
  export SLURM_CONF="$WORKDIR/slurm.conf"
  mkdir -p "$WORKDIR/spool"
  mn_daemon node1 "$WORKDIR/slurmctld.bgpid" "$WORKDIR/log/slurmctld.out" slurmctld -D -c -f "$SLURM_CONF"
  for host in "${MN_HOSTS[@]}"; do mn_start_slurmd "$host"; done
  local idle
  for ((i = 0; i < 150; i++)); do
    idle=$(on node1 sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')
    [[ $idle == "$n" ]] && return 0
    sleep 0.2
  done
  echo "only $idle of $n nodes reached idle in 30 s:" >&2
  on node1 sinfo -N >&2 2>&1
  tail -n 5 "$WORKDIR"/log/* >&2
  return 1
}

mn_start_slurmd() {  # mn_start_slurmd HOST
  mkdir -p "$WORKDIR/spool/$1"
  mn_daemon "$1" "$WORKDIR/slurmd-$1.bgpid" "$WORKDIR/log/slurmd-$1.out" slurmd -D -N "$1" -f "$SLURM_CONF"
}

# slurm.conf for node1..nodeN. Every node line comes from `slurmd -C` (all
# hosts share this machine's CPUs and memory). The timeouts are short so a
# dead node is declared DOWN in seconds, not Slurm's default 5 minutes, yet
# long enough that 4 ranks busy-polling 2 cores do not starve a slurmd
# into a false alarm.
mn_write_conf() {  # mn_write_conf N
  local n=$1 i node_line
  node_line=$(slurmd -C 2>/dev/null | head -n1 | sed 's/^NodeName=[^ ]* //')
  [[ -n $node_line ]] || { echo "slurmd -C printed no node line" >&2; return 1; }
  cat >"$WORKDIR/slurm.conf" <<CONF
ClusterName=ditrlmn
SlurmctldHost=node1($MN_NET.1)
SlurmctldPort=6817
SlurmdPort=6818
FirstJobId=100
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$WORKDIR/munge/munge.sock
StateSaveLocation=$WORKDIR/state
SlurmdSpoolDir=$WORKDIR/spool/%n
SlurmctldPidFile=$WORKDIR/slurmctld.pid
SlurmdPidFile=$WORKDIR/spool/%n/slurmd.pid
SlurmctldLogFile=$WORKDIR/log/slurmctld.log
SlurmdLogFile=$WORKDIR/log/slurmd-%n.log
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
SlurmdTimeout=${MN_SLURMD_TIMEOUT:-6}
MessageTimeout=${MN_MESSAGE_TIMEOUT:-5}
KillWait=${MN_KILL_WAIT:-5}
InactiveLimit=0
CONF
  for ((i = 1; i <= n; i++)); do
    echo "NodeName=node$i NodeAddr=$MN_NET.$i $node_line State=UNKNOWN" >>"$WORKDIR/slurm.conf"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$WORKDIR/slurm.conf"
}

# A power cut: the cable goes first (no peer sees a FIN or RST: silence, as
# when a node dies), then every process of the host at once, its ranks,
# slurmstepd and slurmd included, then the namespaces with their marker.
mn_kill_host() {  # mn_kill_host HOST
  local host=$1 sw pids
  sw=$(mn_holder switch)
  nsenter -t "$sw" --net -- ip link del "$host" 2>/dev/null
  pids=$(mn_host_pids "$host")
  [[ -n $pids ]] && kill -KILL $pids 2>/dev/null
  local p
  for p in $pids; do mn_wait_gone "$p" 50; done
  rm -f "$WORKDIR/ns/$host.pid" "$WORKDIR/ns/$host.net"
}

# Stops what mn_up started, by recorded PID, then anything still running on
# a test host (stray ranks), then the namespaces. Safe to call twice.
mn_down() {
  [[ -n ${WORKDIR:-} && -d $WORKDIR/ns ]] || return 0
  export SLURM_CONF="$WORKDIR/slurm.conf"
  local f p host
  if [[ -s $WORKDIR/slurmctld.bgpid ]] && mn_alive "$(cat "$WORKDIR/slurmctld.bgpid")"; then
    on node1 scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 50); do [[ -z $(on node1 squeue -h 2>/dev/null) ]] && break; sleep 0.2; done
  fi
  for f in "$WORKDIR"/slurmd-*.bgpid "$WORKDIR/slurmctld.bgpid" "$WORKDIR/munge/munged.pid"; do
    [[ -s $f ]] || continue
    p=$(cat "$f")
    kill -TERM "$p" 2>/dev/null || true
    mn_wait_gone "$p" 50 || kill -KILL "$p" 2>/dev/null
    rm -f "$f"
  done
  for f in "$WORKDIR"/ns/*.pid; do
    [[ -s $f ]] || continue
    host=$(basename "$f" .pid)
    for p in $(mn_host_pids "$host"); do kill -KILL "$p" 2>/dev/null; done
    p=$(cat "$f")
    kill -KILL "$p" 2>/dev/null
    mn_wait_gone "$p" 50
    rm -f "$f" "${f%.pid}.net"
  done
}

# Why multi-node tests cannot run here, or nothing (exit 0) when they can.
mn_unsupported() {
  [[ $(id -u) == 0 ]] || { echo "creating network namespaces and starting slurmctld/slurmd/munged needs root"; return 0; }
  local tool
  for tool in unshare nsenter setsid ip pgrep; do
    command -v "$tool" >/dev/null || { echo "no $tool (util-linux / iproute2 / procps)"; return 0; }
  done
  # Probe the kernel: a throwaway namespace pair with a veth and a bridge.
  if ! unshare --net --uts --mount -- sh -c 'hostname probe && ip link add probe0 type veth peer name probe1 && ip link add probebr type bridge && mount -t tmpfs tmpfs /dev/shm' >/dev/null 2>&1; then
    echo "this kernel or sandbox does not allow network/UTS/mount namespaces with veth and bridge devices"
    return 0
  fi
  return 1
}
