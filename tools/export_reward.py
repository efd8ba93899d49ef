#!/usr/bin/env python3
"""Export a reward scorer on VAE-decoded latents as the TorchScript module ditrl loads.

ditrl's `[reward] kind = "torchscript"` loads MODULE.pt and calls
    forward(latents: Tensor, prompt_index: Tensor) -> Tensor          # [N] fp32 rewards
with `latents` the final fp32 latents of the rollout in the family's layout
    sd3         [N, 16, H, W]          qwen_image  [N, 16, H, W]      wan  [N, 16, F, H, W]
    flux        [N, 16, H, W]          flux2 [N, 128, H/2, W/2]
(flux2: the sampler's latent, the 32-channel VAE latent of an H x W grid patchified 2x2, channel
4c + 2dy + dx holding VAE channel c at row 2y+dy, column 2x+dx; docs/families.md §10)
and `prompt_index` [N] int64 the row of each sample's prompt in the deck's prompt dataset
(`[data] prompts`, written by `ditrl encode-prompts` from the same prompt list).

The exported module holds, as buffers:
  * the family's VAE decoder with its latent de-normalisation (SD3: x / 1.5305 + 0.0609;
    FLUX.1: x / 0.3611 + 0.1159 (its VAE config's scaling and shift factors);
    FLUX.2: x * sqrt(bn.running_var + eps) + bn.running_mean per patchified channel, then the
    2x2 unpatchify;
    Qwen-Image and Wan: x * std + mean per channel; video: the frames are decoded and
    `--frames` of them scored, the mean taken),
  * the scorer's image preprocessing (resize to its size, centre crop, CLIP mean/std) written in
    torch ops so that it scripts, and its traced head (tools/scorers.py: `--scorer` pickscore,
    hpsv2, clip, aesthetic or imagereward; ocr is served by tools/reward_server.py only),
  * the prompts' text features, precomputed here from the prompt list in the order of the prompt
    dataset and indexed by prompt_index (no tokenizer in TorchScript).
PickScore: reward = logit_scale * <normalised image embedding, normalised text embedding>
(PickScore_v1 scoring, as in flow_grpo's pickscore_scorer.py); the other scorers' formulas are in
tools/scorers.py.

Status: the real export path runs in ditrl's tests on the real classes (diffusers AutoencoderKL /
AutoencoderKLWan / AutoencoderKLQwenImage / AutoencoderKLFlux2, transformers CLIPModel + CLIPProcessor) built from tiny
configs with random weights (tests/interop/export_tools.py): the rewards ditrl computes with the
exported module equal the eager Python modules' within 1e-7. The preprocessing is the tool's own
torch version of CLIPProcessor's (bicubic resize, centre crop, normalise), not the PIL one. The
released PickScore_v1 / CLIP-H / VAE checkpoints have NOT been run (none on the development
machine). A Wan decoder is traced for --latent-frames and refuses other frame counts.
`--tiny` exports the same wrapper around a seeded tiny decoder and image tower
(tests/unit/test_export_tools.cpp).

Usage:
  export_reward.py --family sd3 --vae MODEL_DIR/vae --pickscore yuvalkirstain/PickScore_v1 \
      --processor laion/CLIP-ViT-H-14-laion2B-s32B-b79K --prompts prompts.txt --out pickscore_sd3.pt
  export_reward.py --family sd3 --vae MODEL_DIR/vae --scorer hpsv2 --model HPS_v2.1_compressed.pt \
      --prompts prompts.txt --out hpsv2_sd3.pt
  export_reward.py --family wan --vae MODEL_DIR/vae --scorer aesthetic \
      --model shunk031/aesthetics-predictor-v2-sac-logos-ava1-l14-linearMSE \
      --processor openai/clip-vit-large-patch14 --frames 3 --prompts prompts.txt --out aesthetic_wan.pt
  export_reward.py --family sd3 --tiny --prompts prompts.txt --out tiny_reward.pt
prompts.txt: one prompt per line, the same list (same order) that was tokenized and encoded
for `[data] prompts`. The number of prompts is stored in the module and checked per call.
"""

import argparse
import sys
from typing import List

import torch
import torch.nn.functional as F

import scorers
from torchscript_compat import math_attention

VERSION = "ditrl-export-reward 3"
FAMILIES = ("sd3", "qwen_image", "wan", "flux", "flux2")
# FLUX.2's sampler latent is its 32-channel VAE latent patchified 2x2; the others hand over the VAE latent.
LATENT_CHANNELS = {"flux2": 128}
PICKSCORE_PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"


def fail(message: str) -> None:
    sys.exit(f"export_reward.py: {message}")


