"""The diffusers peer's training step under PyTorch's profiler, for benchmarks/profile/step_profile.cpp.

The step is peer_diffusers.py's training_step (diffusers' own class for the family, the same config.json, weights
and inputs files, torch.optim.AdamW, fp32 or bf16 autocast); after --warmup steps, --steps steps run
under torch.profiler (CPU activities, FLOP counts). The optimizer step runs inside the record_function
scope --optimizer-scope names, so the C++ side attributes both processes' events with one set of rules.
Prints one JSON line: {"seconds": wall time of the profiled steps, "torch", "diffusers",
"events": [[name, start_ns, end_ns, thread, flops], ...]}.
"""

import argparse
import json
import os
import sys
import time

import diffusers
import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_diffusers import CLASSES, build, training_step  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", required=True, choices=sorted(CLASSES))
    parser.add_argument("--dir", required=True, help="config.json, weights.safetensors, inputs.safetensors")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--optimizer-scope", required=True)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()

    torch.set_num_threads(1)
    model = build(args.family, os.path.join(args.dir, "config.json"), os.path.join(args.dir, "weights.safetensors"))
    step = training_step(args.family, model, load_file(os.path.join(args.dir, "inputs.safetensors")), args.precision,
                         args.lr, lambda: torch.autograd.profiler.record_function(args.optimizer_scope))

    for _ in range(args.warmup):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        seconds = time.perf_counter() - start
    events = [[e.name, int(e.time_range.start * 1000), int(e.time_range.end * 1000), e.thread, int(e.flops or 0)]
              for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    print(json.dumps({"seconds": seconds, "torch": torch.__version__, "diffusers": diffusers.__version__,
                      "events": events}))


if __name__ == "__main__":
    main()
