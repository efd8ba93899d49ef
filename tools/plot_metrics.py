#!/usr/bin/python3
"""Plot the main curves of a ditrl run's OUT/metrics.h5 into one PNG.

    /usr/bin/python3 tools/plot_metrics.py runs/quickstart/metrics.h5 [--out curves.png]
        [--metric train/approx_kl ...] [--smooth 10] [--summary] [--no-plot]

metrics.h5 holds /metrics/step (the optimizer step of each row) and one float64
series per metric under /metrics/<name>; a metric absent from a row is NaN.
The reward panel shows the raw mean with its +-std band and a moving average,
so a learning run is visible at a glance. --summary prints the first and last
--smooth-row means of the reward (what benchmarks/results/quickstart.md quotes), the run's peak
memory per rank and the median seconds of each timed phase; --no-plot prints
only that (no matplotlib needed: the GPU check kit falls back to it where
python3 lacks matplotlib).
"""
import argparse
import sys

import h5py
import numpy as np

DEFAULT_PANELS = [
    "rollout/reward/raw_mean",
    "train/loss",
    "train/grad_norm",
    "train/approx_kl",
    "train/clipfrac",
    "train/log_prob_mean_abs_diff",
]


def read_metrics(path):
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        sys.exit(f"plot_metrics: cannot open {path}: {e}")
    with f:
        if "metrics/step" not in f:
            sys.exit(f"plot_metrics: {path} is not a ditrl metrics file (no /metrics/step)")
        series = {}
        f["metrics"].visititems(
            lambda name, obj: series.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
        )
        steps = series.pop("step")
        return steps, series, f.attrs.get("deck", "")


def moving_average(values, window):
    if window <= 1 or len(values) < window:
        return values
    kernel = np.ones(window) / window
    valid = np.convolve(values, kernel, mode="valid")
    return np.concatenate([np.full(window - 1, np.nan), valid])


def plot_reward(ax, steps, series, window):
    mean = series["rollout/reward/raw_mean"]
    ax.plot(steps, mean, color="tab:blue", alpha=0.45, label="reward mean")
    if "rollout/reward/raw_std" in series:
        std = series["rollout/reward/raw_std"]
        ax.fill_between(steps, mean - std, mean + std, color="tab:blue", alpha=0.12, label="+- std")
    ax.plot(steps, moving_average(mean, window), color="tab:blue", label=f"moving avg ({window})")
    ax.set_title("rollout/reward/raw_mean")
    ax.legend(fontsize="small")


def plot_metric(ax, steps, series, name):
    if name not in series:
        ax.set_title(f"{name} (absent)")
        return
    ax.plot(steps, series[name])
    ax.set_title(name)


def reward_summary(series, window):
    mean = series["rollout/reward/raw_mean"]
    n = min(window, len(mean) // 2) or 1
    first, last = float(np.nanmean(mean[:n])), float(np.nanmean(mean[-n:]))
    return f"reward mean: first {n} rows {first:.4f}, last {n} rows {last:.4f}, change {last - first:+.4f}"


def memory_summary(series):
    """The largest peak over ranks and rows: host RSS, and the CUDA allocator's on a GPU run."""
    parts = [
        f"{label} {np.nanmax(series[name]) / 1e9:.3f} GB"
        for name, label in (("perf/peak_rss_bytes", "resident"), ("perf/peak_device_bytes", "GPU allocator"))
        if name in series
    ]
    return "peak memory per rank: " + ", ".join(parts) if parts else None


PHASES = ["rollout", "reward", "prepare", "forward", "backward", "optimizer", "gather", "reduce_scatter", "checkpoint"]


def phase_summary(series):
    """Median seconds per row of each perf/<phase>_seconds (on a GPU, CUDA event times of the compute)."""
    parts = [
        f"{phase} {np.nanmedian(series[name]):.4f}"
        for phase in PHASES
        if (name := f"perf/{phase}_seconds") in series and not np.all(np.isnan(series[name]))
    ]
    return "median seconds per row: " + ", ".join(parts) if parts else None


def plot(path, out, steps, series, panels, window):
    import matplotlib

    matplotlib.use("Agg")  # batch nodes have no display
    import matplotlib.pyplot as plt

    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, panels):
        if name == "rollout/reward/raw_mean" and name in series:
            plot_reward(ax, steps, series, window)
        else:
            plot_metric(ax, steps, series, name)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    out = out or path.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", help="OUT/metrics.h5 of a ditrl run")
    parser.add_argument("--out", help="PNG to write (default: next to the metrics file)")
    parser.add_argument("--metric", action="append", help="panels to draw (default: the main curves)")
    parser.add_argument("--smooth", type=int, default=10, help="moving-average window for the reward")
    parser.add_argument("--summary", action="store_true", help="print first/last reward means, peak memory and phase times")
    parser.add_argument("--no-plot", action="store_true", help="write no PNG (implies --summary)")
    args = parser.parse_args()

    steps, series, _ = read_metrics(args.metrics)
    panels = args.metric or DEFAULT_PANELS
    missing = [name for name in panels if name not in series and args.metric]
    if missing:
        sys.exit(f"plot_metrics: {args.metrics} has no series {missing}; it has {sorted(series)}")

    if not args.no_plot:
        plot(args.metrics, args.out, steps, series, panels, args.smooth)
    if args.summary or args.no_plot:
        if "rollout/reward/raw_mean" in series:
            print(reward_summary(series, args.smooth))
        if memory := memory_summary(series):
            print(memory)
        if phases := phase_summary(series):
            print(phases)


if __name__ == "__main__":
    main()
