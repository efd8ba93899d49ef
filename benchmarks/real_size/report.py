"""Markdown tables of a benchmarks/real_size/run.sh work folder (stdout).

    /usr/bin/python3 benchmarks/real_size/report.py build/bench-real-size
"""

import glob
import os
import re
import sys

work = sys.argv[1]


def plan_fields(path):
    """The plan's parameter-state bytes per rank and its predicted peak (bytes)."""
    text = open(path).read()
    fields = {k: int(v) for k, v in re.findall(r"^  (\w[\w ]*?)\s+[\d.]+ MiB \((\d+) B\)", text, re.M)}
    m = re.search(r"# predicted peak per rank: [\d.]+ GB \((\d+) B\)", text)
    if m:
        fields["predicted"] = int(m.group(1))
    for phase in ("resident", "load", "rollout", "training"):
        m = re.search(rf"^#   {phase}\s+([\d.]+) GB", text, re.M)
        if m:
            fields[phase] = float(m.group(1)) * 1e9
    return fields


def gb(b):
    return f"{b / 1e9:.2f}"


def phases(log):
    """GB after loading ([load]: RSS, peak) and after the first rollout's sampling ([memory]: peak)."""
    load = re.search(r"\[load\].*RSS ([\d.]+) GB.*peak ([\d.]+) GB", log)
    rollout = re.search(r"\[memory\].*peak ([\d.]+) GB", log)
    return (float(load.group(2)) if load else float("nan"), float(rollout.group(1)) if rollout else float("nan"))


print(open(os.path.join(work, "machine")).read().strip())
print()
print("| model | ranks | plan: parameters (state + gathered) / rank (GB) | predicted peak / rank (GB) | peak RSS per rank (GB) "
      "| RSS / predicted | RSS / parameters | peak after load, after sampling (GB) | s/rollout |")
print("|---|---|---|---|---|---|---|---|---|")
loads = []
for model in ("sd3.5-medium", "wan2.1-t2v-1.3b"):
    for ranks in (1, 2):
        out = os.path.join(work, f"{model}-np{ranks}")
        times = [f"{out}.time.{r}" for r in range(ranks)]
        if not all(os.path.exists(t) and "peak_rss_kb" in open(t).read() for t in times):
            continue  # not run, or not finished
        plan = plan_fields(out + ".plan")
        state, predicted = plan["total"], plan.get("predicted", float("nan"))
        rss, split, load_lines = [], [], []
        for r in range(ranks):
            rss.append(int(re.search(r"peak_rss_kb (\d+)", open(f"{out}.time.{r}").read()).group(1)) * 1024)
            log = open(os.path.join(out, "logs", f"rank-{r}.log")).read()
            split.append("{:.2f}, {:.2f}".format(*phases(log)))
            m = re.search(r"\[load\] .*?([\d.]+) GB, in ([\d.]+) s \(([\d.]+) GB/s; reads ([\d.]+) GB/s\) \((.*?)\);", log)
            if m:
                load_lines.append((float(m.group(1)), float(m.group(2)), float(m.group(4)), m.group(5)))
        loads.append((model, ranks, load_lines))
        rollout = re.search(r"([\d.]+) s/rollout", open(os.path.join(out, "logs", "rank-0.log")).read())
        print(f"| {model} | {ranks} | {gb(state)} | {gb(predicted)} | {', '.join(gb(x) for x in rss)} | "
              f"{', '.join(f'{x / predicted:.2f}' for x in rss)} | {', '.join(f'{x / state:.2f}' for x in rss)} | "
              f"{'; '.join(split)} | {rollout.group(1) if rollout else 'not finished'} |")
print()
print("| model | ranks | load per rank (GB in s; reads GB/s) | aggregate GB/s | plain read: reused buffer, fresh memory "
      "(GB/s) | aggregate / plain (reused, fresh) | phases (rank 0) |")
print("|---|---|---|---|---|---|---|")
for model, ranks, lines in loads:
    plain_path = os.path.join(work, f"{model}.plain")
    if not lines or not os.path.exists(plain_path):
        continue
    plain = open(plain_path).read()
    reused = float(re.search(r"plain read: .*= ([\d.]+) GB/s", plain).group(1))
    fresh_m = re.search(r"plain read into fresh memory: .*= ([\d.]+) GB/s", plain)
    fresh = float(fresh_m.group(1)) if fresh_m else float("nan")
    aggregate = sum(b for b, _, _, _ in lines) / max(s for _, s, _, _ in lines)
    per_rank = "; ".join(f"{b:.2f} in {s:.2f} ({p:.2f})" for b, s, p, _ in lines)
    print(f"| {model} | {ranks} | {per_rank} | {aggregate:.2f} | {reused:.2f}, {fresh:.2f} | "
          f"{aggregate / reused:.2f}, {aggregate / fresh:.2f} | {lines[0][3]} |")
print()
print("| model | after the 2-rank run | peak RSS (GB) | wall (s) | what it did |")
print("|---|---|---|---|---|")
for model in ("sd3.5-medium", "wan2.1-t2v-1.3b"):
    out = os.path.join(work, f"{model}-np2")
    for kind, log in (("resume at 1 rank", out + ".resume.log"), ("export --merged bf16", out + ".export.log")):
        timing = out + (".resume.time" if kind.startswith("resume") else ".export.time")
        if not os.path.exists(timing):
            continue
        t = open(timing).read()
        rss = int(re.search(r"peak_rss_kb (\d+)", t).group(1)) * 1024
        wall = float(re.search(r"wall_s ([\d.]+)", t).group(1))
        text = open(log).read()
        said = re.search(r"resumed from .*|exported .*", text)
        print(f"| {model} | {kind} | {gb(rss)} | {wall:.1f} | {said.group(0) if said else 'see ' + log} |")
print()
print("| preset | ranks | masters | moments | grads | compute shard | peak gathered | parameters (state + gathered) / rank (GB) "
      "| predicted peak / rank (GB) |")
print("|---|---|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(work, "plan-*-np*"))):
    name = os.path.basename(path)[5:]
    preset, ranks = name.rsplit("-np", 1)
    p = plan_fields(path)
    print(f"| {preset} | {ranks} | {gb(p['masters'])} | {gb(p['moments'])} | {gb(p['grads'])} | "
          f"{gb(p['compute shard'])} | {gb(p['peak gathered'])} | {gb(p['total'])} | {gb(p.get('predicted', 0))} |")
