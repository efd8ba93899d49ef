#!/usr/bin/python3
"""Python PyTorch eager peer of benchmarks/peer_forward.cpp.

The same SD3/SD3.5 MMDiT written the way diffusers writes it (nn.Linear,
F.layer_norm, RMSNorm with diffusers' rounding, GELU-tanh FFN, joint attention
image-first), loading the same weights from the same safetensors file by
checkpoint name (strict), timing forward + backward + AdamW step on the same
inputs with the same number of threads. Debian's torch 1.13 has no
F.scaled_dot_product_attention, so attention is the math formula
softmax(q k^T / sqrt(d)) v, as in ditrl's `math` backend.

Protocol (stdin/stdout, one JSON line per answer): prints {"ready", "params",
"torch", "threads"} once loaded, then for every line "<n>" read from stdin runs
n training steps and prints {"step_seconds": [...], "losses": [...],
"minor_faults": [...]} (page faults per step).
"""

import argparse
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

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "F16": np.float16}


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


def timestep_embedding(t, dim=256, max_period=10000):
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(0, half, dtype=torch.float32) / half
    emb = t[:, None].float() * torch.exp(exponent)[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    return torch.cat([emb[:, half:], emb[:, :half]], dim=-1)


class RMSNorm(nn.Module):
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


def layer_norm(x):
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6)


def attention(q, k, v):
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    return torch.matmul(scores.softmax(dim=-1), v)


class MLP(nn.Module):
    def __init__(self, dim_in, dim):
        super().__init__()
        self.linear_1 = nn.Linear(dim_in, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.linear_2(F.silu(self.linear_1(x)))


class TimeTextEmbed(nn.Module):
    def __init__(self, dim, pooled_dim):
        super().__init__()
        self.timestep_embedder = MLP(256, dim)
        self.text_embedder = MLP(pooled_dim, dim)

    def forward(self, timestep, pooled):
        t = timestep_embedding(timestep).to(pooled.dtype)
        return self.timestep_embedder(t) + self.text_embedder(pooled)


class PatchEmbed(nn.Module):
    def __init__(self, in_channels, dim, patch, max_size):
        super().__init__()
        self.patch, self.max_size = patch, max_size
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch, stride=patch)
        self.register_buffer("pos_embed", torch.zeros(1, max_size * max_size, dim))

    def forward(self, latent):
        h, w = latent.shape[-2] // self.patch, latent.shape[-1] // self.patch
        x = self.proj(latent).flatten(2).transpose(1, 2)
        top, left = (self.max_size - h) // 2, (self.max_size - w) // 2
        pos = self.pos_embed.reshape(1, self.max_size, self.max_size, -1)[:, top : top + h, left : left + w, :]
        return (x + pos.reshape(1, -1, pos.shape[-1])).to(x.dtype)


