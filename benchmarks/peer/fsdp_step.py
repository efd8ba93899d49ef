"""ditrl's ShardedParams vs PyTorch FSDP2 at N ranks: step time and bytes moved per step.

Both sides train the same ~100M model (a family's peer_forward config, the
same weights and inputs files, bf16 compute with fp32 masters and fp32
gradient reduction, AdamW lr 1e-4 weight decay 0.01) on the same global batch
split over the ranks, one intra-op thread per rank, launched the same way
(mpiexec, shared-memory transport for ditrl's MPI, gloo over loopback TCP
for FSDP2). Runs alternate between the two sides (ditrl N=2, FSDP2 N=2, ditrl
N=4, ...), `--runs` times, so both see the same background load; each run
reports the median of its timed steps and the table the median over runs.

Bytes: ditrl under benchmarks/mpi_bytes_shim.so (MPI's bulk collectives,
counted after the warm-up step), FSDP2 by wrapping torch.distributed's
collectives (benchmarks/peer/peer_fsdp2.py); both the logical volume one rank
exchanges with the others per step, mean over ranks.

    python benchmarks/peer/fsdp_step.py --build build [--ranks 2,4] [--runs 2] [--steps 2]
"""

import argparse
import datetime
import glob
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "profile"))
from kernel_section import cpu_name  # noqa: E402

MPI = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader", "--bind-to", "none"]


def load_average():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def last_json(text, what):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"{what} printed no result:\n{text[-4000:]}")


def shim_bytes(directory):
    """Mean over ranks of the bulk bytes per op kind the PMPI shim counted."""
    totals = []
    for path in sorted(glob.glob(os.path.join(directory, "rank-*.txt"))):
        counted = {}
        with open(path) as f:
            for line in f:
                op, size_class, calls, volume = line.split()[:4]
                if op != "size" and size_class == "bulk":
                    counted[op] = (int(calls), int(volume))
        totals.append(counted)
    if not totals:
        raise SystemExit(f"{directory}: the MPI byte shim wrote no rank files")
    ops = sorted({op for t in totals for op in t})
    return {op: (statistics.mean(t.get(op, (0, 0))[0] for t in totals),
                 statistics.mean(t.get(op, (0, 0))[1] for t in totals)) for op in ops}


