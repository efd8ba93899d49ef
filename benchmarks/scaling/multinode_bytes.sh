#!/bin/bash
# Bytes over the network per optimizer step, measured on the multi-node test
# cluster (tests/multinode/cluster.sh: 4 namespace hosts on a private bridge,
# a slurmd each, Open MPI over TCP between hosts, shared memory inside one),
# against what the cost model of benchmarks/results/scaling.md predicts from
# `ditrl plan`.
#
# For each layout (hosts x ranks per host: 2x2, 4x1, 4x2) and model (the
# quickstart's tiny SD3, 0.6M parameters; the SD3 ~100M benchmark config),
# slurm/multinode.sbatch runs `ditrl train` twice, for R1 and R2 rollouts
# (weak scaling: one micro-batch per rank, one optimizer step per rollout); the
# difference over R2 - R1 is one step without start-up, wire-up and the final
# checkpoint. Two counters per run:
#   - wire: every host's eth0 rx/tx bytes (/proc/net/dev in its namespace),
#     Ethernet frames as the kernel counts them (TCP/IP headers, ACKs, Slurm's
#     pings included);
#   - logical: a PMPI shim (benchmarks/scaling/mpi_bytes_shim.c, LD_PRELOAD) counts
#     what each rank's MPI_Allgather (parameter gathers) and MPI_Alltoall
#     (ditrl's deterministic gradient reduce-scatter) move to or from other
#     ranks, whatever the transport, split at 64 KiB from control traffic.
#
#   benchmarks/scaling/multinode_bytes.sh [build/ditrl] [OUT.md]   (root; ~10 min on 2 cores)
#   MULTINODE_BYTES_MODELS="tiny sd3-100m"  MULTINODE_BYTES_LAYOUTS="2x2 4x1 4x2"
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DITRL=$(realpath "${1:-$ROOT/build/ditrl}")
OUT_MD=$(realpath -m "${2:-$ROOT/benchmarks/results/multinode_bytes.md}")
source "$ROOT/tests/multinode/cluster.sh"
MODELS=${MULTINODE_BYTES_MODELS:-tiny sd3-100m}
LAYOUTS=${MULTINODE_BYTES_LAYOUTS:-2x2 4x1 4x2}

if [[ -n ${MULTINODE_BYTES_REPORT:-} ]]; then  # only rewrite the report from an earlier run's directory
  WORKDIR=$(realpath "$MULTINODE_BYTES_REPORT")
else
reason=$(mn_unsupported) && { echo "multinode_bytes: cannot run here: $reason"; exit 1; }
slurm_install || exit 1
export WORKDIR
WORKDIR=$(mktemp -d /var/tmp/ditrl-multinode-bytes.XXXXXX)
# The counters and the shim's files stay for MULTINODE_BYTES_REPORT=DIR.
trap 'mn_down; echo "multinode_bytes: raw counters kept in $WORKDIR" >&2' EXIT
trap 'exit 130' INT TERM
mn_up 4 || exit 1
cd "$WORKDIR"
git -C "$ROOT" rev-parse --short HEAD >commit
mpicc -shared -fPIC -O2 -o mpi_bytes_shim.so "$ROOT/benchmarks/scaling/mpi_bytes_shim.c" || exit 1
cat >ditrl-counted <<SH
#!/bin/sh
export LD_PRELOAD=$WORKDIR/mpi_bytes_shim.so\${LD_PRELOAD:+:\$LD_PRELOAD}
exec $DITRL "\$@"
SH
chmod +x ditrl-counted

MPI_ENV=(OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self,vader "OMPI_MCA_btl_tcp_if_include=$MN_NET.0/24"
  "OMPI_MCA_oob_tcp_if_include=$MN_NET.0/24" OMPI_MCA_mpi_yield_when_idle=1)

