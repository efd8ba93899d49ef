"""diffusers peer of benchmarks/peer/peer_forward.cpp: the family's real diffusers class.

The model is diffusers' own transformer class for the family
(SD3Transformer2DModel, WanTransformer3DModel, QwenImageTransformer2DModel,
FluxTransformer2DModel, Flux2Transformer2DModel),
built with `from_config` from the same config.json ditrl reads and loaded
with load_state_dict(strict=True) from the same safetensors file (ditrl's
parameter names are diffusers' checkpoint names). It runs in PyTorch eager with
diffusers' default attention (F.scaled_dot_product_attention), times
forward + backward + AdamW step on the same inputs with the same number of
threads, and answers the pipe protocol of benchmarks/peer/peer_harness.hpp.

--precision fp32: fp32 parameters and compute. bf16: fp32 parameters (the
masters AdamW updates) with the forward under torch.autocast(cpu, bf16), the
mixed-precision recipe a PyTorch user picks on one device; the loss is taken
in fp32. --checkpointing turns on diffusers' gradient checkpointing (every
block recomputed in backward, as ditrl's sharded step does).

Inputs file (written by peer_forward.cpp): `latents`, `timesteps`, `sigmas`,
`target` and `cond.<name>` for every conditioning tensor of the family.
"""

import argparse
import contextlib
import json
import os
import sys

import diffusers
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import serve  # noqa: E402

CLASSES = {"sd3": "SD3Transformer2DModel", "wan": "WanTransformer3DModel", "qwen_image": "QwenImageTransformer2DModel",
           "flux": "FluxTransformer2DModel", "flux2": "Flux2Transformer2DModel"}


def sd3_velocity(model, inputs):
    """ditrl's sd3 noise_pred: latents (B, C, H, W), the trajectory timesteps t."""
    return model(hidden_states=inputs["latents"], encoder_hidden_states=inputs["cond.encoder_hidden_states"],
                 pooled_projections=inputs["cond.pooled_projections"], timestep=inputs["timesteps"]).sample


def wan_velocity(model, inputs):
    """ditrl's wan noise_pred: latents (B, C, F, H, W), the trajectory timesteps t."""
    return model(hidden_states=inputs["latents"], timestep=inputs["timesteps"],
                 encoder_hidden_states=inputs["cond.encoder_hidden_states"]).sample


def qwen_image_velocity(model, inputs):
    """ditrl's qwen_image noise_pred: unpacked latents (B, C, H, W), the sigmas; packs 2x2 around the
    forward as QwenImagePipeline does. The all-ones text mask is dropped (as ditrl drops it)."""
    latents = inputs["latents"]
    b, ch, height, width = latents.shape
    h, w = height // 2, width // 2
    packed = latents.view(b, ch, h, 2, w, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w, ch * 4)
    out = model(hidden_states=packed, encoder_hidden_states=inputs["cond.encoder_hidden_states"],
                encoder_hidden_states_mask=None, timestep=inputs["sigmas"], img_shapes=[[(1, h, w)]] * b).sample
    return out.view(b, h, w, -1, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, -1, height, width)


def flux_velocity(model, inputs):
    """ditrl's flux noise_pred: unpacked latents (B, C, H, W), the sigmas; packs 2x2 with FluxPipeline's
    img_ids (0, row, col) and zero txt_ids in the latents' dtype (no guidance embedder in these cases)."""
    latents = inputs["latents"]
    b, ch, height, width = latents.shape
    h, w = height // 2, width // 2
    packed = latents.view(b, ch, h, 2, w, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w, ch * 4)
    img_ids = torch.zeros(h, w, 3)
    img_ids[..., 1] = torch.arange(h)[:, None]
    img_ids[..., 2] = torch.arange(w)[None, :]
    text = inputs["cond.encoder_hidden_states"]
    out = model(hidden_states=packed, encoder_hidden_states=text, pooled_projections=inputs["cond.pooled_projections"],
                timestep=inputs["sigmas"], img_ids=img_ids.reshape(h * w, 3).to(latents.dtype),
                txt_ids=torch.zeros(text.shape[1], 3, dtype=latents.dtype)).sample
    return out.view(b, h, w, -1, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, -1, height, width)


def flux2_velocity(model, inputs):
    """ditrl's flux2 noise_pred: the patchified latents (B, C, h, w), the sigmas; packs them row-major and
    passes the int64 ids as Flux2KleinPipeline does (no guidance embedding in these configs)."""
    latents = inputs["latents"]
    b, ch, h, w = latents.shape
    text_len = inputs["cond.encoder_hidden_states"].shape[1]
    zero = torch.arange(1)
    img_ids = torch.cartesian_prod(zero, torch.arange(h), torch.arange(w), zero).unsqueeze(0).expand(b, -1, -1)
    txt_ids = torch.cartesian_prod(zero, zero, zero, torch.arange(text_len)).unsqueeze(0).expand(b, -1, -1)
    out = model(hidden_states=latents.reshape(b, ch, h * w).permute(0, 2, 1),
                encoder_hidden_states=inputs["cond.encoder_hidden_states"], timestep=inputs["sigmas"],
                img_ids=img_ids, txt_ids=txt_ids).sample
    return out.permute(0, 2, 1).reshape(b, ch, h, w)


VELOCITY = {"sd3": sd3_velocity, "wan": wan_velocity, "qwen_image": qwen_image_velocity, "flux": flux_velocity,
            "flux2": flux2_velocity}


def build(family, config_path, weights_path):
    with open(config_path) as f:
        config = json.load(f)
    expected = CLASSES[family]
    if config.get("_class_name") != expected:
        raise SystemExit(f"{config_path}: _class_name {config.get('_class_name')!r}, expected {expected!r}")
    model = getattr(diffusers, expected).from_config(config)
    model.load_state_dict(load_file(weights_path), strict=True)
    return model.float().train()


def training_step(family, model, inputs, precision, lr, optimizer_scope=contextlib.nullcontext):
    """One forward + backward + AdamW step on `inputs` (its `target` popped) as a closure returning the loss;
    the optimizer step runs inside optimizer_scope()."""
    target = inputs.pop("target")
    velocity = VELOCITY[family]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" \
        else contextlib.nullcontext

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            prediction = velocity(model, inputs)
        loss = F.mse_loss(prediction.float(), target)
        loss.backward()
        with optimizer_scope():
            optimizer.step()
        return loss.item()

    return step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", required=True, choices=sorted(CLASSES))
    parser.add_argument("--config", required=True)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model = build(args.family, args.config, args.weights)
    if args.checkpointing:
        model.enable_gradient_checkpointing()
    serve(model, training_step(args.family, model, load_file(args.inputs), args.precision, args.lr))


if __name__ == "__main__":
    main()