def run(command, env=None):
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                         f"{result.stderr[-3000:]}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--family", default="sd3")
    parser.add_argument("--batch", type=int, default=4, help="global batch")
    parser.add_argument("--tiny", action="store_true", help="the family's tiny preset (a check of the pipeline)")
    parser.add_argument("--peer-checkpointing", action="store_true",
                        help="FSDP2 with diffusers' gradient checkpointing (ditrl recomputes blocks in backward too)")
    parser.add_argument("--ditrl-no-recompute", action="store_true",
                        help="ditrl keeps every block's graph (parallel.recompute = false), as FSDP2 without checkpointing")
    parser.add_argument("--ditrl-fast", action="store_true",
                        help="ditrl with flash attention and its fused AdamW too (with --ditrl-no-recompute: "
                             "its fastest configuration)")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per run, after one warm-up step")
    parser.add_argument("--work", default="/tmp/ditrl_fsdp_step")
    parser.add_argument("--out", default=os.path.join(HERE, "..", "results", "fsdp_step.md"))
    args = parser.parse_args()
    ranks = [int(n) for n in args.ranks.split(",")]
    bench = os.path.join(args.build, "benchmarks", "bench_fsdp_step")
    data = os.path.join(args.work, args.family)
    shim = os.path.join(args.work, "mpi_bytes_shim.so")
    os.makedirs(args.work, exist_ok=True)
    run(["mpicc", "-shared", "-fPIC", "-O2", "-o", shim, os.path.join(HERE, "..", "scaling", "mpi_bytes_shim.c")])
    run([bench, "prepare", data, "--family", args.family, "--batch", str(args.batch)] + (["--tiny"] if args.tiny else []))
    started, load_start = datetime.datetime.now(datetime.timezone.utc), load_average()

    results = {(side, n): [] for side in ("ditrl", "fsdp2") for n in ranks}
    for r in range(args.runs):
        for n in ranks:
            shim_dir = os.path.join(args.work, f"shim-{n}-{r}")
            os.makedirs(shim_dir, exist_ok=True)
            for stale in glob.glob(os.path.join(shim_dir, "rank-*.txt")):
                os.remove(stale)
            env = dict(os.environ, DITRL_MPI_BYTES_DIR=shim_dir)
            load = load_average()
            out = last_json(run(MPI + ["-n", str(n), "-x", f"LD_PRELOAD={shim}", "-x", "DITRL_MPI_BYTES_DIR", bench,
                                       "run", data, "--family", args.family, "--steps", str(args.steps)] +
                                (["--no-recompute"] if args.ditrl_no_recompute else []) +
                                (["--fused-adamw", "--attention", "flash"] if args.ditrl_fast else []), env),
                            "bench_fsdp_step")
            counted = shim_bytes(shim_dir)
            out["bytes_per_step"] = {op: v[1] / args.steps for op, v in counted.items()}
            out["calls_per_step"] = {op: v[0] / args.steps for op, v in counted.items()}
            out["load"] = load
            results[("ditrl", n)].append(out)
            print(f"run {r} ditrl n={n} load={load}: {out['step_seconds']} s, {out['bytes_per_step']}", flush=True)
            load = load_average()
            out = last_json(run(MPI + ["-n", str(n), args.python, os.path.join(HERE, "peer_fsdp2.py"), "--family",
                                       args.family, "--config", f"{data}/config.json", "--weights",
                                       f"{data}/weights.safetensors", "--inputs", f"{data}/inputs.safetensors",
                                       "--steps", str(args.steps), "--port", str(29500 + 10 * n + r)] +
                                (["--checkpointing"] if args.peer_checkpointing else [])),
                            "peer_fsdp2.py")
            out["load"] = load
            results[("fsdp2", n)].append(out)
            print(f"run {r} fsdp2 n={n} load={load}: {out['step_seconds']} s, {out['bytes_per_step']}", flush=True)
    write_report(args, ranks, results, started, load_start, sys.argv)


def mib(x):
    return x / 2**20


