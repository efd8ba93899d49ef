"""The PyTorch-eager side of the GPU training-step benchmark (issue 17 item 11):
diffusers' own SD3Transformer2DModel (SD3.5-medium sized) or WanTransformer3DModel
(Wan2.1-1.3B sized) at realistic token counts, one forward + backward + AdamW
step on fp32 master parameters with bf16 autocast compute and only the chosen
SDPA backend enabled (flash on CUDA; math on the CPU), and the model FLOPs of
that step counted by torch.utils.flop_counter on the step itself. MFU is the
model FLOP/s over a bf16 matmul ceiling measured on the same device in the
same run. Writes one JSON object (and prints it).

    python diffusers_step.py --model sd3.5-medium --size full --device cuda --out sd3.json
    python diffusers_step.py --model wan2.1-1.3b --size tiny --device cpu --out wan.json   (CI: runs here)

ditrl's side of the comparison is benchmarks/gpu/gpu_step.cpp (bench_gpu_step);
benchmarks/gpu/run.sh runs both in alternating rounds.
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

try:
    import diffusers
    from diffusers import SD3Transformer2DModel, WanTransformer3DModel
except ImportError as e:  # the kit carries the wheel; without it there is no peer
    print(f"SKIPPED: diffusers not importable ({e})")
    sys.exit(77)

# full: the real architectures and token counts; tiny: the same code at a size
# a 2-core CPU runs in seconds (so CI runs this script).
MODELS = {
    "sd3.5-medium": {
        "full": dict(
            config=dict(sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
                        num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
                        pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=384,
                        dual_attention_layers=tuple(range(13)), qk_norm="rms_norm"),
            latent=(1, 16, 128, 128), text_tokens=333),  # 1024^2 image: 64 x 64 = 4096 image tokens + 77 + 256 text
        "tiny": dict(
            config=dict(sample_size=16, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=16,
                        num_attention_heads=2, joint_attention_dim=64, caption_projection_dim=32,
                        pooled_projection_dim=32, out_channels=16, pos_embed_max_size=16,
                        dual_attention_layers=(0,), qk_norm="rms_norm"),
            latent=(1, 16, 16, 16), text_tokens=12),
    },
    "wan2.1-1.3b": {
        "full": dict(
            config=dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                        out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30,
                        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6),
            latent=(1, 16, 9, 60, 104), text_tokens=512),  # 480 x 832 x 33 frames: 9 x 30 x 52 = 14040 tokens
        "tiny": dict(
            config=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16,
                        out_channels=16, text_dim=64, freq_dim=32, ffn_dim=64, num_layers=2,
                        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6),
            latent=(1, 16, 3, 8, 8), text_tokens=12),
    },
}


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_ceiling(device, n, repeats):
    """bf16 n x n x n matmul FLOP/s on `device`: the best of `repeats` timed products after warm-up."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def build(model_name, size, batch, device):
    spec = MODELS[model_name][size]
    torch.manual_seed(0)
    cls = SD3Transformer2DModel if model_name.startswith("sd3") else WanTransformer3DModel
    with torch.device(device):  # initialised where it runs (a 2.2B-parameter CPU init takes a minute)
        model = cls(**spec["config"]).float()  # fp32 masters
    latent = torch.randn((batch, *spec["latent"][1:]), device=device)
    if cls is SD3Transformer2DModel:
        cond = dict(encoder_hidden_states=torch.randn(batch, spec["text_tokens"], spec["config"]["joint_attention_dim"],
                                                      device=device),
                    pooled_projections=torch.randn(batch, spec["config"]["pooled_projection_dim"], device=device))
    else:
        cond = dict(encoder_hidden_states=torch.randn(batch, spec["text_tokens"], spec["config"]["text_dim"],
                                                      device=device))
    timestep = torch.full((batch,), 500.0, device=device)
    target = torch.randn_like(latent)
    p = spec["config"]["patch_size"]
    patch = p if isinstance(p, tuple) else (p, p)
    image_tokens = 1
    for dim, step in zip(spec["latent"][2:][::-1], patch[::-1]):
        image_tokens *= dim // step
    return model, latent, cond, timestep, target, image_tokens, spec["text_tokens"]


def train_step(model, optimizer, latent, cond, timestep, target, device):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        out = model(hidden_states=latent, timestep=timestep, return_dict=False, **cond)[0]
    loss = F.mse_loss(out.float(), target)
    loss.backward()
    optimizer.step()
    return loss.detach()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--size", choices=["full", "tiny"], default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=1, help="samples per step, each at the model's token count")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("diffusers_step.py: --device cuda but torch sees no GPU")
    if device.type == "cuda":  # what a training run uses: no TF32 shortcuts in the fp32 parts
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    backend = SDPBackend.FLASH_ATTENTION if device.type == "cuda" else SDPBackend.MATH

    model, latent, cond, timestep, target, image_tokens, text_tokens = build(args.model, args.size, args.batch, device)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    with sdpa_kernel([backend]):  # only this backend: a shape it cannot take is an error, not a fallback
        for _ in range(args.warmup):
            train_step(model, optimizer, latent, cond, timestep, target, device)
        with FlopCounterMode(display=False) as counter:
            train_step(model, optimizer, latent, cond, timestep, target, device)
        flops = counter.get_total_flops()
        times, losses = [], []
        for _ in range(args.steps):
            synchronize(device)
            start = time.perf_counter()
            losses.append(train_step(model, optimizer, latent, cond, timestep, target, device))
            synchronize(device)
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    ceiling = matmul_ceiling(device, 8192 if device.type == "cuda" else 1024, 10 if device.type == "cuda" else 3)
    result = {
        "side": f"PyTorch {torch.__version__} eager, diffusers {diffusers.__version__} {type(model).__name__}",
        "model": args.model, "size": args.size, "device": torch.cuda.get_device_name(device)
        if device.type == "cuda" else "cpu", "params": params, "batch": args.batch, "image_tokens": image_tokens,
        "text_tokens": text_tokens, "attention": backend.name, "precision": "fp32 masters, bf16 autocast, AdamW"
        + (" (fused)" if device.type == "cuda" else ""), "steps": args.steps, "step_s_median": step_s,
        "step_s_min": min(times), "model_flops_per_step": flops, "model_tflops": flops / step_s / 1e12,
        "matmul_ceiling_tflops": ceiling / 1e12, "mfu": flops / step_s / ceiling,
        "loss_first": float(losses[0]), "loss_last": float(losses[-1]),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    if not all(torch.isfinite(l) for l in losses) or flops <= 0:
        sys.exit(f"diffusers_step.py: bad measurement {result}")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
