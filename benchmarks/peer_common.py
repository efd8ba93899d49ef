"""Layers shared by the Python PyTorch eager peers of benchmarks/peer_forward.cpp.

Each is written the way diffusers writes it (same ops, same order), so that a
peer is the reference model and the timing compares frameworks, not models.
Debian's torch 1.13 has no F.scaled_dot_product_attention: attention is the
math formula softmax(q k^T / sqrt(d) + mask) v, as in ditrl's `math` backend.
"""

import json
import math
import resource
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "F16": np.float16,
          "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path):
    """Minimal safetensors reader (Debian ships no `safetensors` package)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = data[8 + n + begin : 8 + n + end]
        if info["dtype"] == "BF16":
            words = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            tensor = torch.from_numpy(words.view(np.float32).copy()).to(torch.bfloat16)
        else:
            tensor = torch.from_numpy(np.frombuffer(raw, dtype=DTYPES[info["dtype"]]).copy())
        out[name] = tensor.reshape(info["shape"])
    return out


def serve(model, train_step):
    """Answers the C++ driver (benchmarks/peer_harness.hpp) over stdin/stdout.

    Prints {"ready", "threads", "torch", "params"} once, then for every input
    line "<n>" runs train_step() (one step, returns the loss as a float) n
    times and prints {"step_seconds", "losses", "minor_faults"}. The driver
    alternates rounds of ditrl and Python steps so both see the same load.
    """
    def timed():
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        value = train_step()
        elapsed = time.perf_counter() - start
        return elapsed, value, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    print(json.dumps({"ready": True, "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "params": sum(p.numel() for p in model.parameters())}), flush=True)
    for line in sys.stdin:
        times, losses, faults = zip(*(timed() for _ in range(int(line))))
        print(json.dumps({"step_seconds": times, "losses": losses, "minor_faults": faults}), flush=True)


def timestep_embedding(t, dim=256, scale=1.0, max_period=10000):
    """diffusers get_timestep_embedding, flip_sin_to_cos=True, shift 0."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(0, half, dtype=torch.float32) / half
    emb = t[:, None].float() * torch.exp(exponent)[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    return torch.cat([emb[:, half:], emb[:, :half]], dim=-1)


class RMSNorm(nn.Module):
    """diffusers RMSNorm: rounds to a half weight's dtype before the multiply."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return x * self.weight


class TorchRMSNorm(nn.Module):
    """torch.nn.RMSNorm (the ATen composite: fp32 statistic, cast back, times weight)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def layer_norm(x, eps=1e-6):
    return F.layer_norm(x, (x.shape[-1],), eps=eps)


def attention(q, k, v, mask=None):
    """(B, H, L, D) math attention; a bool mask is True where attending."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), v)


class MLP(nn.Module):
    """TimestepEmbedding / PixArtAlphaTextProjection: linear_1, activation, linear_2."""

    def __init__(self, dim_in, dim, act=F.silu):
        super().__init__()
        self.act = act
        self.linear_1 = nn.Linear(dim_in, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.linear_2(self.act(self.linear_1(x)))


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


class FeedForward(nn.Module):
    """diffusers FeedForward with GELU-tanh: net.0.proj, net.2."""

    def __init__(self, dim, inner):
        super().__init__()
        self.net = nn.ModuleList([nn.Module(), nn.Identity(), nn.Linear(inner, dim)])
        self.net[0].proj = nn.Linear(dim, inner)

    def forward(self, x):
        return self.net[2](gelu_tanh(self.net[0].proj(x)))
