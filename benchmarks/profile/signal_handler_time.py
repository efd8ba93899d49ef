#!/usr/bin/env python3
"""When each rank of a 2-rank `ditrl train` has its SIGTERM handler in place.

    benchmarks/profile/signal_handler_time.py DITRL OUT_DIR [RUNS]

Starts the quickstart under mpiexec RUNS times (default 6) and polls the
ranks' /proc entries: for each rank, the milliseconds from the first poll
that sees it running the ditrl image (its exec, to within one poll) to the
first that sees SIGTERM's bit in its SigCgt mask. A signal in that window
ends the rank by the default action. One line per run, one number per rank.
"""
import os
import subprocess
import sys
import time

MPIEXEC = "/usr/bin/mpiexec --allow-run-as-root --oversubscribe --mca btl self,vader".split()
SIGTERM_BIT = 1 << 14
DECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "inputs", "quickstart.toml")


def children(pid):
    found = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.update(int(p) for p in f.read().split())
    except OSError:
        pass
    return found


def caught_mask(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def one_run(ditrl, out):
    job = subprocess.Popen(MPIEXEC + ["-np", "2", ditrl, "train", DECK, "--set", f"run.out_dir={out}", "--set",
                                      "train.num_rollouts=1", "--resume", "none"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    execed, handled = {}, {}
    while job.poll() is None and len(handled) < 2:
        now = time.monotonic()
        for pid in children(job.pid):
            if pid not in execed:
                try:
                    if os.readlink(f"/proc/{pid}/exe") == ditrl:
                        execed[pid] = now
                except OSError:
                    pass
            elif pid not in handled and caught_mask(pid) & SIGTERM_BIT:
                handled[pid] = now
    job.wait()
    return [(handled[p] - execed[p]) * 1000 for p in sorted(handled)]


def main():
    ditrl, out = os.path.realpath(sys.argv[1]), sys.argv[2]
    for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 6):
        print(" ".join(f"{ms:.0f}" for ms in one_run(ditrl, out)), flush=True)


if __name__ == "__main__":
    main()
