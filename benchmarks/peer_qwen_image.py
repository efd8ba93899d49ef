"""Qwen-Image MMDiT peer (diffusers QwenImageTransformer2DModel) for benchmarks/peer_forward.py.

Dual-stream blocks with img_mod/txt_mod AdaLN-Zero, per-head diffusers RMSNorm
on q/k, complex64 MSRoPE with centred image positions, joint attention
text-first with the padding mask (dropped when all tokens are valid), txt_norm
+ txt_in, sigma timesteps (the sinusoid scales by 1000). ditrl's noise_pred
takes unpacked latents (B, C, H, W): velocity() packs and unpacks around the
diffusers forward.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from peer_common import MLP, FeedForward, RMSNorm, attention, layer_norm, timestep_embedding


def rope_params(index, dim, theta=10000):
    freqs = torch.outer(index, 1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(torch.float32).div(dim)))
    return torch.polar(torch.ones_like(freqs), freqs)


class QwenRope:
    def __init__(self, axes_dim):
        self.axes_dim = axes_dim
        pos, neg = torch.arange(4096), torch.arange(4096).flip(0) * -1 - 1
        self.pos_freqs = torch.cat([rope_params(pos, d) for d in axes_dim], dim=1)
        self.neg_freqs = torch.cat([rope_params(neg, d) for d in axes_dim], dim=1)

    def __call__(self, frame, height, width, text_len):
        split = [d // 2 for d in self.axes_dim]
        fp, hp, wp = self.pos_freqs.split(split, dim=1)
        _, hn, wn = self.neg_freqs.split(split, dim=1)
        full = (frame, height, width, -1)
        rows = torch.cat([hn[-(height - height // 2):], hp[: height // 2]], dim=0)
        cols = torch.cat([wn[-(width - width // 2):], wp[: width // 2]], dim=0)
        image = torch.cat([fp[:frame].view(frame, 1, 1, -1).expand(full), rows.view(1, height, 1, -1).expand(full),
                           cols.view(1, 1, width, -1).expand(full)], dim=-1).reshape(frame * height * width, -1)
        start = max(height // 2, width // 2)
        return image, self.pos_freqs[start : start + text_len]


def apply_rope(x, freqs):
    rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)) * freqs.unsqueeze(1)
    return torch.view_as_real(rotated).flatten(3).type_as(x)


class JointAttention(nn.Module):
    def __init__(self, dim, heads, head_dim):
        super().__init__()
        self.heads = heads
        for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"):
            setattr(self, name, nn.Linear(dim, dim))
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])
        for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            setattr(self, name, RMSNorm(head_dim))

    def forward(self, x, c, img_freqs, txt_freqs, mask):
        def qkv(t, to_q, to_k, to_v, norm_q, norm_k, freqs):
            q, k, v = (p(t).unflatten(-1, (self.heads, -1)) for p in (to_q, to_k, to_v))
            return apply_rope(norm_q(q), freqs), apply_rope(norm_k(k), freqs), v

        iq, ik, iv = qkv(x, self.to_q, self.to_k, self.to_v, self.norm_q, self.norm_k, img_freqs)
        tq, tk, tv = qkv(c, self.add_q_proj, self.add_k_proj, self.add_v_proj, self.norm_added_q, self.norm_added_k,
                         txt_freqs)
        q, k, v = (torch.cat(pair, dim=1).transpose(1, 2) for pair in ((tq, iq), (tk, ik), (tv, iv)))
        out = attention(q, k, v, mask).transpose(1, 2).flatten(2, 3).to(q.dtype)
        text = c.shape[1]
        return self.to_out[0](out[:, text:]), self.to_add_out(out[:, :text])


def modulate(x, params):
    shift, scale, gate = params.chunk(3, dim=-1)
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1), gate.unsqueeze(1)


class QwenBlock(nn.Module):
    def __init__(self, dim, heads, head_dim):
        super().__init__()
        self.img_mod = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.txt_mod = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.attn = JointAttention(dim, heads, head_dim)
        self.img_mlp = FeedForward(dim, 4 * dim)
        self.txt_mlp = FeedForward(dim, 4 * dim)

    def forward(self, x, c, temb, img_freqs, txt_freqs, mask):
        img1, img2 = self.img_mod(temb).chunk(2, dim=-1)
        txt1, txt2 = self.txt_mod(temb).chunk(2, dim=-1)
        xi, gate1 = modulate(layer_norm(x), img1)
        ci, tgate1 = modulate(layer_norm(c), txt1)
        img_attn, txt_attn = self.attn(xi, ci, img_freqs, txt_freqs, mask)
        x = x + gate1 * img_attn
        c = c + tgate1 * txt_attn
        xi, gate2 = modulate(layer_norm(x), img2)
        x = x + gate2 * self.img_mlp(xi)
        ci, tgate2 = modulate(layer_norm(c), txt2)
        c = c + tgate2 * self.txt_mlp(ci)
        return c, x


class TimeTextEmbed(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.timestep_embedder = MLP(256, dim)

    def forward(self, timestep, dtype):
        return self.timestep_embedder(timestep_embedding(timestep, 256, scale=1000).to(dtype))


class AdaLNContinuous(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x, cond):
        scale, shift = self.linear(F.silu(cond).to(x.dtype)).chunk(2, dim=1)
        return layer_norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class QwenImageTransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        heads, head_dim = cfg["num_attention_heads"], cfg["attention_head_dim"]
        dim = heads * head_dim
        out_channels = cfg.get("out_channels") or cfg["in_channels"]
        self.rope = QwenRope(cfg["axes_dims_rope"])
        self.time_text_embed = TimeTextEmbed(dim)
        self.txt_norm = RMSNorm(cfg["joint_attention_dim"])
        self.img_in = nn.Linear(cfg["in_channels"], dim)
        self.txt_in = nn.Linear(cfg["joint_attention_dim"], dim)
        self.transformer_blocks = nn.ModuleList(QwenBlock(dim, heads, head_dim) for _ in range(cfg["num_layers"]))
        self.norm_out = AdaLNContinuous(dim)
        self.proj_out = nn.Linear(dim, cfg["patch_size"] ** 2 * out_channels)

    def forward(self, hidden_states, encoder_hidden_states, mask, timestep, img_shape):
        x = self.img_in(hidden_states)
        timestep = timestep.to(x.dtype)
        c = self.txt_in(self.txt_norm(encoder_hidden_states))
        temb = self.time_text_embed(timestep, x.dtype)
        img_freqs, txt_freqs = self.rope(*img_shape, c.shape[1])
        joint = None
        if mask is not None and not mask.bool().all():
            image = torch.ones(x.shape[:2], dtype=torch.bool)
            joint = torch.cat([mask.bool(), image], dim=1)[:, None, None, :]
        for block in self.transformer_blocks:
            c, x = block(x, c, temb, img_freqs, txt_freqs, joint)
        return self.proj_out(self.norm_out(x, temb))


def build(cfg):
    return QwenImageTransformer(cfg)


def velocity(model, inputs):
    """ditrl's qwen_image noise_pred: unpacked latents (B, C, H, W), the sigmas."""
    latents = inputs["latents"]
    b, ch, height, width = latents.shape
    h, w = height // 2, width // 2
    packed = latents.view(b, ch, h, 2, w, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w, ch * 4)
    out = model(packed, inputs["cond.encoder_hidden_states"], inputs.get("cond.encoder_hidden_states_mask"),
                inputs["sigmas"], (1, h, w))
    return out.view(b, h, w, -1, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, -1, height, width)
