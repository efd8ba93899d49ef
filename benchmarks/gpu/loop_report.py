"""The report of benchmarks/gpu/loop.sh: per case, samples per device-second of the whole RL iteration, its split,
peak memory against `ditrl plan`, and for sd3 flow_grpo's loop beside ditrl's with the ratio per round.

    python benchmarks/gpu/loop_report.py OUT [--check]

Iteration time, the same definition on both sides: from the start of one rollout to the start of the next
(sampling with CFG, reward, advantages, training forward/backward, optimizer, logging). ditrl: consecutive
progress lines of rank 0; flow_grpo: the driver's clock. Medians over the rollouts after the first (warm-up).
ditrl's split comes from metrics.h5's perf/* series (per rollout, timed on the device by the run). GPU idle
share: no series records it, so it prints "not measured". --check: exit 1 unless every field of every case
is there (a number, or a SKIPPED line with its reason for the flow_grpo side), so the report cannot rot.
Writes OUT/report.json beside the text it prints.
"""
import argparse
import json
import math
import os
import statistics
import sys
import tomllib

import h5py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peer", "flow_grpo"))
from summarize import LINE  # noqa: E402  (ditrl's progress line, as the flow_grpo benchmark reads it)

GB = 1e9
SPLIT = ["sampling_per_step_s", "reward_s", "forward_backward_s", "optimizer_s", "gathers_reduce_scatters_s"]


def median_after_first(values):
    values = list(values)
    return statistics.median(values[1:]) if len(values) > 1 else float("nan")


def iteration_seconds(run):
    import datetime

    stamps = []
    with open(os.path.join(run, "logs", "rank-0.log")) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                stamps.append(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp())
    # The first rollout's own time is not in the stamps (no line before it): it is the warm-up, left out.
    return [float("nan")] + [b - a for a, b in zip(stamps, stamps[1:])]


def ditrl_side(run, samples, steps, device):
    with h5py.File(os.path.join(run, "metrics.h5"), "r") as f:
        perf = {k: f["metrics/perf"][k][()] for k in f["metrics/perf"]}
    seconds = iteration_seconds(run)
    it = median_after_first(seconds)

    def med(key):
        return median_after_first(perf[key]) if key in perf else float("nan")

    comm = med("gather_seconds") + med("reduce_scatter_seconds") + med("rollout_gather_seconds")
    peak_key = "peak_device_bytes" if device == "cuda" else "peak_rss_bytes"
    return {
        "rollouts": len(seconds),
        "iteration_s": it,
        "samples_per_device_s": samples / it,
        "sampling_s": med("rollout_seconds") - med("rollout_gather_seconds"),
        "sampling_per_step_s": (med("rollout_seconds") - med("rollout_gather_seconds")) / steps,
        "reward_s": med("reward_seconds"),
        "prepare_s": med("prepare_seconds"),
        "forward_backward_s": med("forward_backward_seconds") - med("gather_seconds") - med("reduce_scatter_seconds"),
        "optimizer_s": med("optimizer_seconds"),
        "gathers_reduce_scatters_s": comm,
        "rollout_reward_s": med("rollout_seconds") + med("reward_seconds"),  # the phases as summarize.py splits them
        "train_s": med("prepare_seconds") + med("forward_backward_seconds") + med("optimizer_seconds"),
        "device_idle_share": "not measured (no metrics series records it)",
        "peak_gb": float(max(perf[peak_key])) / GB if peak_key in perf else float("nan"),
        "peak_kind": "GPU allocator peak" if device == "cuda" else "process peak RSS",
    }


def flow_grpo_side(path, samples):
    rows = [json.loads(line) for line in open(path)]
    rows.pop()  # the run's meta row
    it = median_after_first(r["seconds"] for r in rows)
    return {"rollouts": len(rows), "iteration_s": it, "samples_per_device_s": samples / it,
            "rollout_reward_s": median_after_first(r["rollout_reward_seconds"] for r in rows),
            "train_s": median_after_first(r["train_seconds"] for r in rows)}


def plan_peak(path, device):
    want = "allocator's predicted peak" if device == "cuda" else "predicted peak per rank:"
    for line in open(path):
        if want in line:
            return float(line.split(": ")[-1].split(" GB")[0])
    return float("nan")


def spread(values):
    return f"{statistics.median(values):.2f}x (rounds {min(values):.2f}-{max(values):.2f}x, n={len(values)})"


def report_case(out, case, device):
    folder = os.path.join(out, case)
    deck_path = os.path.join(folder, "work", "ditrl.toml") if case == "sd3" else os.path.join(folder, "deck.toml")
    with open(deck_path, "rb") as f:
        deck = tomllib.load(f)
    samples, steps = deck["train"]["global_batch"], deck["rollout"]["steps"]
    rounds = sorted(int(d.split("-r")[1]) for d in os.listdir(folder) if d.startswith("ditrl-r") and "." not in d)
    result = {"case": case, "samples_per_iteration": samples, "steps": steps, "preset": deck["model"]["preset"],
              "lora_rank": deck["model"].get("lora", {}).get("rank"), "rounds": {},
              "plan_peak_gb": plan_peak(os.path.join(folder, "plan.txt"), device)}
    for r in rounds:
        result["rounds"][r] = {"ditrl": ditrl_side(os.path.join(folder, f"ditrl-r{r}"), samples, steps, device)}
        fg = os.path.join(folder, f"flow_grpo-r{r}.jsonl")
        if os.path.exists(fg):
            result["rounds"][r]["flow_grpo"] = flow_grpo_side(fg, samples)
    skipped = os.path.join(folder, "flow_grpo.skipped")
    if case == "sd3" and os.path.exists(skipped):
        result["flow_grpo"] = open(skipped).read().strip()
    elif case != "sd3":
        result["flow_grpo"] = "no peer loop for this case"
    return result


