#!/usr/bin/env python3
"""Where one op's time comes from in a `bench_step_profile --trace` file.

The op-family table says how much time copies or multiplications take; this
says which call sites: the op's calls grouped by the two nearest enclosing ops
(casts and copies skipped, so the group names the op that asked for the copy),
input shapes and dtypes, largest total first. A group whose shapes are equal
but whose time per element is high is a strided copy.

    benchmarks/profile/trace_ops.py TRACE.json [--op aten::copy_] [--steps 1] [--top 25]
"""
import argparse
import collections
import json

WRAPPERS = {"aten::to", "aten::_to_copy", "aten::copy_", "aten::contiguous", "aten::clone"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--op", default="aten::copy_")
    ap.add_argument("--steps", type=int, default=1, help="profiled steps in the trace (times are per step)")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    with open(args.trace) as f:
        events = [e for e in json.load(f)["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    events.sort(key=lambda e: (e.get("tid"), e["ts"], -e["dur"]))
    groups = collections.defaultdict(lambda: [0, 0.0])
    stack = []
    for e in events:
        while stack and (stack[-1]["tid"] != e["tid"] or stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]):
            stack.pop()
        if e["name"] == args.op:
            callers = [s["name"] for s in stack if s["name"] not in WRAPPERS][-2:]
            key = (" > ".join(callers) or "(step)", str(e["args"].get("Input Dims")), str(e["args"].get("Input type")))
            groups[key][0] += 1
            groups[key][1] += e["dur"]
        stack.append(e)
    total = sum(us for _, us in groups.values())
    print(f"{args.op}: {total / 1e3 / args.steps:.2f} ms per step in {sum(n for n, _ in groups.values()) // args.steps} calls")
    print("ms/step  calls/step  called from | input shapes | input dtypes")
    for (callers, dims, types), (n, us) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{us / 1e3 / args.steps:7.2f}  {n / args.steps:10.0f}  {callers} | {dims} | {types}")


if __name__ == "__main__":
    main()