# Deck overrides: weak scaling with one micro-batch (= rollout micro-group)
# per rank, so each forward gathers every unit once and each backward
# reduce-scatters once; one optimizer step per rollout; the checkpoint only
# at the end (the same in both runs of a pair). One thread per rank: the test
# hosts share 2 cores, and each believes it has them all.
model_set() {  # model_set MODEL RANKS
  local n=$2 common="run.deterministic=false run.threads=1 train.steps_per_rollout=1 checkpoint.every=1000 checkpoint.keep=1"
  case $1 in
    # quickstart: 4 samples per rank, 10 denoising steps, 2 trained SDE steps each
    tiny) echo "$common rollout.batch=$n rollout.samples_per_prompt=4 train.global_batch=$((4 * n)) train.micro_batch=4" ;;
    # SD3 ~100M: 1 sample per rank (CPU time), 2 denoising steps, 1 trained step
    sd3-100m) echo "$common model.config=$ROOT/benchmarks/configs/sd3-100m.json rollout.batch=$((n / 2))" \
      "rollout.samples_per_prompt=2 train.global_batch=$n train.micro_batch=1 rollout.steps=2 rollout.window=[0,1]" \
      "rollout.sde_steps=1" ;;
  esac
}
rollouts() { [[ $1 == tiny ]] && echo "1 3" || echo "1 2"; }

counters() {  # "host rx tx" per host
  local h
  for h in "${MN_HOSTS[@]}"; do echo "$h $(mn_net_bytes "$h")"; done
}

run_once() {  # run_once TAG MODEL HOSTS PER_HOST ROLLOUTS
  local tag=$1 model=$2 hosts=$3 per=$4 r=$5 n=$(($3 * $4)) job
  mkdir -p "$tag/shim"
  counters >"$tag/before"
  job=$(on node1 env "${MPI_ENV[@]}" DITRL="$WORKDIR/ditrl-counted" DITRL_HOME="$ROOT" DITRL_OUT="$WORKDIR/$tag/run" \
    DITRL_MPI_BYTES_DIR="$WORKDIR/$tag/shim" DITRL_SET="$(model_set "$model" "$n") train.num_rollouts=$r" \
    sbatch --parsable --wait --gpus-per-node=0 --cpus-per-task=1 --time=30 -N "$hosts" -w "node[1-$hosts]" --ntasks-per-node="$per" \
    -J "$tag" -o "$tag/job.out" "$ROOT/slurm/multinode.sbatch" "$ROOT/inputs/quickstart.toml")
  local rc=$?
  counters >"$tag/after"
  [[ $rc == 0 && $(cat "$tag/run/status" 2>/dev/null) == complete ]] ||
    { echo "run $tag failed (rc $rc): $(tail -n 3 "$tag/job.out")"; return 1; }
  grep -h "s/rollout" "$tag/job.out" | tail -1 | sed 's/.*  \([0-9.]* s\/rollout\).*/\1/' >"$tag/speed"
  "$DITRL" plan "$ROOT/inputs/quickstart.toml" --ranks "$n" $(printf -- '--set %s ' $(model_set "$model" "$n")) >"$tag/plan"
}

echo "multinode_bytes: $(date -u '+%F %H:%M') UTC, commit $(git -C "$ROOT" rev-parse --short HEAD)" >&2
for model in $MODELS; do
  for layout in $LAYOUTS; do
    hosts=${layout%x*} per=${layout#*x}
    read -r r1 r2 <<<"$(rollouts "$model")"
    for r in $r1 $r2; do
      echo "== $model $layout, $r rollout(s) $(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
      run_once "$model-$layout-r$r" "$model" "$hosts" "$per" "$r" || exit 1
      rm -rf "$model-$layout-r$r/run/checkpoints"  # up to 1.3 GB each; the counters are what we keep
    done
  done
done
fi

/usr/bin/python3 - "$WORKDIR" "$OUT_MD" "$MODELS" "$LAYOUTS" "$(cat "$WORKDIR/commit" 2>/dev/null || echo unknown)" <<'PY'
import glob, os, re, subprocess, sys, time
work, out_md, models, layouts, commit = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split(), sys.argv[5]

def counters(path):
    rows = {}
    for line in open(path):
        host, rx, tx = line.split()
        rows[host] = (int(rx), int(tx))
    return rows

def shim(tag):
    total = {}
    ranks = glob.glob(f"{work}/{tag}/shim/rank-*.txt")
    for path in ranks:
        for line in open(path):
            op, size, calls, nbytes = line.split()
            if op == "size":
                continue
            key = (op, size)
            c, b = total.get(key, (0, 0))
            total[key] = (c + int(calls), b + int(nbytes))
    return total, len(ranks)

def plan_bytes(tag, field):
    text = open(f"{work}/{tag}/plan").read()
    return int(re.search(rf"{field}\s+[0-9.]+ MiB \((\d+) B\)", text).group(1))

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}