def text(res, device):
    d = [v["ditrl"] for v in res["rounds"].values()]
    unit = "GPU" if device == "cuda" else "CPU"
    lines = [f"## {res['case']}: {res['preset']}, LoRA r{res['lora_rank']}, {res['samples_per_iteration']} samples x "
             f"{res['steps']} steps per iteration, {len(d)} rounds x {d[0]['rollouts']} rollouts", "",
             "| round | iteration s | samples per " + unit + "-second | sampling s per denoising step | reward s | "
             "training forward/backward s | optimizer s | gathers + reduce-scatters s | " + unit + " idle share | "
             "peak GB (" + d[0]["peak_kind"] + ") | `ditrl plan` GB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, v in res["rounds"].items():
        x = v["ditrl"]
        lines.append(f"| {r} | {x['iteration_s']:.3f} | {x['samples_per_device_s']:.2f} | {x['sampling_per_step_s']:.4f} "
                     f"| {x['reward_s']:.4f} | {x['forward_backward_s']:.4f} | {x['optimizer_s']:.4f} | "
                     f"{x['gathers_reduce_scatters_s']:.4f} | {x['device_idle_share']} | {x['peak_gb']:.3f} | "
                     f"{res['plan_peak_gb']:.3f} |")
    fg = [(r, v["flow_grpo"], v["ditrl"]) for r, v in res["rounds"].items() if "flow_grpo" in v]
    if fg:
        lines += ["", "flow_grpo's loop (train_sd3.py, same weights, embeddings, resolution, steps, CFG, group, LoRA "
                  "r32, precision and TorchScript reward):", "",
                  "| round | flow_grpo iteration s | samples per " + unit + "-second | rollout+reward s | training s "
                  "| ditrl rollout+reward s | ditrl training s | flow_grpo / ditrl per iteration |",
                  "|---|---|---|---|---|---|---|---|"]
        ratios, phase_r, phase_t = [], [], []
        for r, f, x in fg:
            ratio = f["iteration_s"] / x["iteration_s"]
            dr, dt = x["rollout_reward_s"], x["train_s"]
            ratios.append(ratio)
            phase_r.append(f["rollout_reward_s"] / dr)
            phase_t.append(f["train_s"] / dt)
            lines.append(f"| {r} | {f['iteration_s']:.3f} | {f['samples_per_device_s']:.2f} | {f['rollout_reward_s']:.3f} "
                         f"| {f['train_s']:.3f} | {dr:.3f} | {dt:.3f} | **{ratio:.2f}x** |")
        lines += ["", f"- flow_grpo / ditrl, iteration: {spread(ratios)}; rollout+reward: {spread(phase_r)}; "
                  f"training: {spread(phase_t)}"]
        res["ratio_flow_grpo_over_ditrl"] = ratios
    elif "flow_grpo" in res:
        lines += ["", f"- flow_grpo side: {res['flow_grpo']}"]
    return "\n".join(lines) + "\n"


def missing_fields(res):
    bad = []
    for r, v in res["rounds"].items():
        for key in ["iteration_s", "samples_per_device_s", "peak_gb"] + SPLIT:
            value = v["ditrl"].get(key)
            if not isinstance(value, float) or math.isnan(value):
                bad.append(f"{res['case']} round {r}: ditrl {key} = {value}")
        if "flow_grpo" in v and math.isnan(v["flow_grpo"]["iteration_s"]):
            bad.append(f"{res['case']} round {r}: flow_grpo iteration_s missing")
    if not res["rounds"]:
        bad.append(f"{res['case']}: no ditrl runs")
    if math.isnan(res["plan_peak_gb"]):
        bad.append(f"{res['case']}: no `ditrl plan` prediction")
    if res["case"] == "sd3" and "flow_grpo" not in res and not any("flow_grpo" in v for v in res["rounds"].values()):
        bad.append("sd3: neither a flow_grpo run nor its SKIPPED reason")
    return bad


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    machine = open(os.path.join(out, "machine.txt")).read()
    device = "cuda" if "device: cuda" in machine else "cpu"
    cases = [c for c in ("sd3", "qwen_image", "wan", "flux", "flux2") if os.path.isdir(os.path.join(out, c))]
    results = [report_case(out, c, device) for c in cases]
    print("# RL loop benchmark (benchmarks/gpu/loop.sh)\n\n```\n" + machine.strip() + "\n```\n")
    for res in results:
        print(text(res, device))
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(results, f, indent=1)
    if args.check:
        bad = [b for res in results for b in missing_fields(res)]
        for b in bad:
            print(f"loop_report: MISSING {b}")
        if not cases:
            print("loop_report: MISSING: no case folders")
        sys.exit(1 if bad or not cases else 0)


if __name__ == "__main__":
    main()
