#!/usr/bin/python3
"""Python PyTorch eager peer of benchmarks/peer_forward.cpp, for any family.

The family's model comes from benchmarks/peer_<family>.py, which defines
`build(config) -> nn.Module` (the diffusers / reference model written with
plain torch ops, parameter names = checkpoint names) and
`velocity(model, inputs) -> Tensor` (what ditrl's Family::noise_pred computes
from the same inputs). The driver loads the same weights from the same
safetensors file by checkpoint name (strict) and times forward + backward +
AdamW step on the same inputs with the same number of threads.

Inputs file (written by peer_forward.cpp): `latents`, `timesteps`, `sigmas`,
`target` and `cond.<name>` for every conditioning tensor of the family.

Protocol (stdin/stdout, one JSON line per answer): prints {"ready", "params",
"torch", "threads"} once loaded, then for every line "<n>" read from stdin runs
n training steps and prints {"step_seconds": [...], "losses": [...],
"minor_faults": [...]} (page faults per step).
"""

import argparse
import importlib
import json
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import read_safetensors  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", required=True, help="sd3 | wan | qwen_image | ... (benchmarks/peer_<family>.py)")
    parser.add_argument("--config", required=True)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    family = importlib.import_module("peer_" + args.family)
    with open(args.config) as f:
        cfg = json.load(f)
    model = family.build(cfg)
    model.load_state_dict(read_safetensors(args.weights), strict=True)
    inputs = read_safetensors(args.inputs)
    target = inputs.pop("target")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def step():
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(family.velocity(model, inputs), target)
        loss.backward()
        optimizer.step()
        value = loss.item()
        elapsed = time.perf_counter() - start
        return elapsed, value, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    # Driven by the C++ side, which alternates rounds of ditrl and Python
    # steps so that both see the same background load: each input line
    # "<n>" runs n steps and answers one JSON line.
    print(json.dumps({"ready": True, "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "params": sum(p.numel() for p in model.parameters())}), flush=True)
    for line in sys.stdin:
        times, losses, faults = zip(*(step() for _ in range(int(line))))
        print(json.dumps({"step_seconds": times, "losses": losses, "minor_faults": faults}), flush=True)


if __name__ == "__main__":
    main()