def plan_units(tag):
    """(wrap units, compute bytes of the root unit) from the plan's table."""
    text = open(f"{work}/{tag}/plan").read()
    units = int(re.search(r"in (\d+) wrap units \+ root", text).group(1))
    root = 0
    for line in text.splitlines():
        # parameter, unit, shape, rank 0 range ("-" or "[a, b)"), master, compute, ...
        m = re.match(r"\S+\s+\(root\)\s+\[([0-9, ]*)\]\s+(?:-|\[[^)]*\))\s+\S+\s+(\S+)", line)
        if m:
            numel = 1
            for d in m.group(1).split(","):
                numel *= int(d) if d.strip() else 1
            root += numel * DTYPE_BYTES[m.group(2)]
    return units, root

MiB = 1 << 20
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
machine = f"{os.cpu_count()} vCPU {cpu}, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB, " \
          f"load average {open('/proc/loadavg').read().split()[0]} when the report was written"
rows = []
for model in models:
    for layout in layouts:
        hosts, per = map(int, layout.split("x"))
        n = hosts * per
        tags = sorted(glob.glob(f"{work}/{model}-{layout}-r*"), key=lambda p: int(p.rsplit("r", 1)[1]))
        (t1, r1), (t2, r2) = [(os.path.basename(t), int(t.rsplit("r", 1)[1])) for t in tags]
        steps = r2 - r1
        used = [f"node{i}" for i in range(1, hosts + 1)]
        def wire(tag):  # (tx, rx) per host, mean over the job's hosts
            b, a = counters(f"{work}/{tag}/before"), counters(f"{work}/{tag}/after")
            return (sum(a[h][1] - b[h][1] for h in used) / hosts, sum(a[h][0] - b[h][0] for h in used) / hosts)
        (tx1, rx1), (tx2, rx2) = wire(t1), wire(t2)
        s1, _ = shim(t1)
        s2, k2 = shim(t2)
        def per_rank_step(op, size="bulk"):
            d = [s2.get((op, size), (0, 0))[i] - s1.get((op, size), (0, 0))[i] for i in (0, 1)]
            return d[1] / k2 / steps, d[0] / k2 / steps
        gather, gather_calls = per_rank_step("allgather")
        rs, rs_calls = per_rank_step("alltoall")
        small = sum(per_rank_step(op, "small")[0] + (per_rank_step(op)[0] if op not in ("allgather", "alltoall") else 0)
                    for op in ("allgather", "allgatherv", "alltoall", "bcast", "gather"))
        # The cost model of scaling.md, fed by the plan: a gather pass moves
        # the whole compute model (V_g = compute shard x N), a reduce-scatter
        # the whole fp32 gradient (V_rs = grads x N); a gather per forward
        # (rollout: per denoising step and micro-group; training: forward +
        # backward recompute per micro-batch), a reduce-scatter per
        # micro-batch; each rank moves (N-1)/N of every pass.
        v_g = plan_bytes(t2, "compute shard") * n
        v_rs = plan_bytes(t2, "grads") * n
        units, v_root = plan_units(t2)
        denoise, sde = (10, 2) if model == "tiny" else (2, 1)
        passes_g = denoise + 2 * sde  # one micro-group / micro-batch per rank per pass
        passes_rs = sde
        plan_g = passes_g * v_g * (n - 1) / n
        plan_rs = passes_rs * v_rs * (n - 1) / n
        # ditrl gathers the root unit (embeddings, final layer) once per step,
        # not once per pass: the model with that correction.
        plan_g_root = ((passes_g * (v_g - v_root)) + v_root) * (n - 1) / n
        per_gpu = gather + rs + small
        rows.append(dict(model=model, layout=layout, hosts=hosts, n=n, per=per, v_g=v_g, v_root=v_root, units=units,
                         passes_g=passes_g, passes_rs=passes_rs, plan_g=plan_g, plan_g_root=plan_g_root,
                         plan_rs=plan_rs, gather=gather, gather_calls=gather_calls, rs=rs, rs_calls=rs_calls,
                         small=small, tx=(tx2 - tx1) / steps, rx=(rx2 - rx1) / steps,
                         # per host: the plan puts each GPU's whole (N-1)/N on the network
                         plan_host=per * (plan_g + plan_rs),
                         # ... but only what comes from other hosts must cross it: (N-L)/(N-1) of it
                         offhost=per * (gather + rs) * (n - per) / (n - 1),
                         speed=open(f"{work}/{t2}/speed").read().strip()))

