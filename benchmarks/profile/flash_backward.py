#!/usr/bin/env python3
"""LibTorch's CPU flash attention backward at bf16 against the same kernel at
fp32 on widened copies (what ditrl's `flash` backend runs below its size rule,
src/models/fused_attention.cpp), one thread, per head layout and token count.

The bf16 kernel is what a user gets from SDPA in PyTorch (diffusers' attention
under bf16 autocast); both sides take the bf16 forward's output and logsumexp.
Alternating rounds, median per side. Appends a markdown section to --out.

  benchmarks/profile/flash_backward.py [--rounds 7] [--out benchmarks/results/flash_backward.md]
"""

import argparse
import statistics
import time

import torch

from kernel_section import Section

# (heads, head_dim): the tiny presets (SD3 / Qwen-Image 4 x 16, Wan 2 x 32) and
# the ~100M peer configs (SD3 12 x 64, Wan / Qwen-Image 6 x 128).
LAYOUTS = [(4, 16), (2, 32), (12, 64), (6, 128)]
TOKENS = [24, 72, 128, 160, 191, 192, 256, 384, 768]
NATIVE_FROM_WORK = 12288  # ditrl's rule: tokens x head_dim below this widen


def backward(widen, g, q, k, v, out, lse):
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    if not widen:
        return op(g, q, k, v, out, lse, 0.0, False)
    grads = op(g.float(), q.float(), k.float(), v.float(), out.float(), lse, 0.0, False)
    return [x.to(q.dtype) for x in grads]


def measure(heads, head_dim, tokens, rounds):
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(2, heads, tokens, head_dim, generator=gen).to(torch.bfloat16) for _ in range(4))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    calls = max(2, int(2e6 / (tokens * tokens * head_dim * heads)))
    times = {False: [], True: []}
    for widen in (False, True):
        backward(widen, g, q, k, v, out, lse)
    for _ in range(rounds):
        for widen in (False, True):
            start = time.perf_counter()
            for _ in range(calls):
                backward(widen, g, q, k, v, out, lse)
            times[widen].append((time.perf_counter() - start) / calls * 1e3)
    errors = [max_error(backward(widen, g, q, k, v, out, lse), q, k, v, g) for widen in (False, True)]
    return statistics.median(times[False]), statistics.median(times[True]), errors


def max_error(grads, q, k, v, g):
    """Largest |gradient - exact| over dq, dk, dv; exact: softmax attention in float64 on the bf16 inputs."""
    qd, kd, vd = (t.double().requires_grad_(True) for t in (q, k, v))
    scores = qd @ kd.transpose(-1, -2) / q.size(-1) ** 0.5
    (torch.softmax(scores, -1) @ vd).backward(g.double())
    return max((grad.double() - exact.grad).abs().max().item() for grad, exact in zip(grads, (qd, kd, vd)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    section = Section("bf16 backward vs widened fp32 backward")
    rows = []
    for heads, head_dim in LAYOUTS:
        for tokens in TOKENS:
            native, widened, (native_error, widened_error) = measure(heads, head_dim, tokens, args.rounds)
            ditrl = "widened" if tokens * head_dim < NATIVE_FROM_WORK else "native"
            rows.append(f"| 2 x {heads} x {head_dim} | {tokens} | {tokens * head_dim} | {native:.3f} | {widened:.3f} | "
                        f"**{native / widened:.2f}x** | {native_error:.1e} / {widened_error:.1e} | {ditrl} |")
            print(rows[-1], flush=True)
    section.write(args.out, ("avx512_bf16", "amx_bf16", "avx2"),
                  f"{args.rounds} alternating rounds, median ms per call",
                  "| batch x heads x head dim | query = key tokens | tokens x head dim | bf16 kernel ms | widened fp32 ms | "
                  "bf16 / widened | max abs error vs float64, bf16 / widened | ditrl takes |", rows)


if __name__ == "__main__":
    main()
