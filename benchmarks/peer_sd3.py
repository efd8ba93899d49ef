"""SD3/SD3.5 MMDiT peer (diffusers SD3Transformer2DModel) for benchmarks/peer_forward.py.

nn.Linear/nn.Conv2d, F.layer_norm, diffusers' RMSNorm, GELU-tanh FFNs, joint
attention image-first, the cropped sin-cos pos_embed buffer.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from peer_common import MLP, FeedForward, RMSNorm, attention, layer_norm, timestep_embedding


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
        self.ff = FeedForward(dim, 4 * dim)
        if not last:
            self.ff_context = FeedForward(dim, 4 * dim)

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


def build(cfg):
    return SD3Transformer(cfg)


def velocity(model, inputs):
    """ditrl's sd3 noise_pred: latents (B, C, H, W), the trajectory timesteps t."""
    return model(inputs["latents"], inputs["cond.encoder_hidden_states"], inputs["cond.pooled_projections"],
                 inputs["timesteps"])
