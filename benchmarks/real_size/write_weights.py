"""Seeded random weights for a ditrl model in the diffusers layout.

Reads the parameter names and shapes from `ditrl plan` output (a deck without
LoRA, so the names are the checkpoint's) and the persistent buffers it lists
(SD3's pos_embed table, which diffusers checkpoints carry), draws each tensor from its own seeded
generator (N(0, 0.02), stored in --dtype) and writes sharded safetensors
(`diffusion_pytorch_model-0000i-of-0000N.safetensors`) plus
`diffusion_pytorch_model.safetensors.index.json`, as diffusers'
save_pretrained(max_shard_size=...) does. One shard is in memory at a time.

    ditrl plan deck.toml > plan.txt
    python write_weights.py plan.txt OUT_DIR --max-shard-gb 2
"""

import argparse
import json
import os
import re

import torch
from safetensors.torch import save_file


def read_plan(path):
    shapes = []
    with open(path) as f:
        lines = f.read().splitlines()
    # Persistent buffers a diffusers checkpoint carries (SD3's pos_embed table),
    # listed by `ditrl plan` as "# checkpoint buffer: NAME [shape] dtype".
    for line in lines:
        if line.startswith("# checkpoint buffer: "):
            name, shape = re.match(r"# checkpoint buffer: (\S+) \[([\d, ]*)\]", line).groups()
            shapes.append((name, [int(d) for d in shape.split(",") if d.strip()]))
    for line in lines[2:]:  # title, header
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        name = cells[0].removesuffix(" (frozen)")
        shape = [int(d) for d in cells[2].strip("[]").split(",") if d.strip()]
        shapes.append((name, shape))
    return shapes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("out")
    ap.add_argument("--max-shard-gb", type=float, default=2.0)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    shapes = read_plan(args.plan)
    limit = int(args.max_shard_gb * 1e9)
    element = torch.empty((), dtype=dtype).element_size()
    shards, size = [[]], 0
    for name, shape in shapes:
        nbytes = element * (torch.Size(shape).numel())
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    os.makedirs(args.out, exist_ok=True)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"diffusion_pytorch_model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in shard:
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + len(weight_map))
            tensors[name] = (torch.randn(shape, generator=gen) * 0.02).to(dtype)
            weight_map[name] = file
            total += tensors[name].numel() * element
        save_file(tensors, os.path.join(args.out, file), metadata={"format": "pt"})
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(args.out, "diffusion_pytorch_model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    print(f"{len(weight_map)} tensors, {total / 1e9:.2f} GB in {len(shards)} shards -> {args.out}")


if __name__ == "__main__":
    main()