def write_report(args, ranks, results, started, load_start, argv):
    def step(side, n):
        return statistics.median(statistics.median(o["step_seconds"]) for o in results[(side, n)])

    def per_run(outs):
        return ", ".join("%.2f" % statistics.median(o["step_seconds"]) for o in outs)

    def total_bytes(o):
        return sum(o["bytes_per_step"].values())

    lines = [
        "# fsdp_step: ditrl ShardedParams vs PyTorch FSDP2, training step at N ranks", "",
        "Both sides train the same model from the same weights and inputs files on the same global batch split "
        "over the ranks: bf16 compute, fp32 masters, fp32 gradient reduction, AdamW (lr 1e-4, weight decay 0.01), "
        "one intra-op thread per rank, both launched by mpiexec. Runs alternate between the sides (ditrl N=2, FSDP2 "
        "N=2, ditrl N=4, FSDP2 N=4, then again); a run's time is the median of its timed steps (after one warm-up "
        "step, barriers around each step), the table's the median over runs. Speedup = FSDP2 s / ditrl s. Bytes: "
        "the logical volume one rank exchanges with the others per step (an all-gather: what it receives; a "
        "reduce-scatter: what it sends), mean over ranks; ditrl's counted by the PMPI shim "
        "benchmarks/scaling/mpi_bytes_shim.c (MPI_Allgather/v, MPI_Alltoall of 64 KiB or more), FSDP2's by wrapping "
        "torch.distributed's collectives in benchmarks/peer/peer_fsdp2.py.", "",
        "| ranks | params | global batch | ditrl s/step | FSDP2 s/step | speedup | ditrl s/step per run | "
        "FSDP2 s/step per run | ditrl MiB/step/rank (gather + RS) | FSDP2 MiB/step/rank (gather + RS + all-reduce) "
        "| bytes ratio FSDP2 / ditrl | collective calls/step ditrl / FSDP2 | rank-0 loss, first step ditrl / FSDP2 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in ranks:
        d, f = results[("ditrl", n)], results[("fsdp2", n)]
        db, fb = d[-1]["bytes_per_step"], f[-1]["bytes_per_step"]
        d_gather = db.get("allgather", 0) + db.get("allgatherv", 0)
        d_rs = db.get("alltoall", 0)
        dc, fc = sum(d[-1]["calls_per_step"].values()), sum(f[-1]["calls_per_step"].values())
        lines.append(
            f"| {n} | {d[0]['params'] / 1e6:.1f} M | {args.batch} | {step('ditrl', n):.2f} | {step('fsdp2', n):.2f} | "
            f"**{step('fsdp2', n) / step('ditrl', n):.2f}x** | "
            f"{per_run(d)} | {per_run(f)} | "
            f"{mib(total_bytes(d[-1])):.1f} ({mib(d_gather):.1f} + {mib(d_rs):.1f}) | "
            f"{mib(total_bytes(f[-1])):.1f} ({mib(fb['all_gather']):.1f} + {mib(fb['reduce_scatter']):.1f} + "
            f"{mib(fb['all_reduce']):.1f}) | {total_bytes(f[-1]) / total_bytes(d[-1]):.2f} | {dc:.0f} / {fc:.0f} | "
            f"{d[0]['losses'][0]:.5f} / {f[0]['losses'][0]:.5f} |")
    loads = ", ".join(f"{side} n={n}: {' '.join(o['load'] for o in results[(side, n)])}"
                      for n in ranks for side in ("ditrl", "fsdp2"))
    lines += [
        "",
        f"- Command: `{' '.join(argv)}`",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC to {datetime.datetime.now(datetime.timezone.utc):%H:%M} UTC",
        f"- Machine: {cpu_name()}, {os.cpu_count()} hardware threads, one intra-op thread per rank (4 ranks "
        f"oversubscribe 2 cores); 1-minute load average {load_start} at the start, {load_average()} at the end; at "
        f"the start of each run: {loads}",
        f"- Model: {args.family}'s {'tiny preset' if args.tiny else '~100M'} peer_forward config (benchmarks/peer/peer_cases.hpp), global batch {args.batch}, "
        "split contiguously over the ranks",
        "- ditrl: `bench_fsdp_step run` (benchmarks/peer/fsdp_step.cpp): ShardedParams with its defaults (each block a "
        "wrap unit, prefetch of the next block, reshard after forward, "
        f"{'no recompute: every block keeps its graph, --no-recompute' if args.ditrl_no_recompute else 'blocks recomputed in backward'}"
        f"{', flash attention, fused AdamW (--ditrl-fast)' if args.ditrl_fast else ', math attention, chunked AdamW'}), "
        "the family's fp32-kept parameters, Open MPI vader",
        f"- FSDP2: benchmarks/peer/peer_fsdp2.py, torch {results[('fsdp2', ranks[0])][0]['torch']}, diffusers' class, "
        "`fully_shard` per transformer block then the root, MixedPrecisionPolicy(param_dtype=bf16, "
        f"reduce_dtype=fp32), reshard_after_forward=True, "
        f"{'diffusers gradient checkpointing (every block recomputed in backward, as ditrl)' if args.peer_checkpointing else 'no activation checkpointing'}, gloo",
        "- rank-0 loss: the first (warm-up) step's loss on rank 0's slice (same weights and inputs; bf16 rounding "
        "differs between the two implementations)",
    ]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
