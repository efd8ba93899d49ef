"""PyTorch FSDP2 peer of benchmarks/peer/fsdp_step.cpp: diffusers' class under `fully_shard`.

One process per rank, launched by mpirun like ditrl (rank and world size from
Open MPI's environment, the gloo process group rendezvous over TCP on
127.0.0.1). The model is diffusers' class for the family built from the same
config.json and loaded from the same safetensors file as ditrl's side; every
transformer block is one `fully_shard` unit and the root the last (the FSDP2
recipe of torchtitan and diffusers' training scripts), MixedPrecisionPolicy
param_dtype bf16 / reduce_dtype fp32, reshard_after_forward True, fp32 AdamW
on the DTensor shards (torch.optim.AdamW defaults, lr 1e-4). Each rank trains
on its contiguous slice of the global batch in the inputs file.

Bytes moved: torch.distributed's all_gather_into_tensor, reduce_scatter_tensor
and all_reduce are wrapped (FSDP2 looks them up on the module at call time) to
count, per rank, the bytes each call exchanges with the other ranks, the same
logical volume benchmarks/scaling/mpi_bytes_shim.c counts for ditrl: an all-gather
receives (N - 1)/N of its output, a reduce-scatter sends (N - 1)/N of its input,
an all-reduce is counted as a reduce-scatter plus an all-gather of its buffer.

Prints (rank 0) one JSON line: {"ranks", "params", "step_seconds", "losses",
"bytes_per_step", "calls_per_step", "torch"}.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_diffusers  # noqa: E402


class ByteCounter:
    """Logical bytes this rank exchanges with the others, per collective kind."""

    def __init__(self, world):
        self.world = world
        self.bytes = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0}
        self.calls = dict.fromkeys(self.bytes, 0)
        share = (world - 1) / world
        # (function, kind, the argument whose size sets the volume: name and position, factor)
        self._wrap("all_gather_into_tensor", "all_gather", "output_tensor", 0, share)
        self._wrap("reduce_scatter_tensor", "reduce_scatter", "input", 1, share)
        self._wrap("all_reduce", "all_reduce", "tensor", 0, 2 * share)

    def _wrap(self, name, kind, argument, position, factor):
        original = getattr(dist, name)

        def counted(*args, **kwargs):
            tensor = kwargs[argument] if argument in kwargs else args[position]
            self.bytes[kind] += tensor.nbytes * factor
            self.calls[kind] += 1
            return original(*args, **kwargs)

        setattr(dist, name, counted)

    def snapshot(self):
        return dict(self.bytes), dict(self.calls)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", required=True, choices=sorted(peer_diffusers.CLASSES))
    parser.add_argument("--config", required=True)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpointing", action="store_true", help="diffusers' gradient checkpointing")
    parser.add_argument("--port", type=int, default=29517)
    args = parser.parse_args()

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    counter = ByteCounter(world)

    model = peer_diffusers.build(args.family, args.config, args.weights)
    params = sum(p.numel() for p in model.parameters())
    if args.checkpointing:
        model.enable_gradient_checkpointing()
    mesh = init_device_mesh("cpu", (world,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.transformer_blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    inputs = load_file(args.inputs)
    batch = inputs["latents"].shape[0]
    if batch % world:
        raise SystemExit(f"{args.inputs}: batch {batch} does not split over {world} ranks")
    rows = batch // world
    local = {name: t.narrow(0, rank * rows, rows).contiguous() for name, t in inputs.items()}
    target = local.pop("target")
    velocity = peer_diffusers.VELOCITY[args.family]

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(velocity(model, local).float(), target)
        loss.backward()
        optimizer.step()
        return loss.item()

    times, losses, before = [], [], None
    for i in range(args.steps + 1):
        dist.barrier()
        if i == 1:
            before = counter.snapshot()
        start = time.perf_counter()
        losses.append(step())
        dist.barrier()
        if i > 0:
            times.append(time.perf_counter() - start)
    after = counter.snapshot()
    per_step = {k: (after[0][k] - before[0][k]) / args.steps for k in after[0]}
    calls = {k: (after[1][k] - before[1][k]) / args.steps for k in after[1]}
    mean = torch.tensor([per_step["all_gather"], per_step["reduce_scatter"], per_step["all_reduce"]],
                        dtype=torch.float64)
    dist.all_reduce(mean)
    mean /= world
    if rank == 0:
        print(json.dumps({"ranks": world, "params": params, "step_seconds": times, "losses": losses,
                          "bytes_per_step": {"all_gather": mean[0].item(), "reduce_scatter": mean[1].item(),
                                             "all_reduce": mean[2].item()},
                          "calls_per_step": calls, "torch": torch.__version__}), flush=True)
    # Gloo's teardown at exit sometimes aborts one rank ("terminate called without an active exception")
    # after the result is out, failing the run; once every rank is past this barrier there is nothing left
    # to tear down that matters, so leave without it.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
