"""Summarizes a benchmarks/peer/flow_grpo/run.sh output folder: s/iteration, samples/s and ratios per round, the
reward curves of both sides side by side in one PNG.

    python benchmarks/peer/flow_grpo/summarize.py OUT [--png OUT/flow_grpo_loop.png]

Per-iteration time, the same definition on both sides: the wall time from the start of one GRPO iteration to
the start of the next (rollout with CFG, rewards, advantages, the training forward/backward over every trained
step, gradient clipping, AdamW, the loop's own logging). ditrl: the difference of the millisecond timestamps of
consecutive progress lines of rank 0 (`rollout i/N ... s/rollout`, printed at the end of each iteration).
flow_grpo: the difference of consecutive stamps of the driver's clock, called at the top of each epoch.
The first iteration (warm-up: allocator, lazy inits, the first trace of each shape) is reported apart and left
out of the medians; start-up (imports, model load) and ditrl's final checkpoint are outside the loop and shown
as whole-run wall time instead.
"""
import argparse
import datetime
import json
import os
import re
import statistics

import h5py
import numpy as np

LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\] \[r0\] \[info\] rollout (\d+)/(\d+) .* ([0-9.]+) s/rollout")


def ditrl_run(folder):
    times, printed = [], []
    with open(os.path.join(folder, "logs", "rank-0.log")) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                times.append(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp())
                printed.append(float(m.group(4)))
    seconds = [printed[0]] + [b - a for a, b in zip(times, times[1:])]
    with h5py.File(os.path.join(folder, "metrics.h5"), "r") as f:
        m = {k: f["metrics"][k][()] for k in ("rollout/reward/raw_mean", "rollout/reward/raw_std")}
        perf = {k: f["metrics/perf"][k][()] for k in f["metrics/perf"]}
    rollout = perf["rollout_seconds"] + perf["reward_seconds"]
    train = perf["prepare_seconds"] + perf["forward_backward_seconds"] + perf["optimizer_seconds"]
    return {"seconds": seconds, "reward_mean": list(m["rollout/reward/raw_mean"]),
            "reward_std": list(m["rollout/reward/raw_std"]),
            "rollout_reward_seconds": list(rollout), "train_seconds": list(train)}


def flow_grpo_run(path):
    rows = [json.loads(line) for line in open(path)]
    meta = rows.pop()
    return {k: [r[k] for r in rows] for k in ("seconds", "reward_mean", "reward_std", "rollout_reward_seconds",
                                               "train_seconds")} | {"meta": meta}


