"""Tracing for the LibTorch that runs the module: Debian's LibTorch 1.13 (ditrl's CPU build) has no
`aten::scaled_dot_product_attention`, which torch 2.x models (transformers' "sdpa" attention, the
diffusers VAEs' attention blocks) call. Inside `math_attention()` that function is the same
attention written in matmul/softmax ops (the "math" path), so a trace records ops both LibTorch
versions have. The exported modules then run in ditrl built against LibTorch 1.13 or 2.x.
"""

import contextlib
import math

import torch
import torch.nn.functional as F


def sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise ValueError("math_attention: dropout in an exported (eval) module")
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(groups, -3), value.repeat_interleave(groups, -3)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    weights = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
        weights = weights.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            weights = weights.masked_fill(~attn_mask, float("-inf"))
        else:
            weights = weights + attn_mask
    return torch.matmul(torch.softmax(weights.float(), dim=-1).to(query.dtype), value)


@contextlib.contextmanager
def math_attention():
    original = getattr(F, "scaled_dot_product_attention", None)  # torch 1.13 has none
    F.scaled_dot_product_attention = sdpa_math
    try:
        yield
    finally:
        if original is None:
            del F.scaled_dot_product_attention
        else:
            F.scaled_dot_product_attention = original
