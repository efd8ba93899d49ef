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
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import read_safetensors, serve  # noqa: E402


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
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(family.velocity(model, inputs), target)
        loss.backward()
        optimizer.step()
        return loss.item()

    serve(model, step)

if __name__ == "__main__":
    main()
