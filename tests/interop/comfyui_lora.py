"""ditrl's comfyui_lora.safetensors through ComfyUI's own LoRA loader (optional).

No package index carries ComfyUI's `comfy` modules (benchmarks/results/comfyui_lora.md), so this
check runs only where DITRL_COMFYUI names a ComfyUI checkout, and is SKIPPED (exit 77) otherwise.
DITRL_COMFYUI_PYTHON names a Python with ComfyUI's requirements and diffusers (default: this one).

Per family (sd3, wan, qwen_image, flux), on the fixture model (tests/fixtures/<family>):
  1. `ditrl train` a LoRA on every linear layer (targets ["*"], r 4, alpha 12), `ditrl export --merged`;
  2. the fixture weights become a ComfyUI model: ComfyUI's model class from its own detected
     config, with the fixture's sizes where ComfyUI takes the released models' (SD3's block count,
     Wan's heads / freq_dim / text_dim, Qwen-Image's widths, FLUX.1's widths and RoPE axes); SD3's
     diffusers names converted by ComfyUI (convert_diffusers_mmdit), Wan's by diffusers' single-file
     converter, inverted, FLUX.1's into Black Forest Labs' layout (tests/fixtures/bfl_layout.py);
  3. the export goes through comfy.sd.load_lora_for_models at strength 1 (model_lora_keys_unet,
     load_lora, the model patcher's weight patches), and every patched weight is compared with
     ditrl's merged export converted the same way; the diffusers file
     (pytorch_lora_weights.safetensors, no .alpha) through the same loader is the negative
     control: SD3 maps it but at scale 1, Wan maps none of it.
Prints one line per check; exits non-zero on any failure.

Usage: comfyui_lora.py DITRL MPIEXEC OUT_DIR SOURCE_DIR [family ...]
"""

import os
import sys

COMFYUI = os.environ.get("DITRL_COMFYUI", "")
if not COMFYUI:
    print("SKIPPED: DITRL_COMFYUI is not set (a ComfyUI checkout; no package index carries ComfyUI's "
          "loader, see benchmarks/results/comfyui_lora.md)")
    sys.exit(77)
if not os.path.isfile(os.path.join(COMFYUI, "comfy", "lora.py")):
    raise SystemExit(f"DITRL_COMFYUI={COMFYUI} has no comfy/lora.py")
PYTHON = os.environ.get("DITRL_COMFYUI_PYTHON", "")
if PYTHON and not os.environ.get("DITRL_COMFYUI_REEXEC"):
    # A venv's python is a link to the same interpreter: compare the venvs, not the binaries.
    os.environ["DITRL_COMFYUI_REEXEC"] = "1"
    os.execv(PYTHON, [PYTHON] + sys.argv)

import json  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402

import torch  # noqa: E402

import lora_roundtrip as rt  # noqa: E402  (the same arguments; its helpers and checks)

sys.path.insert(0, COMFYUI)
from comfy.cli_args import args  # noqa: E402

args.cpu = True
import comfy.lora  # noqa: E402
import comfy.model_detection  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy.sd  # noqa: E402
import comfy.supported_models  # noqa: E402
import comfy.utils  # noqa: E402

CPU = torch.device("cpu")


class NotLoaded(logging.Handler):
    # comfy.lora.load_lora reports each file key it did not use as a warning.
    def __init__(self):
        super().__init__(logging.WARNING)
        self.keys = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("lora key not loaded: "):
            self.keys.append(message[len("lora key not loaded: "):])


def fixture_sizes(family, config):
    # What ComfyUI's detection takes from the released models rather than from the weights.
    if family == "sd3":
        return {"num_blocks": config["num_layers"]}
    if family == "wan":
        return {"num_heads": config["num_attention_heads"], "freq_dim": config["freq_dim"],
                "text_dim": config["text_dim"]}
    if family == "flux":
        # ComfyUI's Flux patchifies 2x2 itself: its channels are the packed ones / 4.
        heads = config["num_attention_heads"]
        return {"in_channels": config["in_channels"] // 4, "out_channels": config["in_channels"] // 4,
                "hidden_size": heads * config["attention_head_dim"], "num_heads": heads,
                "context_in_dim": config["joint_attention_dim"], "axes_dim": list(config["axes_dims_rope"])}
    return {"patch_size": config["patch_size"], "out_channels": config["out_channels"],
            "attention_head_dim": config["attention_head_dim"], "num_attention_heads": config["num_attention_heads"],
            "joint_attention_dim": config["joint_attention_dim"], "axes_dims_rope": tuple(config["axes_dims_rope"])}


def comfy_model(family, base):
    # `base` in ComfyUI's names -> a ModelPatcher on ComfyUI's model class for the family, and the
    # weights left out: those whose shape ComfyUI fixes otherwise (SD3's per-head qk norms: ComfyUI's
    # MMDiT has 64-wide heads, the fixture 16-wide ones).
    config = json.load(open(os.path.join(rt.FIXTURES, family, "config.json")))
    unet_config = comfy.model_detection.detect_unet_config(base, "")
    unet_config.update(fixture_sizes(family, config))
    cls = {"sd3": comfy.supported_models.SD3, "wan": comfy.supported_models.WAN21_T2V,
           "qwen_image": comfy.supported_models.QwenImage, "flux": comfy.supported_models.Flux}[family]
    model_config = cls(unet_config)
    model_config.set_inference_dtype(torch.float32, None)
    model = model_config.get_model(base, "")
    own = model.diffusion_model.state_dict()
    if set(own) != set(base):
        raise SystemExit(f"{family}: ComfyUI's model and the fixture differ: "
                         f"missing {sorted(set(own) - set(base))[:3]}, unexpected {sorted(set(base) - set(own))[:3]}")
    left_out = {k for k in base if own[k].shape != base[k].shape}
    model.load_model_weights({k: v for k, v in base.items() if k not in left_out}, "")
    return comfy.model_patcher.ModelPatcher(model, load_device=CPU, offload_device=CPU), left_out


