#!/usr/bin/env python3
"""Export a family's VAE decoder as a TorchScript module: fp32 latents -> uint8 RGB.

The module's forward(latents) takes the final fp32 latents in the family's layout
    sd3 [B, 16, H, W]      qwen_image [B, 16, H, W]      wan [B, 16, F, H, W]      flux [B, 16, H, W]
    flux2 [B, 128, H/2, W/2]   (the 32-channel VAE latent patchified 2x2, as ditrl's sampler holds it)
(the layout tools/export_reward.py documents), undoes the latent normalisation (export_reward's
DiffusersDecode: SD3 x / scaling_factor + shift_factor; Qwen-Image and Wan x * std + mean per
channel; FLUX.2 x * sqrt(bn.running_var + eps) + bn.running_mean per channel, then the 2x2
unpatchify, as Flux2Pipeline does), decodes, and returns what diffusers' image / video post-processing gives as uint8:
    round(255 * clamp(x / 2 + 0.5, 0, 1))  as  [B, H, W, 3] (sd3, qwen_image, flux, flux2) or [B, F, H, W, 3] (wan).
It is what ditrl's `http` reward runs on the rollout's device to send decoded images to a reward
server (docs/reward-server.md), and what `[log] decoder` decodes the preview samples with.

Checked against diffusers' own decode + VaeImageProcessor / VideoProcessor post-processing on tiny
random configs (tests/tools/export_decoder_test.py; max difference in uint8 stated there). The
released VAEs are loaded by the same code (`--vae MODEL_DIR/vae`) but were not run here. A Wan
decoder is traced for `--latent-frames` and refuses other frame counts. LTX is not supported yet.

Usage:
  export_decoder.py --family sd3 --vae models/stable-diffusion-3.5-medium/vae --out decoder_sd3.pt
  export_decoder.py --family wan --vae MODEL_DIR/vae --latent-frames 21 --out decoder_wan.pt
  export_decoder.py --family flux2 --vae MODEL_DIR/vae --out decoder_flux2.pt  # latents [B, 128, H/2, W/2]
  export_decoder.py --family qwen_image --tiny --out tiny_decoder.pt      # seeded tiny VAE (tests)
"""

import argparse
import os
import sys
from typing import List

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_reward import DiffusersDecode, FAMILIES, latent_channels, vae_class  # noqa: E402
from torchscript_compat import math_attention  # noqa: E402

VERSION = "ditrl-export-decoder 1"
LATENT_CHANNELS = 16


def fail(message: str) -> None:
    sys.exit(f"export_decoder.py: {message}")


class Uint8Decoder(torch.nn.Module):
    """DiffusersDecode -> uint8 RGB, channels last, as diffusers' post-processing rounds it."""
    identity: str

    def __init__(self, decode: torch.nn.Module, video: bool, channels: int, latent_frames: int, identity: str):
        super().__init__()
        self.decode = decode
        self.video = video
        self.channels = channels
        self.latent_frames = latent_frames
        self.identity = identity

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        want = 5 if self.video else 4
        if latents.dim() != want or latents.shape[1] != self.channels:
            raise ValueError("latents must be fp32 [B, 16, H, W] (sd3, qwen_image, flux), [B, 128, H/2, W/2] (flux2) "
                             "or [B, 16, F, H, W] (wan), with the channels of the decoder's family")
        if self.video and latents.shape[2] != self.latent_frames:
            raise ValueError("latents have another number of frames than the decoder was exported for "
                             "(export_decoder.py --latent-frames)")
        pixels = (self.decode(latents.float()) / 2.0 + 0.5).clamp(0.0, 1.0)
        rgb = (pixels * 255.0).round().to(torch.uint8)
        return rgb.permute(0, 2, 3, 4, 1) if self.video else rgb.permute(0, 2, 3, 1)