def mib(x):
    return f"{x / MiB:.2f}"

lines = [
    "# Bytes over the network per optimizer step (multi-node test cluster)",
    "",
    f"- Driver: `benchmarks/scaling/multinode_bytes.sh` (commit {commit}; runs ended "
    f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(max(os.path.getmtime(p) for p in glob.glob(work + '/*/after'))))})",
    "- Cluster: tests/multinode/cluster.sh: namespace hosts on one 2-core VM joined by veth + bridge; "
    "Open MPI 4.1 ob1/TCP between hosts, vader inside one; srun --mpi=pmix; slurm/multinode.sbatch",
    "- Runs: weak scaling, one micro-batch (= rollout micro-group) per rank, 1 optimizer step per rollout; tiny = "
    "quickstart (4 samples per rank, 10 denoising steps, 2 trained SDE steps), sd3-100m = "
    "benchmarks/configs/sd3-100m.json (1 sample per rank, 2 denoising steps, 1 trained step); per step = (run of "
    "R2 rollouts - run of R1) / (R2 - R1): start-up, wire-up and the final checkpoint cancel",
    "- measured (logical) = PMPI shim: bytes a rank's bulk (>= 64 KiB) MPI_Allgather receives from / MPI_Alltoall "
    "sends to the other ranks, mean over ranks; control = every other collective byte (norms, metrics, flags)",
    "- wire = eth0 bytes that left a host (kernel counters: frames with TCP/IP headers and ACKs), mean over the "
    "job's hosts (the mean received is the same: every frame one host sends, another receives)",
    f"- machine: {machine}",
    "",
    "## Per rank: the plan's volumes against what ditrl's collectives moved",
    "",
    "| model | hosts x ranks | N | V_gather (plan) | passes gather / RS | plan gathers | plan, root once per step | measured gathers (calls) | plan RS | measured RS (calls) | control |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
for r in rows:
    lines.append(
        f"| {r['model']} | {r['layout']} | {r['n']} | {mib(r['v_g'])} MiB | {r['passes_g']} / {r['passes_rs']} | "
        f"{mib(r['plan_g'])} MiB | {mib(r['plan_g_root'])} MiB | {mib(r['gather'])} MiB ({r['gather_calls']:.0f}) | "
        f"{mib(r['plan_rs'])} MiB | {mib(r['rs'])} MiB ({r['rs_calls']:.0f}) | {r['small'] / 1024:.1f} KiB |")
lines += [
    "",
    "## Per host: over the network",
    "",
    "| model | hosts x ranks | plan: L x per-GPU (N-1)/N | off-host part: L x measured x (N-L)/(N-1) | wire tx | wire / plan | wire / off-host | s/rollout |",
    "|---|---|---|---|---|---|---|---|",
]
for r in rows:
    lines.append(
        f"| {r['model']} | {r['layout']} | {mib(r['plan_host'])} MiB | {mib(r['offhost'])} MiB | {mib(r['tx'])} MiB | "
        f"{r['tx'] / r['plan_host']:.3f} | {r['tx'] / r['offhost']:.3f} | {r['speed']} |")
lines += ["", "Measured / plan per rank:", ""]
for r in rows:
    lines.append(f"- {r['model']} {r['layout']}: gathers {r['gather'] / r['plan_g']:.4f} "
                 f"({r['gather'] / r['plan_g_root']:.4f} with the root once per step), reduce-scatters "
                 f"{r['rs'] / r['plan_rs']:.4f}; {r['units']} wrap units + root ({mib(r['v_root'])} MiB of V_gather)")
open(out_md, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