def to_comfy_names(family, diffusers_state, native_keys=None):
    if family == "sd3":
        return comfy.model_detection.convert_diffusers_mmdit(dict(diffusers_state), "")
    if family == "qwen_image":
        return dict(diffusers_state)
    if family == "flux":
        # ComfyUI's Flux keeps Black Forest Labs' names: the fixtures' mapping, checked against BFL's
        # own model (tests/fixtures/bfl_layout.py).
        sys.path.insert(0, rt.FIXTURES)
        from bfl_layout import to_bfl
        return to_bfl("flux", diffusers_state)
    # Wan: diffusers' single-file converter (Wan checkpoint names -> diffusers), inverted.
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
    probe = {k: torch.tensor(float(i)) for i, k in enumerate(native_keys)}
    to_native = {d: native_keys[int(v.item())] for d, v in convert_wan_transformer_to_diffusers(probe).items()}
    return {to_native[k]: v for k, v in diffusers_state.items()}


def wan_native_keys():
    # The Wan model's own names, from ComfyUI's model class built on a config of the fixture's sizes.
    config = json.load(open(os.path.join(rt.FIXTURES, "wan", "config.json")))
    import comfy.ldm.wan.model as wan
    import comfy.ops
    dim = config["num_attention_heads"] * config["attention_head_dim"]
    with torch.device("meta"):
        model = wan.WanModel(model_type="t2v", patch_size=tuple(config["patch_size"]), in_dim=config["in_channels"],
                             dim=dim, ffn_dim=config["ffn_dim"], freq_dim=config["freq_dim"],
                             text_dim=config["text_dim"], out_dim=config["out_channels"],
                             num_heads=config["num_attention_heads"], num_layers=config["num_layers"],
                             qk_norm=True, cross_attn_norm=True, eps=config["eps"],
                             operations=comfy.ops.disable_weight_init)
    return list(model.state_dict())


def patched_weights(model, lora_file):
    lora = comfy.utils.load_torch_file(lora_file, safe_load=True)
    handler = NotLoaded()
    root = logging.getLogger()
    others, root.handlers = root.handlers, [handler]  # counted here, not printed one by one
    try:
        patched, _ = comfy.sd.load_lora_for_models(model, None, lora, 1.0, 0.0)
    finally:
        root.handlers = others
    patched.patch_model(device_to=CPU)
    weights = {k: v.detach().clone() for k, v in patched.model.diffusion_model.state_dict().items()}
    patched.unpatch_model(device_to=CPU)
    return weights, len(lora), len(handler.keys), {k[len("diffusion_model."):] for k in patched.patches}


def comfyui_family(family, work):
    run_dir = os.path.join(work, "lora_run")
    # Every linear layer: each of the family's names goes through ComfyUI's key map.
    deck = rt.write_deck(os.path.join(work, "lora.toml"), family, run_dir, lora='targets = ["*"]\n')
    rt.ditrl_mpi(2, f"train {deck}")
    export = os.path.join(work, "export")
    print(rt.ditrl(f"export {os.path.join(run_dir, 'checkpoints', 'step-1.h5')} --out {export} --merged").strip())

    state = rt.load_file(rt.base_weights(family))
    native = wan_native_keys() if family == "wan" else None
    base = to_comfy_names(family, state, native)
    merged = to_comfy_names(family, rt.load_folder(os.path.join(export, "merged")), native)
    model, left_out = comfy_model(family, base)
    compared = [k for k in merged if k not in left_out]

    weights, keys, not_loaded, patched = patched_weights(model, os.path.join(export, "comfyui_lora.safetensors"))
    changed = {k for k in merged if not torch.equal(merged[k], base[k])}
    worst = max(rt.max_diff(weights[k], merged[k]) for k in compared)
    bitwise = all(torch.equal(weights[k], merged[k]) for k in compared)
    rt.check(f"{family}: ComfyUI load_lora_for_models(comfyui_lora.safetensors) == ditrl's merge",
             not_loaded == 0 and changed <= patched and not changed & left_out and worst <= 1e-6,
             f"{keys - not_loaded} of {keys} keys loaded, {len(patched)} weights patched ({len(changed)} changed by "
             f"the merge); max |ComfyUI - ditrl merge| over {len(compared)} weights {worst:.1e} (bound 1e-6), "
             f"bitwise equal: {bitwise}; {len(left_out)} unadapted weights of other shapes in ComfyUI left out")

    weights, keys, not_loaded, _ = patched_weights(model, os.path.join(export, "pytorch_lora_weights.safetensors"))
    plain = max(rt.max_diff(weights[k], merged[k]) for k in compared)
    rt.check(f"{family}: negative control: the diffusers file through ComfyUI's loader is not ditrl's merge",
             plain > 1e-4, f"{keys - not_loaded} of {keys} keys loaded; max |ComfyUI - ditrl merge| {plain:.1e}")


def main():
    families = [f for f in rt.FAMILIES if f != "ltx"]
    if not families:
        print("SKIPPED: LTX-2's ComfyUI file is ltx_lora.safetensors, checked with ltx_core's loader by "
              "interop.lora_roundtrip.ltx")
        sys.exit(77)
    print(f"ComfyUI: {COMFYUI}")
    for family in families:
        work = os.path.join(rt.OUT, family)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work, exist_ok=True)
        print(f"== {family}", flush=True)
        comfyui_family(family, work)
    print(f"{len(rt.failures)} failed" if rt.failures else "all ComfyUI checks passed")
    sys.exit(1 if rt.failures else 0)


if __name__ == "__main__":
    main()
