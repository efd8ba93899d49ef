"""Wan 2.1/2.2 text-to-video DiT peer (diffusers WanTransformer3DModel) for benchmarks/peer_forward.py.

Conv3d patchify, 3-D RoPE on interleaved pairs (float64 tables stored fp32),
torch-style q/k RMSNorm across heads, fp32 AdaLN-single modulation
(scale_shift_table + time_proj) and fp32 LayerNorms cast back, cross-attention
to the projected text without a mask. One expert (a two-expert run calls one
expert per step).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from peer_common import MLP, FeedForward, TorchRMSNorm, attention, gelu_tanh, timestep_embedding


def fp32_layer_norm(x, eps, weight=None, bias=None):
    """diffusers FP32LayerNorm on x.float()."""
    w = weight.float() if weight is not None else None
    b = bias.float() if bias is not None else None
    return F.layer_norm(x.float(), (x.shape[-1],), w, b, eps)


def rope_axis(dim, max_seq_len, theta=10000.0):
    """diffusers get_1d_rotary_pos_embed(use_real, repeat_interleave_real, float64)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[: dim // 2] / dim))
    freqs = torch.outer(torch.arange(max_seq_len), freqs)
    return freqs.cos().repeat_interleave(2, dim=1).float(), freqs.sin().repeat_interleave(2, dim=1).float()


class WanRope(nn.Module):
    def __init__(self, head_dim, max_seq_len):
        super().__init__()
        self.head_dim = head_dim
        hw = 2 * (head_dim // 6)
        axes = [rope_axis(d, max_seq_len) for d in (head_dim - 2 * hw, hw, hw)]
        self.register_buffer("freqs_cos", torch.cat([a[0] for a in axes], dim=1), persistent=False)
        self.register_buffer("freqs_sin", torch.cat([a[1] for a in axes], dim=1), persistent=False)

    def forward(self, f, h, w):
        d = self.head_dim
        split = [d - 2 * (d // 3), d // 3, d // 3]

        def grid(table):
            t, hh, ww = table.split(split, dim=1)
            full = (f, h, w, -1)
            return torch.cat([t[:f].view(f, 1, 1, -1).expand(full), hh[:h].view(1, h, 1, -1).expand(full),
                              ww[:w].view(1, 1, w, -1).expand(full)], dim=-1).reshape(1, f * h * w, 1, -1)

        return grid(self.freqs_cos), grid(self.freqs_sin)


def apply_rope(x, cos, sin):
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos[..., 0::2] - x2 * sin[..., 1::2]
    out[..., 1::2] = x1 * sin[..., 1::2] + x2 * cos[..., 0::2]
    return out.type_as(x)


class WanAttention(nn.Module):
    def __init__(self, dim, heads, eps):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])
        self.norm_q, self.norm_k = TorchRMSNorm(dim, eps), TorchRMSNorm(dim, eps)

    def forward(self, x, context=None, rope=None):
        context = x if context is None else context
        q, k = self.norm_q(self.to_q(x)), self.norm_k(self.to_k(context))
        v = self.to_v(context)
        q, k, v = (t.unflatten(2, (self.heads, -1)) for t in (q, k, v))  # (B, L, H, Dh)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        return self.to_out[0](out.flatten(2, 3).type_as(q))


class WanBlock(nn.Module):
    def __init__(self, dim, ffn_dim, heads, cross_attn_norm, eps):
        super().__init__()
        self.eps = eps
        self.attn1 = WanAttention(dim, heads, eps)
        self.attn2 = WanAttention(dim, heads, eps)
        self.norm2 = nn.LayerNorm(dim, eps) if cross_attn_norm else None
        self.ffn = FeedForward(dim, ffn_dim)
        self.scale_shift_table = nn.Parameter(torch.zeros(1, 6, dim))

    def forward(self, x, context, timestep_proj, rope):
        shift, scale, gate, c_shift, c_scale, c_gate = (self.scale_shift_table + timestep_proj.float()).chunk(6, dim=1)
        n = (fp32_layer_norm(x, self.eps) * (1 + scale) + shift).type_as(x)
        x = (x.float() + self.attn1(n, rope=rope) * gate).type_as(x)
        n = x if self.norm2 is None else fp32_layer_norm(x, self.eps, self.norm2.weight, self.norm2.bias).type_as(x)
        x = x + self.attn2(n, context)
        n = (fp32_layer_norm(x, self.eps) * (1 + c_scale) + c_shift).type_as(x)
        return (x.float() + self.ffn(n).float() * c_gate).type_as(x)


class ConditionEmbedder(nn.Module):
    def __init__(self, dim, freq_dim, text_dim):
        super().__init__()
        self.freq_dim = freq_dim
        self.time_embedder = MLP(freq_dim, dim)
        self.time_proj = nn.Linear(dim, 6 * dim)
        self.text_embedder = MLP(text_dim, dim, act=gelu_tanh)

    def forward(self, timestep, text):
        t = timestep_embedding(timestep, self.freq_dim).to(self.time_embedder.linear_1.weight.dtype)
        temb = self.time_embedder(t).type_as(text)
        return temb, self.time_proj(F.silu(temb)), self.text_embedder(text)


class WanTransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
        self.patch, self.eps = cfg["patch_size"], cfg["eps"]
        self.rope = WanRope(cfg["attention_head_dim"], cfg["rope_max_seq_len"])
        self.patch_embedding = nn.Conv3d(cfg["in_channels"], dim, kernel_size=self.patch, stride=self.patch)
        self.condition_embedder = ConditionEmbedder(dim, cfg["freq_dim"], cfg["text_dim"])
        self.blocks = nn.ModuleList(
            WanBlock(dim, cfg["ffn_dim"], cfg["num_attention_heads"], cfg["cross_attn_norm"], cfg["eps"])
            for _ in range(cfg["num_layers"]))
        self.proj_out = nn.Linear(dim, cfg["out_channels"] * self.patch[0] * self.patch[1] * self.patch[2])
        self.scale_shift_table = nn.Parameter(torch.zeros(1, 2, dim))

    def forward(self, hidden_states, timestep, encoder_hidden_states):
        b, _, f, h, w = hidden_states.shape
        pt, ph, pw = self.patch
        f, h, w = f // pt, h // ph, w // pw
        rope = self.rope(f, h, w)
        x = self.patch_embedding(hidden_states).flatten(2).transpose(1, 2)
        temb, timestep_proj, context = self.condition_embedder(timestep, encoder_hidden_states)
        timestep_proj = timestep_proj.unflatten(1, (6, -1))
        for block in self.blocks:
            x = block(x, context, timestep_proj, rope)
        shift, scale = (self.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        x = (fp32_layer_norm(x, self.eps) * (1 + scale) + shift).type_as(x)
        x = self.proj_out(x).reshape(b, f, h, w, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)


def build(cfg):
    return WanTransformer(cfg)


def velocity(model, inputs):
    """ditrl's wan noise_pred: latents (B, C, F, H, W), the trajectory timesteps t."""
    return model(inputs["latents"], inputs["timesteps"], inputs["cond.encoder_hidden_states"])