def tiny_vae(family: str):
    """A seeded tiny VAE of the family's diffusers class (no download)."""
    import diffusers
    torch.manual_seed(0)
    if family in ("sd3", "flux"):
        # The released VAE configs' factors: SD3 1.5305 / 0.0609, FLUX.1 0.3611 / 0.1159 (no quant convs).
        flux = family == "flux"
        vae = diffusers.AutoencoderKL(in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS,
                                      down_block_types=("DownEncoderBlock2D",) * 2,
                                      up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16),
                                      layers_per_block=1, norm_num_groups=8,
                                      scaling_factor=0.3611 if flux else 1.5305,
                                      shift_factor=0.1159 if flux else 0.0609, use_quant_conv=not flux,
                                      use_post_quant_conv=not flux)
    elif family == "flux2":
        # The released 32-channel latent; drawn batch-norm statistics so that the de-normalisation shows.
        vae = diffusers.AutoencoderKLFlux2(in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS * 2,
                                           down_block_types=("DownEncoderBlock2D",) * 2,
                                           up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16),
                                           layers_per_block=1, norm_num_groups=8)
        channels = vae.bn.running_mean.numel()
        vae.bn.running_mean.copy_(0.3 * torch.randn(channels))
        vae.bn.running_var.copy_(0.5 + torch.rand(channels))
    else:
        cls = diffusers.AutoencoderKLWan if family == "wan" else diffusers.AutoencoderKLQwenImage
        vae = cls(base_dim=8, z_dim=LATENT_CHANNELS, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False],
                  latents_mean=[0.1 * i for i in range(LATENT_CHANNELS)],
                  latents_std=[1.0 + 0.05 * i for i in range(LATENT_CHANNELS)])
    return vae.eval()


def load_vae(family: str, path: str):
    return vae_class(family).from_pretrained(path, torch_dtype=torch.float32).eval()


def example_latents(family: str, size: int, latent_frames: int) -> torch.Tensor:
    if family == "wan":
        return torch.randn(1, LATENT_CHANNELS, latent_frames, size, size)
    return torch.randn(1, latent_channels(family), size, size)


def export(family: str, vae, latent_frames: int, size: int, identity: str) -> torch.jit.ScriptModule:
    decode = DiffusersDecode(vae, family).eval()
    example = example_latents(family, size, latent_frames)
    with torch.no_grad(), math_attention():
        traced = torch.jit.trace(decode, (example,))
    module = Uint8Decoder(traced, family == "wan", latent_channels(family), latent_frames, f"{identity}; {VERSION}")
    return torch.jit.script(module.eval())


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--family", required=True, choices=FAMILIES)
    parser.add_argument("--vae", help="the family's diffusers VAE folder (MODEL_DIR/vae)")
    parser.add_argument("--tiny", action="store_true", help="a seeded tiny VAE of the family's class (tests)")
    parser.add_argument("--out", required=True, help="TorchScript module to write")
    parser.add_argument("--latent-frames", type=int, default=21,
                        help="wan: latent frames of the rollout (21 for 81 video frames); the traced decoder is "
                             "fixed to it")
    parser.add_argument("--latent-size", type=int, default=0,
                        help="latent height/width of the tracing example (default 64, tiny 8); other sizes run")
    args = parser.parse_args(argv)
    if args.tiny == bool(args.vae):
        fail("give exactly one of --vae MODEL_DIR/vae or --tiny")
    if args.latent_frames < 1 or args.latent_size < 0:
        fail("--latent-frames must be positive and --latent-size non-negative")
    if args.vae and not os.path.isdir(args.vae):
        fail(f"--vae {args.vae}: no such folder (the VAE folder of a diffusers checkpoint)")
    vae = tiny_vae(args.family) if args.tiny else load_vae(args.family, args.vae)
    identity = f"{args.family} VAE decoder {'tiny seed 0' if args.tiny else args.vae}"
    size = args.latent_size or (8 if args.tiny else 64)
    module = export(args.family, vae, args.latent_frames, size, identity)
    module.save(args.out)
    with torch.no_grad():
        rgb = module(example_latents(args.family, size, args.latent_frames))
    print(f"wrote {args.out}: latents {args.family} -> uint8 {list(rgb.shape)}")


if __name__ == "__main__":
    main(sys.argv[1:])
