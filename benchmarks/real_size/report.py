"""Markdown tables of a benchmarks/real_size/run.sh work folder (stdout).

    /usr/bin/python3 benchmarks/real_size/report.py build/bench-real-size
"""

import glob
import os
import re
import sys

work = sys.argv[1]


def plan_total(path):
    text = open(path).read()
    fields = {k: int(v) for k, v in re.findall(r"^  (\w[\w ]*?)\s+[\d.]+ MiB \((\d+) B\)", text, re.M)}
    return fields


def gb(b):
    return f"{b / 1e9:.2f}"


print(open(os.path.join(work, "machine")).read().strip())
print()
print("| model | ranks | plan total / rank (GB) | peak RSS per rank (GB) | RSS / plan | load (GB read / s / GB/s) "
      "| plain read (GB/s) | load / plain | s/rollout |")
print("|---|---|---|---|---|---|---|---|---|")
for model in ("sd3.5-medium", "wan2.1-t2v-1.3b"):
    if not os.path.exists(os.path.join(work, f"{model}.plain")):
        continue
    plain = open(os.path.join(work, f"{model}.plain")).read()
    plain_bw = float(re.search(r"= ([\d.]+) GB/s", plain).group(1))
    for ranks in (1, 2):
        out = os.path.join(work, f"{model}-np{ranks}")
        times = [f"{out}.time.{r}" for r in range(ranks)]
        if not all(os.path.exists(t) and "peak_rss_kb" in open(t).read() for t in times):
            continue  # not run, or not finished
        total = plan_total(out + ".plan")["total"]
        rss = []
        for r in range(ranks):
            t = open(f"{out}.time.{r}").read()
            rss.append(int(re.search(r"peak_rss_kb (\d+)", t).group(1)) * 1024)
        loads = []
        for r in range(ranks):
            log = open(os.path.join(out, "logs", f"rank-{r}.log")).read()
            m = re.search(r"\[load\] .*?([\d.]+) GB, in ([\d.]+) s \(([\d.]+) GB/s\)", log)
            loads.append((float(m.group(1)), float(m.group(2)), float(m.group(3))))
        rollout = re.search(r"([\d.]+) s/rollout", open(os.path.join(out, "logs", "rank-0.log")).read())
        load_text = "; ".join(f"{a:.2f} / {b:.1f} / {c:.2f}" for a, b, c in loads)
        ratio = "; ".join(f"{c / plain_bw:.2f}" for _, _, c in loads)
        print(f"| {model} | {ranks} | {gb(total)} | {', '.join(gb(x) for x in rss)} | "
              f"{', '.join(f'{x / total:.2f}' for x in rss)} | {load_text} | {plain_bw:.2f} | {ratio} | "
              f"{rollout.group(1) if rollout else 'not finished'} |")
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
print("| preset | ranks | masters | moments | grads | compute shard | peak gathered | total / rank (GB) |")
print("|---|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(work, "plan-*-np*"))):
    name = os.path.basename(path)[5:]
    preset, ranks = name.rsplit("-np", 1)
    p = plan_total(path)
    print(f"| {preset} | {ranks} | {gb(p['masters'])} | {gb(p['moments'])} | {gb(p['grads'])} | "
          f"{gb(p['compute shard'])} | {gb(p['peak gathered'])} | {gb(p['total'])} |")