class FeedForward(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.net = nn.ModuleList([nn.Module(), nn.Identity(), nn.Linear(4 * dim, dim)])
        self.net[0].proj = nn.Linear(dim, 4 * dim)

    def forward(self, x):
        return self.net[2](F.gelu(self.net[0].proj(x), approximate="tanh"))


class Attention(nn.Module):
    def __init__(self, dim, heads, qk_norm, joint, context_out):
        super().__init__()
        self.heads = heads
        head_dim = dim // heads
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.norm_q = RMSNorm(head_dim) if qk_norm else None
        self.norm_k = RMSNorm(head_dim) if qk_norm else None
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])
        if joint:
            self.add_q_proj, self.add_k_proj, self.add_v_proj = (nn.Linear(dim, dim) for _ in range(3))
            self.norm_added_q = RMSNorm(head_dim) if qk_norm else None
            self.norm_added_k = RMSNorm(head_dim) if qk_norm else None
            self.to_add_out = nn.Linear(dim, dim) if context_out else None

    def heads_of(self, x):
        b = x.shape[0]
        return x.view(b, -1, self.heads, x.shape[-1] // self.heads).transpose(1, 2)

    def qkv(self, x, to_q, to_k, to_v, norm_q, norm_k):
        q, k, v = self.heads_of(to_q(x)), self.heads_of(to_k(x)), self.heads_of(to_v(x))
        if norm_q is not None:
            q, k = norm_q(q), norm_k(k)
        return q, k, v

    def forward(self, x, c=None):
        b = x.shape[0]
        q, k, v = self.qkv(x, self.to_q, self.to_k, self.to_v, self.norm_q, self.norm_k)
        if c is not None:
            cq, ck, cv = self.qkv(c, self.add_q_proj, self.add_k_proj, self.add_v_proj, self.norm_added_q,
                                  self.norm_added_k)
            q, k, v = torch.cat([q, cq], 2), torch.cat([k, ck], 2), torch.cat([v, cv], 2)
        out = attention(q, k, v).transpose(1, 2).reshape(b, -1, q.shape[1] * q.shape[-1]).to(q.dtype)
        if c is None:
            return self.to_out[0](out)
        x_out, c_out = out[:, : x.shape[1]], out[:, x.shape[1] :]
        return self.to_out[0](x_out), (self.to_add_out(c_out) if self.to_add_out is not None else None)


class AdaLNZero(nn.Module):
    def __init__(self, dim, chunks):
        super().__init__()
        self.chunks = chunks
        self.linear = nn.Linear(dim, chunks * dim)

    def forward(self, emb):
        return self.linear(F.silu(emb)).chunk(self.chunks, dim=1)


class AdaLNContinuous(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x, cond):
        scale, shift = self.linear(F.silu(cond).to(x.dtype)).chunk(2, dim=1)
        return layer_norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


def modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


class JointBlock(nn.Module):
    def __init__(self, dim, heads, qk_norm, dual, last):
        super().__init__()
        self.dual, self.last = dual, last
        self.norm1 = AdaLNZero(dim, 9 if dual else 6)
        self.norm1_context = AdaLNContinuous(dim) if last else AdaLNZero(dim, 6)
        self.attn = Attention(dim, heads, qk_norm, joint=True, context_out=not last)
        if dual:
            self.attn2 = Attention(dim, heads, qk_norm, joint=False, context_out=False)
        self.ff = FeedForward(dim)
        if not last:
            self.ff_context = FeedForward(dim)

    def forward(self, x, c, temb):
        m = self.norm1(temb)
        x_norm = layer_norm(x)
        x_in = modulate(x_norm, m[0], m[1])
        if self.last:
            c_in = self.norm1_context(c, temb)
        else:
            cm = self.norm1_context(temb)
            c_in = modulate(layer_norm(c), cm[0], cm[1])
        attn_x, attn_c = self.attn(x_in, c_in)
        x = x + m[2].unsqueeze(1) * attn_x
        if self.dual:
            x = x + m[8].unsqueeze(1) * self.attn2(modulate(x_norm, m[6], m[7]))
        x = x + m[5].unsqueeze(1) * self.ff(modulate(layer_norm(x), m[3], m[4]))
        if self.last:
            return None, x
        c = c + cm[2].unsqueeze(1) * attn_c
        c = c + cm[5].unsqueeze(1) * self.ff_context(modulate(layer_norm(c), cm[3], cm[4]))
        return c, x


class SD3Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
        self.patch, self.out_channels = cfg["patch_size"], cfg["out_channels"]
        self.pos_embed = PatchEmbed(cfg["in_channels"], dim, cfg["patch_size"], cfg["pos_embed_max_size"])
        self.time_text_embed = TimeTextEmbed(dim, cfg["pooled_projection_dim"])
        self.context_embedder = nn.Linear(cfg["joint_attention_dim"], dim)
        layers = cfg["num_layers"]
        self.transformer_blocks = nn.ModuleList(
            JointBlock(dim, cfg["num_attention_heads"], cfg.get("qk_norm") == "rms_norm",
                       i in cfg.get("dual_attention_layers", []), i == layers - 1) for i in range(layers))
        self.norm_out = AdaLNContinuous(dim)
        self.proj_out = nn.Linear(dim, self.patch * self.patch * self.out_channels)

    def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep):
        h, w = hidden_states.shape[-2] // self.patch, hidden_states.shape[-1] // self.patch
        x = self.pos_embed(hidden_states)
        temb = self.time_text_embed(timestep, pooled_projections)
        c = self.context_embedder(encoder_hidden_states)
        for block in self.transformer_blocks:
            c, x = block(x, c, temb)
        x = self.proj_out(self.norm_out(x, temb))
        p = self.patch
        x = x.reshape(x.shape[0], h, w, p, p, self.out_channels)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], self.out_channels, h * p, w * p)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    with open(args.config) as f:
        cfg = json.load(f)
    model = SD3Transformer(cfg)
    model.load_state_dict(read_safetensors(args.weights), strict=True)
    inputs = read_safetensors(args.inputs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    inputs = (inputs["hidden_states"], inputs["encoder_hidden_states"], inputs["pooled_projections"],
              inputs["timestep"], inputs["target"])

    def step():
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(*inputs[:4]), inputs[4])
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