class ScorerReward(torch.nn.Module):
    """latents -> decoded RGB in [0, 1] -> the scorer's preprocessing and head, against the
    precomputed text features of each sample's prompt; video frames are scored and averaged."""
    identity: str

    def __init__(self, decode, head, text_features: torch.Tensor, video: bool, frames: int, size: int,
                 identity: str, latent_frames: int = 0):
        super().__init__()
        self.decode = decode
        self.head = head
        self.preprocess = torch.jit.script(scorers.ClipPreprocess(size))
        self.register_buffer("text_features", text_features.float())
        self.video = video
        self.frames = frames
        self.identity = identity
        self.latent_frames = latent_frames

    def forward(self, latents: torch.Tensor, prompt_index: torch.Tensor) -> torch.Tensor:
        if prompt_index.numel() != latents.shape[0]:
            raise ValueError("prompt_index must have one entry per latent")
        if bool((prompt_index < 0).any()) or bool((prompt_index >= self.text_features.shape[0]).any()):
            raise ValueError("prompt_index out of range of the exported prompt list")
        # A traced video decoder unrolls its per-frame loop for the frame count it was traced with.
        if self.video and self.latent_frames > 0 and latents.shape[2] != self.latent_frames:
            raise ValueError("latents have another number of frames than the decoder was exported for "
                             "(export_reward.py --latent-frames)")
        pixels = (self.decode(latents) * 0.5 + 0.5).clamp(0.0, 1.0)  # [N, 3, (F,) H, W]
        n, per_sample = pixels.shape[0], 1
        if self.video:
            f = pixels.shape[2]
            picks = torch.linspace(0, f - 1, min(self.frames, f)).round().long()
            pixels = pixels.index_select(2, picks).transpose(1, 2).reshape(-1, 3, pixels.shape[3], pixels.shape[4])
            per_sample = picks.numel()
        text = self.text_features.index_select(0, prompt_index.long()).repeat_interleave(per_sample, 0)
        return self.head(self.preprocess(pixels), text).view(n, per_sample).mean(1)


class DiffusersDecode(torch.nn.Module):
    """The family's VAE decoder with its latent de-normalisation, in fp32."""

    def __init__(self, vae, family: str):
        super().__init__()
        self.vae = vae
        self.family = family
        cfg = vae.config
        if family == "flux2":  # the pipeline de-normalises with the VAE's batch-norm statistics
            self.register_buffer("scale", (vae.bn.running_var + cfg.batch_norm_eps).sqrt().view(1, -1, 1, 1))
            self.register_buffer("shift", vae.bn.running_mean.clone().view(1, -1, 1, 1))
        elif family in ("sd3", "flux"):
            self.register_buffer("scale", torch.tensor(1.0 / cfg.scaling_factor))
            self.register_buffer("shift", torch.tensor(cfg.shift_factor))
        else:
            self.register_buffer("scale", torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1))
            self.register_buffer("shift", torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1))

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        if self.family == "qwen_image":
            images = self.vae.decode(latents[:, :, None] * self.scale + self.shift, return_dict=False)[0]
            return images[:, :, 0]
        if self.family == "wan":
            return self.vae.decode(latents * self.scale + self.shift, return_dict=False)[0]
        if self.family == "flux2":
            return self.vae.decode(unpatchify_2x2(latents * self.scale + self.shift), return_dict=False)[0]
        return self.vae.decode(latents * self.scale + self.shift, return_dict=False)[0]


