#!/usr/bin/env python3
"""A linear layer's three fp32 GEMMs (forward x W^T + b, backward dX = g W and
dW = g^T x) on PyTorch's default kernel, its BLAS (MKL in the PyPI wheel: what
diffusers' layers run), against oneDNN's matmul (mkldnn::_linear_pointwise on
strided views, what ditrl's precision.cpu_fp32_gemm = "onednn" runs from 2^20
multiply-adds up, src/models/widened_gemm.cpp), one thread, per shape.
Alternating rounds, median per side. Appends a markdown section to --out.

  benchmarks/profile/fp32_gemm.py [--rounds 5] [--out benchmarks/results/fp32_gemm.md]
"""

import argparse
import statistics
import time

import torch

from kernel_section import Section

ROWS = [24, 72, 144, 768]
# (in, out): the tiny presets' 64-wide layers up to the ~100M configs' 768 x 3072 MLP.
LAYERS = [(64, 64), (64, 192), (64, 256), (128, 384), (256, 256), (256, 768), (512, 512), (768, 768), (768, 3072)]
ONEDNN_FROM_MACS = 1 << 20  # ditrl's rule


def onednn(a, w_t, bias=None):
    return torch.ops.mkldnn._linear_pointwise(a, w_t, bias, "none", [], "")


def gemms(use_onednn, x, w, b, g):
    if use_onednn:
        return onednn(x, w, b), onednn(g, w.t()), onednn(g.t(), x.t())
    return torch.nn.functional.linear(x, w, b), g.mm(w), g.t().mm(x)


def measure(rows, k, n, rounds):
    gen = torch.Generator().manual_seed(0)
    x, w, b, g = (torch.randn(*shape, generator=gen) for shape in ((rows, k), (n, k), (n,), (rows, n)))
    calls = max(3, int(2e7 / (rows * k * n)))
    times = {False: [], True: []}
    for side in (False, True):
        gemms(side, x, w, b, g)
    for _ in range(rounds):
        for side in (False, True):
            start = time.perf_counter()
            for _ in range(calls):
                gemms(side, x, w, b, g)
            times[side].append((time.perf_counter() - start) / calls * 1e6)
    exact = (x.double() @ w.double().t() + b.double(), g.double() @ w.double(), g.double().t() @ x.double())
    errors = [max(((got.double() - e).abs().max() / e.abs().max()).item() for got, e in zip(gemms(side, x, w, b, g), exact))
              for side in (False, True)]
    return statistics.median(times[False]), statistics.median(times[True]), errors


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    section = Section("BLAS vs oneDNN fp32 GEMMs of a linear layer")
    rows = []
    for m in ROWS:
        for k, n in LAYERS:
            blas, dnn, (blas_error, dnn_error) = measure(m, k, n, args.rounds)
            macs = m * k * n
            gflops = 6 * macs / 1e3  # three GEMMs of 2 * macs FLOPs, per microsecond
            rows.append(f"| {m} x {k} -> {n} | {macs / 1e6:.2f} | {blas:.1f} ({gflops / blas:.0f}) | "
                        f"{dnn:.1f} ({gflops / dnn:.0f}) | **{blas / dnn:.2f}x** | {blas_error:.1e} / {dnn_error:.1e} | "
                        f"{'oneDNN' if macs >= ONEDNN_FROM_MACS else 'BLAS'} |")
            print(rows[-1], flush=True)
    section.write(args.out, ("avx512f", "avx512_bf16", "avx2", "Genuine", "Authentic"),
                  f"BLAS: {'MKL' if torch.backends.mkl.is_available() else 'not MKL'}; {args.rounds} alternating "
                  "rounds, median",
                  "| rows x in -> out | multiply-adds (M) | BLAS us for fwd + dX + dW (GFLOP/s) | oneDNN us (GFLOP/s) | "
                  "BLAS / oneDNN | max error / max value vs float64, BLAS / oneDNN | ditrl takes |", rows)


if __name__ == "__main__":
    main()