def med(values):
    return statistics.median(values[1:]) if len(values) > 1 else values[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--png", default=None)
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    settings = json.load(open(os.path.join(out, "work", "settings.json")))
    samples = settings["samples"]
    timeline = [line.rstrip("\n").split("\t") for line in open(os.path.join(out, "timeline.tsv"))]
    rounds = sorted({int(t[0]) for t in timeline})
    wall = {(int(t[0]), t[1]): float(t[4]) for t in timeline}
    loads = {(int(t[0]), t[1]): t[5] for t in timeline}

    runs = {}
    for r in rounds:
        runs[(r, "ditrl-np1")] = ditrl_run(os.path.join(out, f"ditrl-np1-r{r}"))
        runs[(r, "flow_grpo")] = flow_grpo_run(os.path.join(out, f"flow_grpo-r{r}.jsonl"))
        if (r, "ditrl-np2") in wall:
            runs[(r, "ditrl-np2")] = ditrl_run(os.path.join(out, f"ditrl-np2-r{r}"))
    sides = ["ditrl-np1", "flow_grpo"] + (["ditrl-np2"] if any(k[1] == "ditrl-np2" for k in runs) else [])

    lines = ["| round | side | load before (1/5/15 min) | first iteration s | median s/iteration (iterations 2..N) "
             "| samples/s | rollout+reward s (median) | train s (median) | whole run wall s | flow_grpo / this side |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ratios = {s: [] for s in sides if s != "flow_grpo"}
    summary = {"settings": settings, "rounds": {}}
    for r in rounds:
        fg = med(runs[(r, "flow_grpo")]["seconds"])
        for side in sides:
            run = runs.get((r, side))
            if run is None:
                continue
            s_it = med(run["seconds"])
            ratio = fg / s_it
            if side != "flow_grpo":
                ratios[side].append(ratio)
            summary["rounds"].setdefault(str(r), {})[side] = {
                "first_iteration_seconds": run["seconds"][0], "median_seconds_per_iteration": s_it,
                "samples_per_second": samples / s_it, "median_rollout_reward_seconds": med(run["rollout_reward_seconds"]),
                "median_train_seconds": med(run["train_seconds"]), "wall_seconds": wall[(r, side)],
                "load_before": loads[(r, side)], "seconds": run["seconds"], "reward_mean": run["reward_mean"]}
            lines.append(f"| {r} | {side} | {loads[(r, side)]} | {run['seconds'][0]:.3f} | {s_it:.3f} | "
                         f"{samples / s_it:.1f} | {med(run['rollout_reward_seconds']):.3f} | "
                         f"{med(run['train_seconds']):.3f} | {wall[(r, side)]:.1f} | "
                         f"{'' if side == 'flow_grpo' else f'**{ratio:.2f}x**'} |")
    lines.append("")
    for side, values in ratios.items():
        lines.append(f"- flow_grpo s/iteration / {side} s/iteration, per round: "
                     f"{', '.join(f'{v:.2f}x' for v in values)}; median {statistics.median(values):.2f}x")
        summary[f"ratio_{side}"] = {"per_round": values, "median": statistics.median(values)}
        # The same ratio for each phase (medians over iterations 2..N) and for the whole run's wall time.
        for label, key in (("rollout+reward", "rollout_reward_seconds"), ("train", "train_seconds")):
            phase = [med(runs[(r, "flow_grpo")][key]) / med(runs[(r, side)][key]) for r in rounds]
            lines.append(f"  - {label} phase, flow_grpo / {side}, per round: "
                         f"{', '.join(f'{v:.2f}x' for v in phase)}; median {statistics.median(phase):.2f}x")
            summary[f"ratio_{side}_{key}"] = {"per_round": phase, "median": statistics.median(phase)}
        whole = [wall[(r, "flow_grpo")] / wall[(r, side)] for r in rounds]
        lines.append(f"  - whole-run wall time (start-up, {settings['iterations']} iterations, ditrl's final "
                     f"checkpoint), flow_grpo / {side}, per round: {', '.join(f'{v:.2f}x' for v in whole)}; "
                     f"median {statistics.median(whole):.2f}x")
        summary[f"ratio_{side}_wall"] = {"per_round": whole, "median": statistics.median(whole)}
    for side in sides:
        first = [np.mean(runs[(r, side)]["reward_mean"][:3]) for r in rounds]
        last = [np.mean(runs[(r, side)]["reward_mean"][-3:]) for r in rounds]
        lines.append(f"- {side} reward mean, first 3 -> last 3 iterations, per round: "
                     + ", ".join(f"{a:.4f} -> {b:.4f} ({b - a:+.4f})" for a, b in zip(first, last)))
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)

    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
        titles = {"ditrl-np1": "ditrl (1 rank, 1 thread)", "flow_grpo": "flow_grpo train_sd3.py (1 process, 1 thread)"}
        colors = {"ditrl-np1": "tab:blue", "flow_grpo": "tab:orange", "ditrl-np2": "tab:green"}
        curves = [s for s in ("ditrl-np1", "flow_grpo") if s in sides]
        lo = min(min(np.array(runs[(r, s)]["reward_mean"]) - np.array(runs[(r, s)]["reward_std"]))
                 for r in rounds for s in curves)
        hi = max(max(np.array(runs[(r, s)]["reward_mean"]) + np.array(runs[(r, s)]["reward_std"]))
                 for r in rounds for s in curves)
        for ax, side in zip(axes[:2], curves):
            # Fixed seeds: a side's curve is usually the same in every round; then it is drawn once.
            same = all(runs[(r, side)]["reward_mean"] == runs[(rounds[0], side)]["reward_mean"] for r in rounds)
            for r in rounds[:1] if same else rounds:
                y = np.array(runs[(r, side)]["reward_mean"])
                sd = np.array(runs[(r, side)]["reward_std"])
                x = np.arange(1, len(y) + 1)
                label = f"reward mean, all {len(rounds)} rounds (identical)" if same else f"round {r}"
                ax.plot(x, y, color=colors[side], alpha=1.0 if r == rounds[0] else 0.4, marker=".", label=label)
                if r == rounds[0]:
                    ax.fill_between(x, y - sd, y + sd, color=colors[side], alpha=0.12,
                                    label="+- std over the 16 samples" + ("" if same else " (round 1)"))
            ax.set_title(titles[side])
            ax.set_xlabel("GRPO iteration")
            ax.set_ylabel(f"reward mean ({settings['reward']})")
            ax.set_ylim(lo, hi)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        ax = axes[2]
        for side in sides:
            for r in rounds:
                y = runs[(r, side)]["seconds"]
                ax.plot(np.arange(1, len(y) + 1), y, color=colors[side], alpha=0.6, marker=".",
                        label=side if r == rounds[0] else None)
        ax.set_yscale("log")
        ax.set_title("s/iteration (all rounds)")
        ax.set_xlabel("GRPO iteration")
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        med_line = "; ".join(f"{s} {summary[f'ratio_{s}']['median']:.2f}x" for s in ratios)
        fig.suptitle(f"Tiny SD3 GRPO, {samples} samples x {settings['num_steps']} steps, CFG "
                     f"{settings['guidance_scale']}: flow_grpo s/iteration over ditrl's (median of rounds): {med_line}",
                     fontsize=10)
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print(f"summarize: wrote {args.png}")


if __name__ == "__main__":
    main()
