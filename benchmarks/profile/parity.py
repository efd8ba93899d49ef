#!/usr/bin/python3
"""Train/rollout parity table for benchmarks/results/parity.md.

For each family deck and forward precision: one `ditrl train` rollout on 2
ranks with [debug] dump = true (samples 0 and 5, one per rank), then
`ditrl align DUMP DUMP --sides rollout,train --json` on every rank's dump,
summed over ranks; log_prob_mean_abs_diff is the run's metric at step 0.
A last row per family aligns the bf16 run's rollout against the fp32 run's
(the negative control). Prints a markdown table.

usage: benchmarks/profile/parity.py BUILD_DIR [family=deck ...]   (default sd3=tiny_grpo.toml)
"""
import json
import os
import subprocess
import sys

import h5py

MPIEXEC = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader", "-np", "2"]
RANKS = (0, 1)


def train(ditrl, deck, out, forward):
    subprocess.run(MPIEXEC + [ditrl, "train", deck, "--set", f"run.out_dir={out}", "--set", "train.num_rollouts=1",
                              "--set", f"precision.forward={forward}", "--set", "debug.dump=true",
                              "--set", "debug.samples=[0,5]"], check=True, stdout=subprocess.DEVNULL)
    with h5py.File(os.path.join(out, "metrics.h5"), "r") as f:
        return float(f["metrics/train/log_prob_mean_abs_diff"][0])


def align(ditrl, a, b, sides):
    r = subprocess.run([ditrl, "align", a, b, "--sides", sides, "--json"], check=True, capture_output=True, text=True)
    return json.loads(r.stdout)


def rel(x):
    return float("inf") if x == "inf" else x


def row(label, reports, lp_diff):
    pairs = sum(r["pairs"] for r in reports)
    exact = sum(r["bit_exact"] for r in reports)
    over = sum(r["over_threshold"] for r in reports)
    peak = max(rel(r["peak_rel"]) for r in reports)
    first = next((r["first_divergence"]["name"] for r in reports if r["first_divergence"]), "none")
    lp = "-" if lp_diff is None else f"{lp_diff:.1e}"
    print(f"| {label} | {pairs} | {exact}/{pairs} | {over} | {peak:.1e} | {lp} | {first} |")


def main():
    build = sys.argv[1]
    families = dict(a.split("=", 1) for a in sys.argv[2:]) or {"sd3": "tiny_grpo.toml"}
    ditrl = os.path.join(build, "ditrl")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    print("| family, forward | pairs | bit-exact | rel >= 5e-2 | peak rel | log_prob_mean_abs_diff | first divergence |")
    print("|---|---|---|---|---|---|---|")
    for family, deck in families.items():
        outs = {}
        for forward in ("fp32", "bf16"):
            out = os.path.join(build, "parity-bench", f"{family}-{forward}")
            lp = train(ditrl, os.path.join(root, "tests", "e2e", "decks", deck), out, forward)
            dumps = [os.path.join(out, "debug", f"dump-rank{r}.h5") for r in RANKS]
            row(f"{family} {forward} (masters fp32), rollout vs train", [align(ditrl, d, d, "rollout,train") for d in dumps],
                lp)
            outs[forward] = dumps
        row(f"{family}: bf16 run vs fp32 run (rollout)",
            [align(ditrl, a, b, "rollout,rollout") for a, b in zip(outs["bf16"], outs["fp32"])], None)


if __name__ == "__main__":
    main()
