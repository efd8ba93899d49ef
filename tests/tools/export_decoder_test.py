"""tools/export_decoder.py against diffusers' own decode and post-processing.

For each family (sd3, qwen_image, wan, flux, flux2) a seeded tiny VAE of the family's diffusers class is saved as a
checkpoint folder, exported with `export_decoder.py --vae FOLDER`, reloaded with torch.jit.load and
run on latents of another batch size and spatial size than the tracing example. The reference is
what a diffusers pipeline does with the same latents: the pipeline's de-normalisation (SD3: x /
scaling_factor + shift_factor; Wan, Qwen-Image: x * latents_std + latents_mean; FLUX.2: the
[B, 128, h, w] patchified latent x * sqrt(bn.running_var + eps) + bn.running_mean, then
Flux2Pipeline._unpatchify_latents), vae.decode, then
VaeImageProcessor.postprocess / VideoProcessor.postprocess_video to [0, 1] and numpy_to_pil's
round(255 x) to uint8. Pass: max |exported - diffusers| <= 1 in uint8 (measured: 0 on all five,
fp32 on the CPU). Negative control: the decode without de-normalisation differs by more than 1.
The module refuses latents of another rank, (wan) another frame count and (flux2) another channel count.
Usage: export_decoder_test.py SOURCE_DIR WORK_DIR
"""

import os
import sys
import time

import numpy as np
import torch

SOURCE, WORK = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(SOURCE, "tools"))
import export_decoder  # noqa: E402

failures = []


def check(name, ok, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def diffusers_uint8(family, vae, latents, denormalise=True):
    from diffusers.image_processor import VaeImageProcessor
    from diffusers.video_processor import VideoProcessor
    cfg = vae.config
    with torch.no_grad():
        if family == "flux2":
            from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline
            mean = vae.bn.running_mean.view(1, -1, 1, 1)
            std = (vae.bn.running_var.view(1, -1, 1, 1) + cfg.batch_norm_eps).sqrt()
            z = Flux2Pipeline._unpatchify_latents(latents * std + mean if denormalise else latents)
            images = VaeImageProcessor().postprocess(vae.decode(z).sample, output_type="np")
        elif family in ("sd3", "flux"):
            z = latents / cfg.scaling_factor + cfg.shift_factor if denormalise else latents
            images = VaeImageProcessor().postprocess(vae.decode(z).sample, output_type="np")
        else:
            mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1)
            std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1)
            z = latents[:, :, None] if family == "qwen_image" else latents
            z = z * std + mean if denormalise else z
            decoded = vae.decode(z).sample
            if family == "qwen_image":
                images = VaeImageProcessor().postprocess(decoded[:, :, 0], output_type="np")
            else:
                images = VideoProcessor().postprocess_video(decoded, output_type="np")
    return (np.asarray(images) * 255).round().astype("uint8")


def main():
    os.makedirs(WORK, exist_ok=True)
    torch.manual_seed(1)
    for family in ("sd3", "qwen_image", "wan", "flux", "flux2"):
        start = time.time()
        folder = os.path.join(WORK, f"vae_{family}")
        vae = export_decoder.tiny_vae(family)
        with torch.no_grad():  # every weight drawn, so each one shows in the output
            for p in vae.parameters():
                p.add_(0.05 * torch.randn_like(p))
        vae.save_pretrained(folder)
        out = os.path.join(WORK, f"decoder_{family}.pt")
        export_decoder.main(["--family", family, "--vae", folder, "--out", out, "--latent-frames", "2",
                             "--latent-size", "4"])
        module = torch.jit.load(out)
        shape = {"wan": (3, 16, 2, 6, 10), "flux2": (3, 128, 3, 5)}.get(family, (3, 16, 6, 10))
        latents = torch.randn(shape)
        with torch.no_grad():
            got = module(latents).numpy()
        want = diffusers_uint8(family, vae, latents)
        layout = "[B, F, H, W, 3]" if family == "wan" else "[B, H, W, 3]"
        check(f"{family} shape {layout}", got.shape == want.shape and got.dtype == np.uint8,
              f"exported {got.shape} {got.dtype}, diffusers {want.shape}")
        if got.shape == want.shape:
            diff = int(np.abs(got.astype(int) - want.astype(int)).max())
            check(f"{family} max |exported - diffusers| <= 1 (uint8)", diff <= 1, f"{diff}")
            raw = diffusers_uint8(family, vae, latents, denormalise=False)
            control = int(np.abs(got.astype(int) - raw.astype(int)).max())
            check(f"{family} negative control: without de-normalisation differs by > 1", control > 1, f"{control}")
        try:
            module(latents[:, :, 0] if family == "wan" else latents[:, :, None])
            check(f"{family} refuses latents of another rank", False, "accepted")
        except Exception as e:  # TorchScript raises its own wrapper of the module's ValueError
            check(f"{family} refuses latents of another rank", "latents must be" in str(e), str(e).splitlines()[-1])
        if family == "flux2":  # an unpatchified (VAE-layout) latent is not FLUX.2's sampler latent
            try:
                module(torch.randn(1, 32, 6, 10))
                check("flux2 refuses 32-channel latents", False, "accepted")
            except Exception as e:
                check("flux2 refuses 32-channel latents", "[B, 128, H/2, W/2]" in str(e), str(e).splitlines()[-1])
        if family == "wan":
            try:
                module(torch.randn(1, 16, 3, 6, 10))
                check("wan refuses another frame count", False, "accepted")
            except Exception as e:
                check("wan refuses another frame count", "--latent-frames" in str(e), str(e).splitlines()[-1])
        print(f"     {family}: {time.time() - start:.1f} s", flush=True)
    print(f"{'FAILED: ' + ', '.join(failures) if failures else 'all checks passed'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
