#!/usr/bin/python3
"""Turns the runs of benchmarks/scaling/train_step.sh into benchmarks/results/
train_step.md and scaling.md (tables, a projection model) and PNG plots.

usage: /usr/bin/python3 tools/train_step_report.py RUNS_DIR
"""
import glob
import os
import sys

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PHASES = ["rollout", "reward", "prepare", "forward", "backward", "optimizer", "checkpoint"]
MiB = 1024.0 * 1024.0


def load(runs, name):
    """The measured (last) row of a run, its parameter count and checkpoint numbers."""
    d = os.path.join(runs, name)
    with h5py.File(os.path.join(d, "metrics.h5"), "r") as f:
        m = f["metrics"]
        row = {}
        for group in ("perf", "rollout"):
            if group in m:
                m[group].visit(lambda k, g=group: row.__setitem__(f"{g}/{k}", float(m[group][k][-1]))
                               if isinstance(m[group][k], h5py.Dataset) else None)
        row["rows"] = len(m["step"])
    ckpt = sorted(glob.glob(os.path.join(d, "checkpoints", "step-*.h5")))[-1]
    with h5py.File(ckpt, "r") as f:
        params = []
        f["model"].visit(lambda k: params.append(f["model"][k].size) if isinstance(f["model"][k], h5py.Dataset) else None)
    row["params"] = sum(params)
    plain_bytes, plain_seconds, direct_seconds = open(os.path.join(runs, name + ".plain")).read().split()
    row["ckpt_bytes"] = int(plain_bytes)
    row["plain_seconds"] = float(plain_seconds)
    row["direct_seconds"] = float(direct_seconds)
    row["load"] = open(os.path.join(runs, name + ".load")).read().strip()
    row["cmd"] = open(os.path.join(runs, name + ".cmd")).read().strip()
    row["ranks"] = int(name.rsplit("np", 1)[1])
    return row


def p(row, key):
    return row.get("perf/" + key + "_seconds", float("nan"))


def breakdown(row):
    """Phase -> seconds for one iteration; communication split out of compute."""
    fb_comm = p(row, "gather") + p(row, "reduce_scatter")
    return {
        "rollout compute": p(row, "rollout") - p(row, "rollout_gather"),
        "rollout gather": p(row, "rollout_gather"),
        "reward": p(row, "reward"),
        "prepare": p(row, "prepare"),
        "forward (incl. gather)": p(row, "forward"),
        "backward (incl. gather + reduce-scatter)": p(row, "backward"),
        "train gather": p(row, "gather"),
        "reduce-scatter": p(row, "reduce_scatter"),
        "train compute (fwd+bwd - comm)": p(row, "forward") + p(row, "backward") - fb_comm,
        "optimizer (clip + AdamW)": p(row, "optimizer"),
        "checkpoint": p(row, "checkpoint"),
    }


def iteration_seconds(row):
    return (p(row, "rollout") + p(row, "reward") + p(row, "prepare") + p(row, "forward_backward") +
            p(row, "optimizer") + p(row, "checkpoint"))


def table(rows, names):
    if not names:
        return "(not run: the benchmark did not get to it)"
    keys = list(breakdown(rows[names[0]]).keys())
    out = ["| phase (s) | " + " | ".join(f"{n} ({rows[n]['ranks']} rk)" for n in names) + " |",
           "|---|" + "---|" * len(names)]
    for k in keys:
        out.append(f"| {k} | " + " | ".join(f"{breakdown(rows[n])[k]:.3f}" for n in names) + " |")
    out.append("| **iteration total** | " + " | ".join(f"**{iteration_seconds(rows[n]):.2f}**" for n in names) + " |")
    out.append("| load average (1/5/15 min) after | " + " | ".join(rows[n]["load"] for n in names) + " |")
    return "\n".join(out)