def unpatchify_2x2(latents: torch.Tensor) -> torch.Tensor:
    """[B, 4C, h, w] -> [B, C, 2h, 2w], channel 4c + 2dy + dx to pixel (2y + dy, 2x + dx) of channel c."""
    b, c4, h, w = latents.shape
    blocks = latents.reshape(b, c4 // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)
    return blocks.reshape(b, c4 // 4, 2 * h, 2 * w)


def vae_class(family: str):
    import diffusers
    return {"sd3": diffusers.AutoencoderKL, "qwen_image": diffusers.AutoencoderKLQwenImage,
            "wan": diffusers.AutoencoderKLWan, "flux": diffusers.AutoencoderKL,
            "flux2": diffusers.AutoencoderKLFlux2}[family]


def real_parts(args: argparse.Namespace, prompts: List[str]):
    try:
        import diffusers  # noqa: F401
    except ImportError:
        fail("the real export needs `transformers` and `diffusers` (and the checkpoints)")
    vae = vae_class(args.family).from_pretrained(args.vae, torch_dtype=torch.float32).eval()
    decode = DiffusersDecode(vae, args.family)
    model = args.model or (args.pickscore if args.scorer == "pickscore" else None)
    processor = args.processor or (PICKSCORE_PROCESSOR if args.scorer == "pickscore" else None)
    try:
        scorer = scorers.load_scorer(args.scorer, model, processor, "cpu", args.arch)
    except ValueError as e:
        fail(str(e))
    with torch.no_grad():
        text = scorer.encode_prompts(prompts)
    return decode, scorer.head, text, scorer.size, f"{scorer.identity} on {args.family} VAE {args.vae}"


class TinyDecode(torch.nn.Module):
    """Seeded stand-in for a VAE decoder: a 1x1 conv to RGB and x4 nearest upsampling."""

    def __init__(self, video: bool, channels: int):
        super().__init__()
        self.video = video
        self.to_rgb = torch.nn.Conv3d(channels, 3, 1) if video else torch.nn.Conv2d(channels, 3, 1)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.to_rgb(latents))
        scale = [1.0, 4.0, 4.0] if self.video else [4.0, 4.0]
        return F.interpolate(x, scale_factor=scale, mode="nearest")


class TinyHead(torch.nn.Module):
    """Seeded stand-in for a CLIP image tower: scale * cos(tower(pixels), text)."""

    def __init__(self, size: int):
        super().__init__()
        self.tower = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 4, stride=4), torch.nn.Flatten(),
                                         torch.nn.Linear(8 * (size // 4) ** 2, 16))

    def forward(self, pixels: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        return 100.0 * (F.normalize(self.tower(pixels), dim=-1) * text).sum(-1)


def tiny_parts(args: argparse.Namespace, prompts: List[str]):
    torch.manual_seed(0)
    head = TinyHead(args.size)
    text = F.normalize(torch.randn(len(prompts), 16), dim=-1)
    return TinyDecode(args.family == "wan", latent_channels(args.family)), head, text, args.size, f"tiny-{args.scorer}-{args.family} seed 0"


def latent_channels(family: str) -> int:
    return LATENT_CHANNELS.get(family, 16)


def example_latents(family: str, h: int, latent_frames: int) -> torch.Tensor:
    c = latent_channels(family)
    return torch.randn(2, c, latent_frames, h, h) if family == "wan" else torch.randn(2, c, h, h)


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--family", required=True, choices=FAMILIES)
    parser.add_argument("--prompts", required=True, help="prompt list, one per line, in dataset order")
    parser.add_argument("--out", required=True, help="TorchScript module to write")
    parser.add_argument("--tiny", action="store_true", help="seeded tiny decoder and image tower (tests)")
    parser.add_argument("--vae", help="the family's diffusers VAE folder (MODEL_DIR/vae)")
    parser.add_argument("--scorer", choices=scorers.TORCH_SCORERS, default="pickscore")
    parser.add_argument("--model", help="the scorer's checkpoint (tools/scorers.py; pickscore: --pickscore)")
    parser.add_argument("--pickscore", default="yuvalkirstain/PickScore_v1", help="pickscore: the CLIPModel")
    parser.add_argument("--processor", help=f"CLIP processor (pickscore default {PICKSCORE_PROCESSOR}; "
                                            "others: --model)")
    parser.add_argument("--arch", default="ViT-H-14", help="hpsv2: open_clip model name or JSON config")
    parser.add_argument("--frames", type=int, default=3, help="video frames scored per sample (wan)")
    parser.add_argument("--latent-frames", type=int, default=21,
                        help="wan: latent frames of the rollout (rollout.frames; 21 for 81 video frames); the traced "
                             "decoder is fixed to it and refuses others")
    parser.add_argument("--latent-size", type=int, default=0,
                        help="latent height/width of the tracing example (default 64, --tiny 8); other sizes run")
    parser.add_argument("--size", type=int, default=224,
                        help="--tiny: image tower input size (real scorers: their processor's crop size)")
    args = parser.parse_args(argv)
    if args.tiny == bool(args.vae):
        fail("give exactly one of --vae MODEL_DIR/vae or --tiny")
    if args.frames < 1 or args.size < 1 or args.latent_frames < 1 or args.latent_size < 0:
        fail("--frames, --latent-frames and --size must be positive, --latent-size non-negative")
    with open(args.prompts, encoding="utf-8") as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        fail(f"{args.prompts}: no prompts (one per line)")

    decode, head, text, size, identity = (tiny_parts if args.tiny else real_parts)(args, prompts)
    latent_frames = args.latent_frames if not args.tiny else 1
    example = example_latents(args.family, args.latent_size or (8 if args.tiny else 64), latent_frames)
    with torch.no_grad(), math_attention():
        decode = torch.jit.trace(decode.eval(), (example,))
        head = torch.jit.trace(head.eval(), (torch.zeros(example.shape[0], 3, size, size), text[:1].expand(
            example.shape[0], *text.shape[1:]).contiguous()))
    reward = ScorerReward(decode, head, text, args.family == "wan", args.frames, size,
                          f"{identity}; {len(prompts)} prompts; {VERSION}",
                          latent_frames if args.family == "wan" and not args.tiny else 0)
    module = torch.jit.script(reward.eval())
    module.save(args.out)
    with torch.no_grad():
        scores = module(example, torch.zeros(example.shape[0], dtype=torch.long))
    print(f"wrote {args.out}: {len(prompts)} prompts, example rewards {scores.tolist()}")


if __name__ == "__main__":
    main(sys.argv[1:])
