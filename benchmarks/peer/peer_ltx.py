#!/usr/bin/python3
"""Python PyTorch eager peer of the LTX-2 / LTX-2.3 video transformer.

The video stream of Lightricks' ltx_core LTXModel (model.py, transformer.py,
attention.py, rope.py, adaln.py, transformer_args.py) written out with plain
torch ops in ltx_core's op order: AdaLN-single (9-row tables with the prompt
AdaLN of cross attention for 2.3, 6 rows for 2.0), per-head gated attention
(2.3), weightless RMSNorm block norms, q/k RMSNorm across heads, the split
RoPE over fractional pixel/second coordinates (numpy float64 frequency grid),
the caption projection of 2.0, the output LayerNorm. Debian's torch 1.13 has
neither F.scaled_dot_product_attention nor F.rms_norm: attention is the math
formula softmax(q k^T / sqrt(d) + mask) v and rms_norm is ATen's composite
(x * rsqrt(mean(x^2) + eps), in fp32 for half types, then the weight).

Importable (with peer_common.py beside it) by a multi-family driver:
    model = build_model(config)                 # {"transformer": {...}} or the inner dict
    load_weights(model, "weights.safetensors")  # native or model.diffusion_model. names
    loss = train_step(model, optimizer, inputs) # forward + backward + AdamW step
Inputs (safetensors): latent [B, T, in], sigma [B], timesteps [B, 1] or [B, T(, 1)],
positions [B, 3, T, 2], context [B, L, context width], target [B, T, out].

Run as a script it answers the same pipe protocol as benchmarks/peer/peer_diffusers.py:
prints {"ready", "params", "torch", "threads"} once loaded, then for every line
"<n>" read from stdin runs n training steps and prints {"step_seconds",
"losses", "minor_faults"}.
"""

import argparse
import json
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from peer_common import read_safetensors, serve

CHECKPOINT_PREFIX = "model.diffusion_model."