def plot_breakdown(rows, groups, path, title):
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    parts = ["rollout compute", "rollout gather", "train compute (fwd+bwd - comm)", "train gather", "reduce-scatter",
             "optimizer (clip + AdamW)", "checkpoint"]
    for ax, (label, names) in zip(axes[0], groups):
        if not names:
            continue
        bottom = [0.0] * len(names)
        for part in parts:
            vals = [max(0.0, breakdown(rows[n])[part]) for n in names]
            ax.bar([str(rows[n]["ranks"]) for n in names], vals, bottom=bottom, label=part)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_title(label)
        ax.set_xlabel("ranks (2 cores: 4 ranks oversubscribe)")
        ax.set_ylabel("seconds per iteration")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def ckpt_table(rows, names):
    out = ["| run | ranks | checkpoint MiB | ditrl checkpoint s | MiB/s | plain write+fsync s | MiB/s | ratio | "
           "O_DIRECT write+fsync s | MiB/s | ratio |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        r = rows[n]
        mib = r["ckpt_bytes"] / MiB
        c, s, d = p(r, "checkpoint"), r["plain_seconds"], r["direct_seconds"]
        out.append(f"| {n} | {r['ranks']} | {mib:.1f} | {c:.2f} | {mib / c:.1f} | {s:.2f} | {mib / s:.1f} | "
                   f"**{s / c:.2f}x** | {d:.2f} | {mib / d:.1f} | {d / c:.2f}x |")
    return "\n".join(out)


# ---------------------------------------------------------------- projection
H200_PEAK = 989e12   # dense bf16 FLOP/s (NVIDIA H200 SXM datasheet)
MFU = (0.30, 0.50)   # assumed band
INTRA_BW = 370e9     # NCCL bus bandwidth within an 8-GPU NVLink node, bytes/s
INTER_BW = 46e9      # per GPU over its own 400 Gb/s NIC, bytes/s
GPUS_PER_NODE = 8
MODELS = {
    # name: trained params, active params per forward, layers, hidden, image/video tokens, text tokens, cross-attn
    "SD3.5-large (1024x1024)": dict(P=8.1e9, active=8.1e9, L=38, d=2432, T=4096, text=333, joint=True),
    "Wan2.2-A14B (832x480x81)": dict(P=28e9, active=14e9, L=40, d=5120, T=32760, text=512, joint=False),
}
WORK = dict(samples_per_gpu=4, denoise_steps=10, cfg=2, trained_steps=2)


ASSUMPTIONS = f"""Nothing below ran on a GPU. Every number comes from these assumptions:

- Per-step work per GPU (weak scaling, the same on 32 and 128 GPUs): {WORK['samples_per_gpu']} samples per GPU per
  rollout, {WORK['denoise_steps']} denoising steps with classifier-free guidance ({WORK['cfg']} forwards per step),
  {WORK['trained_steps']} trained SDE steps per sample (Flow-GRPO's window), each trained step with CFG.
- FLOPs per forward of one sample: 2·N_active·S for the matmuls plus 4·L·S²·d for attention (S = sequence
  length; SD3.5 joint attention over image + 333 text tokens; Wan2.2 self-attention over the video tokens plus
  cross-attention to 512 text tokens). A trained step costs 4 forwards: forward, the recompute in backward
  (ditrl's sharded units recompute) and a backward of twice a forward (the 6·N·tokens rule plus the recompute).
- SD3.5-large: 8.1B parameters, 38 blocks, hidden 2432, 1024x1024 (4096 image tokens). Wan2.2-A14B: two 14B
  experts, both trained and sharded (28B parameters in the sharded state), one active per timestep, 40 blocks,
  hidden 5120, 832x480x81 frames (21x30x52 = 32760 tokens after the VAE and 1x2x2 patches).
- H200 dense bf16 peak {H200_PEAK / 1e12:.0f} TFLOP/s; model FLOP utilization assumed {MFU[0]:.0%}-{MFU[1]:.0%}
  (the CPU runs above say nothing about GPU efficiency; they are replaced by this band).
- Communication (ZeRO-3, ditrl's manager): the bf16 parameters are all-gathered once per forward pass
  (rollout: once per denoising step with all of the GPU's samples batched; training: forward and backward
  recompute per trained step), fp32 gradients reduce-scattered once per trained step (one micro-batch per
  trained step). Bytes per GPU = volume·(N-1)/N.
- Bandwidth: NCCL bus bandwidth {INTER_BW / 1e9:.0f} GB/s per GPU across nodes (one 400 Gb/s NIC per GPU;
  intra-node NVLink, ~{INTRA_BW / 1e9:.0f} GB/s, is not the bottleneck for a ring spanning nodes). Latency terms
  and the hierarchical (NVLink + NIC) algorithms are ignored.
- "Full overlap": the gathers of the next unit hide behind the current unit's compute (ditrl prefetches one
  unit ahead), so a step takes max(compute, comm); "no overlap": compute + comm. Per-GPU volume barely grows
  with N ((N-1)/N), so 4 and 16 nodes differ little: the model predicts flat weak scaling once
  compute/comm > 1.
"""


def projection():
    lines = ["| model | nodes | GPUs | compute s/step (MFU 50%..30%) | gather+RS bytes/GPU/step | comm s/step | "
             "compute/comm (overlap headroom) | efficiency, full overlap | efficiency, no overlap |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, m in MODELS.items():
        seq = m["T"] + m["text"] if m["joint"] else m["T"]
        attn_fwd = 4 * m["L"] * seq * seq * m["d"] + (0 if m["joint"] else 4 * m["L"] * m["T"] * m["text"] * m["d"])
        fwd = 2 * m["active"] * seq + attn_fwd                     # one sample, one forward
        w = WORK
        rollout_flops = w["samples_per_gpu"] * w["denoise_steps"] * w["cfg"] * fwd
        train_flops = w["samples_per_gpu"] * w["trained_steps"] * w["cfg"] * 4 * fwd  # fwd + recompute + 2x bwd
        flops = rollout_flops + train_flops
        # ZeRO-3: bf16 params gathered once per forward pass (rollout: per denoising step, all local samples
        # batched; training: forward and backward recompute per trained step), fp32 gradients reduce-scattered
        # once per trained step (one micro-batch per step).
        passes = w["denoise_steps"] + 2 * w["trained_steps"]
        for nodes in (4, 16):
            n = nodes * GPUS_PER_NODE
            frac = (n - 1) / n
            gather_bytes = passes * 2 * m["P"] * frac
            rs_bytes = w["trained_steps"] * 4 * m["P"] * frac
            bw = INTER_BW if nodes > 1 else INTRA_BW
            comm = (gather_bytes + rs_bytes) / bw
            c_hi, c_lo = flops / (H200_PEAK * MFU[1]), flops / (H200_PEAK * MFU[0])
            lines.append(
                f"| {name} | {nodes} | {n} | {c_hi:.1f} .. {c_lo:.1f} | {(gather_bytes + rs_bytes) / 1e9:.0f} GB | "
                f"{comm:.1f} | {c_hi / comm:.1f} .. {c_lo / comm:.1f} | "
                f"{min(1, c_hi / comm) * 100:.0f}% .. {min(1, c_lo / comm) * 100:.0f}% | "
                f"{c_hi / (c_hi + comm) * 100:.0f}% .. {c_lo / (c_lo + comm) * 100:.0f}% |")
    return "\n".join(lines)


def main():
    runs = sys.argv[1]
    names = [os.path.basename(d) for d in sorted(glob.glob(os.path.join(runs, "*"))) if os.path.isdir(d)]
    done = [n for n in names if os.path.exists(os.path.join(runs, n + ".plain")) and os.path.getsize(os.path.join(runs, n + ".plain"))]
    rows = {n: load(runs, n) for n in done}
    machine = open(os.path.join(runs, "machine.txt")).read().strip()
    qs = [n for n in ("quickstart-np1", "quickstart-np2", "quickstart-np4") if n in rows]
    big = [n for n in ("sd3-100m-np1", "sd3-100m-np2", "sd3-100m-np4") if n in rows]
    weak = [n for n in ("weak-np1", "weak-np2", "weak-np4") if n in rows]
    sizes = [n for n in ("size-tiny-np2", "size-50m-np2", "sd3-100m-np2", "size-300m-np2") if n in rows]
    commands = "\n".join(f"    {rows[n]['cmd']}" for n in rows)

    plot_breakdown(rows, [("quickstart (tiny SD3)", qs), ("SD3 ~100M", big)],
                   os.path.join(RESULTS, "train_step_breakdown.png"), "One rollout + train iteration")
    plot_breakdown(rows, [("strong: quickstart, 16 samples", qs), ("weak: 4 samples/rank", weak)],
                   os.path.join(RESULTS, "scaling_breakdown.png"), "Strong and weak scaling, tiny SD3")
    if sizes:
        fig, ax = plt.subplots(figsize=(6, 4))
        P = [rows[n]["params"] / 1e6 for n in sizes]
        ax.plot(P, [rows[n]["perf/state_bytes"] / MiB for n in sizes], "o-", label="state per rank (memory_report)")
        ax.plot(P, [16 * rows[n]["params"] / 2 / MiB for n in sizes], "k--", label="16·P/N (N=2)")
        ax.plot(P, [rows[n]["perf/peak_rss_bytes"] / MiB for n in sizes], "s-", label="peak RSS per rank (max)")
        ax.set_xlabel("parameters (M)"); ax.set_ylabel("MiB per rank"); ax.set_xscale("log"); ax.set_yscale("log")
        ax.legend(); ax.set_title("Per-rank memory vs model size, 2 ranks")
        fig.tight_layout(); fig.savefig(os.path.join(RESULTS, "scaling_memory.png"), dpi=90); plt.close(fig)

    header = f"""- Driver: `benchmarks/scaling/train_step.sh build/ditrl RUNS` then `/usr/bin/python3 tools/train_step_report.py RUNS`
- {machine.replace(chr(10), chr(10) + '- ')}
- Commands (each run also writes OUT/metrics.h5; the breakdown is its measured row's perf/* series):
{commands}
"""
    with open(os.path.join(RESULTS, "train_step.md"), "w") as f:
        f.write("# Train step: time breakdown of one rollout + train iteration\n\n" + header)
        f.write("\n## Quickstart (tiny SD3, 16 samples x 10 steps, 2 trained SDE steps each)\n\n" + table(rows, qs))
        if big:
            f.write("\n\n## SD3 ~100M (benchmarks/configs/sd3-100m.json; 4 samples x 2 steps, 1 trained step)\n\n"
                    + table(rows, big))
        f.write("\n\n![breakdown](train_step_breakdown.png)\n")
        f.write("\n## Checkpoint write bandwidth vs plain sequential writes of the same bytes (page cache, O_DIRECT; same disk, right after the run)\n\n"
                + ckpt_table(rows, list(rows)) + "\n")
    with open(os.path.join(RESULTS, "scaling.md"), "w") as f:
        f.write("# Scaling: ranks and model size\n\n" + header)
        f.write("\n## Strong scaling (fixed global batch: quickstart, 16 samples per rollout)\n\n" + table(rows, qs))
        if big:
            f.write("\n\n### SD3 ~100M, fixed global batch of 4 samples\n\n" + table(rows, big))
        f.write("\n\n## Weak scaling (fixed per-rank batch: 4 samples per rank)\n\n" + table(rows, weak))
        f.write("\n\n![scaling](scaling_breakdown.png)\n")
        f.write("\n## Model-size sweep (2 ranks)\n\n| model | parameters P | state MiB/rank | 16·P/N MiB | "
                "state / 16·P/N | peak RSS MiB/rank | iteration s |\n|---|---|---|---|---|---|---|\n")
        for n in sizes:
            r = rows[n]
            formula = 16 * r["params"] / 2 / MiB
            f.write(f"| {n} | {r['params'] / 1e6:.1f}M | {r['perf/state_bytes'] / MiB:.1f} | {formula:.1f} | "
                    f"{r['perf/state_bytes'] / MiB / formula:.3f} | {r['perf/peak_rss_bytes'] / MiB:.0f} | "
                    f"{iteration_seconds(r):.1f} |\n")
        f.write("\n![memory](scaling_memory.png)\n")
        f.write("\n## Projection to H200 nodes (a MODEL, not a measurement)\n\n" + ASSUMPTIONS + "\n" + projection() + "\n")


if __name__ == "__main__":
    main()