def rms_norm(x, weight=None, eps=1e-6):
    """ATen's composite rms_norm (torch >= 2.4 F.rms_norm)."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y * weight if weight is not None else y


def timestep_embedding(t, dim=256, max_period=10000):
    half = dim // 2
    exponent = torch.arange(0, half, dtype=torch.float32) * -math.log(max_period)
    emb = t[:, None].float() * torch.exp(exponent / half)[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    return torch.cat([emb[:, half:], emb[:, :half]], dim=-1)


def frequency_grid(theta, axes, inner_dim):
    """ltx_core generate_freq_grid_np: float64 pow grid, one rounding to fp32."""
    exponents = np.linspace(np.log(1) / np.log(theta), np.log(theta) / np.log(theta), inner_dim // (2 * axes),
                            dtype=np.float64)
    return torch.as_tensor(np.power(theta, exponents) * math.pi / 2, dtype=torch.float32)


def rope_tables(positions, inner_dim, heads, max_pos, theta, dtype):
    """ltx_core precompute_freqs_cis (SPLIT, middle of the [start, end) bounds)."""
    grid = (positions[..., 0] + positions[..., 1]) / 2.0
    fractional = torch.stack([grid[:, i] / max_pos[i] for i in range(len(max_pos))], dim=-1)
    indices = frequency_grid(theta, len(max_pos), inner_dim).to(positions.device)
    freqs = (indices * (fractional.unsqueeze(-1) * 2 - 1)).transpose(-1, -2).flatten(2)
    cos, sin = freqs.cos(), freqs.sin()
    pad = inner_dim // 2 - freqs.shape[-1]
    if pad:
        cos = torch.cat([torch.ones_like(cos[:, :, :pad]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(sin[:, :, :pad]), sin], dim=-1)
    b, t = cos.shape[0], cos.shape[1]
    cos = cos.reshape(b, t, heads, -1).swapaxes(1, 2)
    sin = sin.reshape(b, t, heads, -1).swapaxes(1, 2)
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x, cos, sin):
    """ltx_core apply_split_rotary_emb for (B, T, H*Dh) inputs."""
    heads = cos.shape[1]
    split = x.unflatten(-1, (heads, -1)).transpose(1, 2).unflatten(-1, (2, -1))
    first, second = split[..., :1, :], split[..., 1:, :]
    out = split * cos.unsqueeze(-2)
    out[..., :1, :].addcmul_(-sin.unsqueeze(-2), second)
    out[..., 1:, :].addcmul_(sin.unsqueeze(-2), first)
    return out.flatten(-2).transpose(1, 2).flatten(-2)


def attention(q, k, v, mask):
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        scores = scores + mask.to(scores.dtype)
    return torch.matmul(scores.softmax(dim=-1), v)


class TimestepEmbedder(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear_1 = nn.Linear(256, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.linear_2(F.silu(self.linear_1(x)))


class AdaLNSingle(nn.Module):
    def __init__(self, dim, rows):
        super().__init__()
        self.emb = nn.Module()
        self.emb.timestep_embedder = TimestepEmbedder(dim)
        self.linear = nn.Linear(dim, rows * dim)

    def forward(self, scaled_timesteps, dtype):
        embedded = self.emb.timestep_embedder(timestep_embedding(scaled_timesteps.flatten()).to(dtype))
        return self.linear(F.silu(embedded)), embedded


class CaptionProjection(nn.Module):
    def __init__(self, in_features, dim):
        super().__init__()
        self.linear_1 = nn.Linear(in_features, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.linear_2(F.gelu(self.linear_1(x), approximate="tanh"))


class RMSNormWeight(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, dim, context_dim, heads, head_dim, eps, gated):
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.q_norm, self.k_norm = RMSNormWeight(inner, eps), RMSNormWeight(inner, eps)
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(context_dim, inner)
        self.to_v = nn.Linear(context_dim, inner)
        self.to_gate_logits = nn.Linear(dim, heads) if gated else None
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x, context, mask=None, pe=None):
        v = self.to_v(context)
        q = self.q_norm(self.to_q(x))
        k = self.k_norm(self.to_k(context))
        if pe is not None:
            q, k = apply_rope(q, *pe), apply_rope(k, *pe)
        b = x.shape[0]
        q, k, v = (t.view(b, -1, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        out = attention(q, k, v, mask).transpose(1, 2).reshape(b, -1, self.heads * self.head_dim).to(q.dtype)
        if self.to_gate_logits is not None:
            gates = 2.0 * torch.sigmoid(self.to_gate_logits(x))
            t = out.shape[1]
            out = (out.view(b, t, self.heads, self.head_dim) * gates.unsqueeze(-1)).view(b, t, -1)
        return self.to_out[0](out)


class FeedForward(nn.Module):
    def __init__(self, dim, bias):
        super().__init__()
        self.net = nn.ModuleList([nn.Module(), nn.Identity(), nn.Linear(4 * dim, dim, bias=bias)])
        self.net[0].proj = nn.Linear(dim, 4 * dim, bias=bias)

    def forward(self, x):
        return self.net[2](F.gelu(self.net[0].proj(x), approximate="tanh"))


def ada_values(table, timestep, begin, count):
    rows = table.shape[0]
    t = timestep.reshape(timestep.shape[0], timestep.shape[1], rows, -1)[:, :, begin : begin + count, :]
    return (table[begin : begin + count].unsqueeze(0).unsqueeze(0).to(timestep.dtype) + t).unbind(dim=2)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dim, heads, head_dim = cfg["dim"], cfg["heads"], cfg["head_dim"]
        self.eps, self.adaln = cfg["norm_eps"], cfg["cross_attention_adaln"]
        gated = cfg["apply_gated_attention"]
        self.attn1 = Attention(dim, dim, heads, head_dim, self.eps, gated)
        self.attn2 = Attention(dim, cfg["cross_attention_dim"], heads, head_dim, self.eps, gated)
        self.ff = FeedForward(dim, cfg["ff_bias"])
        self.scale_shift_table = nn.Parameter(torch.empty(9 if self.adaln else 6, dim))
        if self.adaln:
            self.prompt_scale_shift_table = nn.Parameter(torch.empty(2, dim))

    def forward(self, x, timestep, prompt_timestep, context, context_mask, pe):
        shift, scale, gate = ada_values(self.scale_shift_table, timestep, 0, 3)
        norm = rms_norm(x, eps=self.eps) * (1 + scale) + shift
        x = x + self.attn1(norm, norm, None, pe) * gate
        if self.adaln:
            shift_q, scale_q, gate_q = ada_values(self.scale_shift_table, timestep, 6, 3)
            shift_kv, scale_kv = (self.prompt_scale_shift_table[None, None].to(x.dtype) +
                                  prompt_timestep.reshape(x.shape[0], prompt_timestep.shape[1], 2, -1)).unbind(dim=2)
            query = rms_norm(x, eps=self.eps) * (1 + scale_q) + shift_q
            x = x + self.attn2(query, context * (1 + scale_kv) + shift_kv, context_mask) * gate_q
        else:
            x = x + self.attn2(rms_norm(x, eps=self.eps), context, context_mask)
        shift, scale, gate = ada_values(self.scale_shift_table, timestep, 3, 3)
        return x + self.ff(rms_norm(x, eps=self.eps) * (1 + scale) + shift) * gate


class LTXVideoTransformer(nn.Module):
    """The video stream of ltx_core's LTXModel (audio=None), native parameter names."""

    def __init__(self, transformer):
        super().__init__()
        t = transformer
        if t.get("rope_type") != "split" or t.get("frequencies_precision") != "float64":
            raise ValueError("peer_ltx implements the split RoPE with the float64 grid (every LTX-2.x checkpoint)")
        heads, head_dim = t["num_attention_heads"], t["attention_head_dim"]
        dim = heads * head_dim
        self.cfg = {"dim": dim, "heads": heads, "head_dim": head_dim, "norm_eps": t.get("norm_eps", 1e-6),
                    "cross_attention_adaln": t.get("cross_attention_adaln", False),
                    "apply_gated_attention": t.get("apply_gated_attention", False),
                    "cross_attention_dim": t.get("cross_attention_dim", 4096), "ff_bias": t.get("ff_bias", True)}
        self.theta = t.get("positional_embedding_theta", 10000.0)
        self.max_pos = t.get("positional_embedding_max_pos", [20, 2048, 2048])
        self.scale = t.get("timestep_scale_multiplier", 1000)
        adaln = self.cfg["cross_attention_adaln"]
        self.patchify_proj = nn.Linear(t["in_channels"], dim)
        self.adaln_single = AdaLNSingle(dim, 9 if adaln else 6)
        if adaln:
            self.prompt_adaln_single = AdaLNSingle(dim, 2)
        if not t.get("caption_proj_before_connector", False):
            self.caption_projection = CaptionProjection(t.get("caption_channels", 3840), dim)
        self.scale_shift_table = nn.Parameter(torch.empty(2, dim))
        self.proj_out = nn.Linear(dim, t["out_channels"])
        self.transformer_blocks = nn.ModuleList(Block(self.cfg) for _ in range(t["num_layers"]))

    def forward(self, latent, sigma, timesteps, positions, context, context_mask=None):
        dtype, b = latent.dtype, latent.shape[0]
        dim, heads = self.cfg["dim"], self.cfg["heads"]
        x = self.patchify_proj(latent)
        timestep, embedded = self.adaln_single(timesteps * self.scale, dtype)
        timestep, embedded = timestep.view(b, -1, timestep.shape[-1]), embedded.view(b, -1, dim)
        prompt = None
        if hasattr(self, "prompt_adaln_single"):
            prompt, _ = self.prompt_adaln_single(sigma * self.scale, dtype)
            prompt = prompt.view(b, -1, prompt.shape[-1])
        if hasattr(self, "caption_projection"):
            context = self.caption_projection(context)
        context = context.view(b, -1, dim)
        if context_mask is not None and not torch.is_floating_point(context_mask):
            context_mask = (context_mask - 1).to(dtype).reshape(b, 1, -1, context_mask.shape[-1]) * torch.finfo(dtype).max
        pe = rope_tables(positions, dim, heads, self.max_pos, self.theta, dtype)
        for block in self.transformer_blocks:
            x = block(x, timestep, prompt, context, context_mask, pe)
        shift, scale = (self.scale_shift_table[None, None].to(x.dtype) + embedded[:, :, None]).unbind(dim=2)
        return self.proj_out(F.layer_norm(x, (dim,), eps=1e-6) * (1 + scale) + shift)


def build_model(config):
    """config: the checkpoint-metadata dict {"transformer": {...}} or the transformer dict itself."""
    return LTXVideoTransformer(config.get("transformer", config))


def load_weights(model, path):
    """Strict load by native name; single-file checkpoint names lose their prefix."""
    state = {name[len(CHECKPOINT_PREFIX):] if name.startswith(CHECKPOINT_PREFIX) else name: tensor
             for name, tensor in read_safetensors(path).items()}
    model.load_state_dict(state, strict=True)


def train_step(model, optimizer, inputs):
    """One forward + backward + optimizer step; returns the MSE loss."""
    optimizer.zero_grad(set_to_none=True)
    velocity = model(inputs["latent"], inputs["sigma"], inputs["timesteps"], inputs["positions"], inputs["context"],
                     inputs.get("context_mask"))
    loss = F.mse_loss(velocity, inputs["target"])
    loss.backward()
    optimizer.step()
    return loss.item()


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
        model = build_model(json.load(f))
    load_weights(model, args.weights)
    inputs = read_safetensors(args.inputs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    serve(model, lambda: train_step(model, optimizer, inputs))

if __name__ == "__main__":
    main()
