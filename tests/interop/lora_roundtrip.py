"""ditrl's exports read by the real diffusers / PEFT / ltx_core code, and their files read by ditrl.

Per family, on the fixture model (tests/fixtures/<family>: the reference config and weights under
the real checkpoint names) and its case_0 inputs:
  1. `ditrl train` a LoRA (2 ranks, fp32), `ditrl export --merged`;
  2. the reference forward with the exported adapter, loaded by PEFT (PeftModel.from_pretrained)
     and by diffusers (pipe.load_lora_weights, and transformer.load_lora_adapter as docs/user-guide.md
     gives it) -- for LTX-2 fused by ltx_core's LoRA loader -- and the merged folder
     (from_pretrained, strict), each equal to `ditrl forward --checkpoint` within fp32 noise; the
     adapter's own effect is checked to be far above that noise; adapter_config.json names no
     local path;
  2b. comfyui_lora.safetensors as ComfyUI's LoraLoader reads it (its keys where ComfyUI's key map
     looks, an .alpha per module, W + (alpha/r) B A equal to the merged export; a file without
     .alpha is shown to fail that check); Wan and Qwen-Image: diffusers' own converters of those
     layouts load it to ditrl's forward. ComfyUI's own loader: tests/interop/comfyui_lora.py.
     FLUX.2's file is on Black Forest Labs' fused modules (lora_B pre-scaled, no .alpha): its patch
     on the fixture's BFL layout equals the merged export's, and diffusers' Flux2 loader reads it;
  3. a LoRA made by PEFT/diffusers on the reference model (random factors, alpha != r), saved by
     diffusers' save_lora_weights and by PEFT's save_pretrained: `ditrl forward --lora` equals the
     reference forward with it, and `ditrl train` with model.lora.weights starts from it;
  4. a full fine-tune exported sharded: from_pretrained and load_state_dict(strict=True) take it,
     and its forward equals `ditrl forward --checkpoint` (written by 1 rank).
Prints one line per check with the measured max abs difference; exits non-zero on any failure.

Usage: lora_roundtrip.py DITRL MPIEXEC OUT_DIR SOURCE_DIR [family ...]
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import warnings

import torch
from safetensors.torch import load_file

warnings.filterwarnings("ignore")
torch.manual_seed(0)
torch.set_num_threads(1)

DITRL, MPIEXEC, OUT, SOURCE = sys.argv[1:5]
FAMILIES = sys.argv[5:] or ["sd3", "wan", "qwen_image", "ltx", "flux", "flux2"]
FIXTURES = os.path.join(SOURCE, "tests", "fixtures")
failures = []


def check(name, ok, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def run(cmd):
    start = time.time()
    r = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout[-6000:])
        raise SystemExit(f"command failed ({r.returncode}): {cmd}")
    print(f"     ({time.time() - start:.1f} s) {cmd[:160]}", flush=True)
    return r.stdout


def ditrl(args):
    return run(f"{shlex.quote(DITRL)} {args}")


def ditrl_mpi(ranks, args):
    return run(f"timeout 600 {MPIEXEC} -np {ranks} {shlex.quote(DITRL)} {args}")


# ------------------------------------------------------------------ the families

def lora_targets(family):
    # What the PEFT/diffusers-made adapter of step 3 adapts (suffix names, as PEFT matches them).
    return {"sd3": ["to_q", "to_k", "to_v", "add_q_proj"], "wan": ["to_q", "to_v", "ffn.net.0.proj"],
            "qwen_image": ["to_q", "to_k", "add_v_proj"], "ltx": ["to_q", "to_k", "to_v"],
            "flux": ["to_q", "add_v_proj", "proj_mlp"],
            "flux2": ["to_q", "add_k_proj", "ff.linear_in", "to_qkv_mlp_proj"]}[family]


def diffusers_model(family, state_dict):
    import diffusers
    config = json.load(open(os.path.join(FIXTURES, family, "config.json")))
    cls = {"sd3": diffusers.SD3Transformer2DModel, "wan": diffusers.WanTransformer3DModel,
           "qwen_image": diffusers.QwenImageTransformer2DModel, "flux": diffusers.FluxTransformer2DModel,
           "flux2": diffusers.Flux2Transformer2DModel}[family]
    model = cls.from_config(config)
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def pipeline(family, transformer):
    import diffusers
    sched = diffusers.FlowMatchEulerDiscreteScheduler()
    if family == "sd3":
        return diffusers.StableDiffusion3Pipeline(transformer=transformer, scheduler=sched, vae=None, text_encoder=None,
                                                  tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                                                  text_encoder_3=None, tokenizer_3=None)
    if family == "wan":
        return diffusers.WanPipeline(tokenizer=None, text_encoder=None, transformer=transformer, vae=None,
                                     scheduler=sched)
    if family == "flux":
        return diffusers.FluxPipeline(scheduler=sched, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None,
                                      tokenizer_2=None, transformer=transformer)
    if family == "flux2":
        return diffusers.Flux2Pipeline(scheduler=sched, vae=None, text_encoder=None, tokenizer=None,
                                       transformer=transformer)
    return diffusers.QwenImagePipeline(scheduler=sched, vae=None, text_encoder=None, tokenizer=None,
                                       transformer=transformer)


def case(family):
    return load_file(os.path.join(FIXTURES, family, "case_0.safetensors"))


def reference_forward(family, model, inputs):
    with torch.no_grad():
        if family == "sd3":
            return model(hidden_states=inputs["hidden_states"], encoder_hidden_states=inputs["encoder_hidden_states"],
                         pooled_projections=inputs["pooled_projections"], timestep=inputs["timestep"],
                         return_dict=False)[0]
        if family == "wan":
            return model(hidden_states=inputs["hidden_states"], timestep=inputs["timestep"],
                         encoder_hidden_states=inputs["encoder_hidden_states"], return_dict=False)[0]
        if family == "flux":
            return model(**{k: inputs[k] for k in ("hidden_states", "encoder_hidden_states", "pooled_projections",
                                                   "timestep", "img_ids", "txt_ids", "guidance")}, return_dict=False)[0]
        if family == "flux2":
            return model(hidden_states=inputs["hidden_states"], encoder_hidden_states=inputs["encoder_hidden_states"],
                         timestep=inputs["timestep"], img_ids=inputs["img_ids"], txt_ids=inputs["txt_ids"],
                         guidance=inputs.get("guidance"), return_dict=False)[0]
        shapes = inputs["img_shapes"]
        return model(hidden_states=inputs["hidden_states"], encoder_hidden_states=inputs["encoder_hidden_states"],
                     encoder_hidden_states_mask=inputs["encoder_hidden_states_mask"], timestep=inputs["timestep"],
                     img_shapes=[[tuple(int(x) for x in s) for s in shapes[b]] for b in range(shapes.shape[0])],
                     return_dict=False)[0]


def base_weights(family):
    return os.path.join(FIXTURES, family, "weights.safetensors")


def base_config(family):
    # LTX-2 reads its config from the single-file checkpoint's metadata.
    return base_weights(family) if family == "ltx" else os.path.join(FIXTURES, family, "config.json")


DECK_BODY = {
    "sd3": "[rollout]\nsteps = 4\nsde_steps = 2\nwindow = [0, 4]\nheight = 8\nwidth = 8\nguidance_scale = 1.0\n",
    "wan": "[rollout]\nsteps = 4\nsde_steps = 2\nwindow = [0, 4]\nframes = 1\nheight = 8\nwidth = 8\n"
           "guidance_scale = 1.0\n",
    "qwen_image": "[rollout]\nsteps = 4\nsde_steps = 2\nwindow = [0, 4]\nheight = 8\nwidth = 8\n"
                  "guidance_scale = 1.0\n",
    "flux": "[rollout]\nsteps = 4\nsde_steps = 2\nwindow = [0, 4]\nheight = 8\nwidth = 8\nguidance_scale = 3.5\n",
    "flux2": "[rollout]\nsteps = 4\nsde_steps = 2\nwindow = [0, 4]\nheight = 8\nwidth = 8\n"
             "guidance_scale = 1.0\n",
    "ltx": "[rollout]\nsteps = 4\nsde = \"cps\"\nsde_steps = 2\nwindow = [0, 4]\nframes = 2\nheight = 4\nwidth = 4\n"
           "guidance_scale = 1.0\n",
}


def write_deck(path, family, out_dir, lora="", full=False, weights=None):
    lora_section = "" if full else (
        "[model.lora]\nenabled = true\nrank = 4\nalpha = 12.0\n" + lora)
    text = f"""[run]
out_dir = "{out_dir}"
seed = 3
deterministic = true

[model]
family = "{family}"
config = "{base_config(family)}"
weights = "{weights or base_weights(family)}"

{lora_section}
[precision]
forward = "fp32"

{DECK_BODY[family]}samples_per_prompt = 4
batch = 2

[train]
loss = "grpo"
lr = 2e-2
clip_range = 1e-3
global_batch = 8
micro_batch = 2
num_rollouts = 1

[data]
synthetic_prompts = 4
"""
    with open(path, "w") as f:
        f.write(text)
    return path


def ditrl_forward(family, args, out):
    ditrl(f"forward {args} --inputs {os.path.join(FIXTURES, family, 'case_0.safetensors')} --out {out}")
    return load_file(out)


def output_of(tensors):
    return tensors["output"] if "output" in tensors else tensors["output.video"]


def max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def load_folder(folder):
    # Every tensor of a (possibly sharded) safetensors folder.
    tensors = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(folder, name)))
    return tensors


def wan_diffusers_name(name):
    # A Wan checkpoint layer name in diffusers' names, by diffusers' own single-file converter
    # (independent of ditrl's table); unknown names come back unchanged.
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
    (key,) = convert_wan_transformer_to_diffusers({name + ".weight": torch.zeros(1)})
    return key[:-len(".weight")]


# fp32 noise of two implementations of one model on these tiny cases: the fixtures' own
# fp32-vs-fp64 gaps are 1e-6..3e-4 of the output's scale; a LoRA's effect is checked to be
# at least 100x this bound, so the comparisons cannot pass by accident.
def tolerance(reference):
    return 2e-5 * max(1.0, reference.abs().max().item())


def compare(name, ours, theirs, base=None, tol=None, effect_factor=100):
    diff, tol = max_diff(ours, theirs), tol or tolerance(theirs)
    detail = f"max |ditrl - reference| = {diff:.3e} (tolerance {tol:.1e})"
    ok = diff <= tol
    if base is not None:
        effect = max_diff(theirs, base)
        detail += f", LoRA effect {effect:.3e}"
        ok = ok and effect > effect_factor * tol
    check(name, ok, detail)


# ------------------------------------------------------------------ the checks

def diffusers_family(family, work):
    from peft import LoraConfig, PeftModel, get_peft_model_state_dict

    state = load_file(base_weights(family))
    inputs = case(family)
    base_out = reference_forward(family, diffusers_model(family, state), inputs)

    # 1-2: ditrl-trained LoRA -> PEFT, diffusers, merged.
    run_dir = os.path.join(work, "lora_run")
    deck = write_deck(os.path.join(work, "lora.toml"), family, run_dir)
    ditrl_mpi(2, f"train {deck}")
    ckpt = os.path.join(run_dir, "checkpoints", "step-1.h5")
    export = os.path.join(work, "export")
    print(ditrl(f"export {ckpt} --out {export} --merged").strip())
    ours = output_of(ditrl_forward(family, f"--checkpoint {ckpt}", os.path.join(work, "ckpt_forward.safetensors")))

    if family in ("flux", "flux2"):
        # Black Forest Labs' single file of the same weights (tests/fixtures/bfl_layout.py), read slice
        # by slice on 2 ranks, trains to the same model.
        bfl_dir = os.path.join(work, "bfl_run")
        deck = write_deck(os.path.join(work, "bfl.toml"), family, bfl_dir,
                          weights=os.path.join(FIXTURES, family, "bfl.safetensors"))
        ditrl_mpi(2, f"train {deck}")
        from_bfl = output_of(ditrl_forward(family, f"--checkpoint {os.path.join(bfl_dir, 'checkpoints', 'step-1.h5')}",
                                           os.path.join(work, "bfl_forward.safetensors")))
        check(f"{family}: train from Black Forest Labs' single file == from the diffusers weights",
              torch.equal(from_bfl, ours), f"bitwise: max diff {max_diff(from_bfl, ours):.1e}")

    peft_model = PeftModel.from_pretrained(diffusers_model(family, state), export).eval()
    compare(f"{family}: PeftModel.from_pretrained(export) forward", ours,
            reference_forward(family, peft_model.base_model.model, inputs), base_out)

    transformer = diffusers_model(family, state)
    pipe = pipeline(family, transformer)
    pipe.load_lora_weights(export)
    compare(f"{family}: {type(pipe).__name__}.load_lora_weights(export) forward", ours,
            reference_forward(family, transformer, inputs), base_out)

    # docs/user-guide.md's call, as it stands there.
    adapted = diffusers_model(family, state)
    adapted.load_lora_adapter(export, weight_name="pytorch_lora_weights.safetensors")
    compare(f"{family}: transformer.load_lora_adapter(export, weight_name=...) forward", ours,
            reference_forward(family, adapted, inputs), base_out)

    config = json.load(open(os.path.join(export, "adapter_config.json")))
    check(f"{family}: adapter_config.json names no local path", config["base_model_name_or_path"] is None,
          f"base_model_name_or_path = {config['base_model_name_or_path']!r} (the deck's weights: a local file)")

    merged_model = type(transformer).from_pretrained(os.path.join(export, "merged")).eval()
    compare(f"{family}: from_pretrained(export/merged) forward", ours, reference_forward(family, merged_model, inputs))

    if family == "flux2":
        comfyui_bfl_file(export, state, inputs, ours, base_out, work)
    else:
        comfyui_file(family, export, state, inputs, ours, base_out, work)

    # 3: a LoRA made by PEFT on the reference model, saved by diffusers and by PEFT.
    made = diffusers_model(family, state)
    made.add_adapter(LoraConfig(r=4, lora_alpha=12, target_modules=lora_targets(family), init_lora_weights=False))
    with torch.no_grad():
        for name, p in made.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.3)
    theirs = reference_forward(family, made, inputs)
    layers = get_peft_model_state_dict(made)
    diffusers_dir = os.path.join(work, "diffusers_lora")
    type(pipe).save_lora_weights(diffusers_dir, transformer_lora_layers=layers,
                                 transformer_lora_adapter_metadata=made.peft_config["default"].to_dict())
    forward_args = f"--family {family} --config {base_config(family)} --weights {base_weights(family)}"
    ours_imported = output_of(ditrl_forward(family, f"{forward_args} --lora {diffusers_dir}",
                                            os.path.join(work, "imported_forward.safetensors")))
    compare(f"{family}: ditrl forward --lora <diffusers save_lora_weights>", ours_imported, theirs, base_out)

    peft_dir = os.path.join(work, "peft_lora")
    wrapped = PeftModel(diffusers_model(family, state), made.peft_config["default"])
    wrapped.base_model.model.load_state_dict(made.state_dict(), strict=False)
    wrapped.save_pretrained(peft_dir)
    ours_peft = output_of(ditrl_forward(family, f"{forward_args} --lora {peft_dir}",
                                        os.path.join(work, "peft_forward.safetensors")))
    compare(f"{family}: ditrl forward --lora <PeftModel.save_pretrained>", ours_peft, theirs, base_out)

    # ... and a training run starts from it (no update: the checkpoint holds it unchanged).
    start_dir = os.path.join(work, "start_run")
    targets = ", ".join(f'"{t}"' for t in lora_targets(family))
    deck = write_deck(os.path.join(work, "start.toml"), family, start_dir,
                      lora=f"targets = [{targets}]\nweights = \"{diffusers_dir}\"\n")
    ditrl_mpi(2, f"train {deck} --set debug.skip_optimizer_step=true")
    started = output_of(ditrl_forward(family, f"--checkpoint {os.path.join(start_dir, 'checkpoints', 'step-1.h5')}",
                                      os.path.join(work, "start_forward.safetensors")))
    check(f"{family}: train from model.lora.weights = <diffusers LoRA>", torch.equal(started, ours_imported),
          f"checkpoint forward equals --lora forward bitwise: max diff {max_diff(started, ours_imported):.1e}")

    # 4: full fine-tune, 1 rank, exported sharded.
    full_dir = os.path.join(work, "full_run")
    deck = write_deck(os.path.join(work, "full.toml"), family, full_dir, full=True)
    ditrl_mpi(1, f"train {deck}")
    ckpt = os.path.join(full_dir, "checkpoints", "step-1.h5")
    full_export = os.path.join(work, "full_export")
    print(ditrl(f"export {ckpt} --out {full_export} --max-shard-size 100KB").strip())
    index = json.load(open(os.path.join(full_export, "diffusion_pytorch_model.safetensors.index.json")))
    shards = sorted(set(index["weight_map"].values()))
    full = type(transformer).from_pretrained(full_export).eval()
    tensors = {}
    for shard in shards:
        tensors.update(load_file(os.path.join(full_export, shard)))
    strict = type(transformer).from_config(full.config)
    result = strict.load_state_dict(tensors, strict=True)
    check(f"{family}: full export, {len(shards)} shards + index, load_state_dict(strict=True)",
          len(shards) > 1 and not result.missing_keys and not result.unexpected_keys,
          f"{len(tensors)} tensors, {index['metadata']['total_size']} bytes")
    ours_full = output_of(ditrl_forward(family, f"--checkpoint {ckpt}", os.path.join(work, "full_forward.safetensors")))
    compare(f"{family}: from_pretrained(full export) forward", ours_full, reference_forward(family, full, inputs))


def comfyui_file(family, export, state, inputs, ours, base_out, work):
    # ComfyUI's LoraLoader (comfy/lora.py; checked by hand against its repository in
    # benchmarks/results/comfyui_lora.md) takes `<key>.lora_A.weight`, `.lora_B.weight` and
    # `.alpha` at the key its key map gives a model weight, and patches W += (alpha/r) (B @ A) in
    # fp32 at strength 1 -- scale 1 where a module has no .alpha. Its key map: SD3 and FLUX the
    # diffusers names under `transformer.`, Qwen-Image its own (= diffusers') names under
    # `diffusion_model.`, Wan the Wan checkpoint names under `diffusion_model.`.
    path = os.path.join(export, "comfyui_lora.safetensors")
    lora = load_file(path)
    prefix = "transformer." if family in ("sd3", "flux") else "diffusion_model."
    linears = {n for n, m in diffusers_model(family, state).named_modules() if isinstance(m, torch.nn.Linear)}
    modules, stray = {}, []
    for key, value in lora.items():
        part = next((p for p in (".lora_A.weight", ".lora_B.weight", ".alpha") if key.endswith(p)), None)
        if part is None or not key.startswith(prefix):
            stray.append(key)
        else:
            modules.setdefault(key[len(prefix):-len(part)], {})[part] = value
    ours_of = {m: wan_diffusers_name(m) if family == "wan" else m for m in modules}
    misnamed = [m for m, d in ours_of.items() if d not in linears or (family == "wan" and d == m)]
    incomplete = [m for m, parts in modules.items() if len(parts) != 3 or parts[".alpha"].numel() != 1]
    diffusers_file = load_file(os.path.join(export, "pytorch_lora_weights.safetensors"))
    trained = {k[len("transformer."):-len(".lora_A.weight")] for k in diffusers_file if k.endswith(".lora_A.weight")}
    check(f"{family}: comfyui_lora.safetensors keys in ComfyUI's layout, an .alpha per module",
          not stray and not misnamed and not incomplete and set(ours_of.values()) == trained,
          f"{len(modules)} modules ({len(lora)} keys) under '{prefix}', the trained modules: "
          f"{set(ours_of.values()) == trained}; stray {stray[:3]}, misnamed {misnamed[:3]}, "
          f"without lora_A/lora_B/.alpha {incomplete[:3]}")

    # The weights ComfyUI's patch gives against ditrl's merged export (fp32), and the same
    # patch at scale 1 (a file without .alpha) as the negative control.
    merged = load_folder(os.path.join(export, "merged"))
    changed = {k for k in merged if not torch.equal(merged[k], state[k])}
    worst, worst_plain, effect, largest = 0.0, 0.0, 0.0, 0.0
    for m, parts in modules.items():
        w = ours_of[m] + ".weight"
        a, b = parts[".lora_A.weight"].float(), parts[".lora_B.weight"].float()
        delta = b @ a
        u = (state[w].abs() + delta.abs()) * 2.0 ** -24 + 2.0 ** -149  # half an fp32 ulp of the sum
        patched = state[w].float() + (parts[".alpha"].item() / a.shape[0]) * delta
        plain = state[w].float() + delta
        worst = max(worst, ((patched - merged[w]).abs() / u).max().item())
        worst_plain = max(worst_plain, ((plain - merged[w]).abs() / u).max().item())
        effect = max(effect, (delta.abs() / u).max().item())
        largest = max(largest, (parts[".alpha"].item() / a.shape[0]) * delta.abs().max().item())
    covered = changed <= {ours_of[m] + ".weight" for m in modules}
    # Measured: 0 u (ComfyUI's arithmetic is ditrl's merge, bit for bit); bound 2 u, for a BLAS
    # that blocks B @ A otherwise.
    check(f"{family}: ComfyUI's patch W + (alpha/r) B A from comfyui_lora.safetensors == ditrl's merge",
          covered and worst <= 2.0 and effect > 1000.0,
          f"{len(changed)} merged weights differ from the base, all in the file: {covered}; worst difference "
          f"{worst:.2f} u (bound 2; u = 2^-24 (|W| + |BA|), half an fp32 ulp), |(alpha/r) BA| up to {largest:.2e}")
    check(f"{family}: negative control: the patch at scale 1 (no .alpha) fails that check",
          worst_plain > 100.0, f"worst difference {worst_plain:.0f} u")

    # ditrl reads its own ComfyUI file back (Wan's checkpoint names included).
    forward_args = f"--family {family} --config {base_config(family)} --weights {base_weights(family)}"
    ours_comfy = output_of(ditrl_forward(family, f"{forward_args} --lora {path}",
                                         os.path.join(work, "comfyui_forward.safetensors")))
    check(f"{family}: comfyui_lora.safetensors read back by ditrl forward --lora", torch.equal(ours_comfy, ours),
          f"bitwise equal to --checkpoint: max diff {max_diff(ours_comfy, ours):.1e}")

    if family in ("wan", "qwen_image"):
        # diffusers' converters of these layouts (Wan checkpoint names, ComfyUI's Qwen-Image
        # files), .alpha included.
        transformer = diffusers_model(family, state)
        pipe = pipeline(family, transformer)
        pipe.load_lora_weights(export, weight_name="comfyui_lora.safetensors")
        compare(f"{family}: {type(pipe).__name__}.load_lora_weights(comfyui_lora.safetensors) forward", ours,
                reference_forward(family, transformer, inputs), base_out)


def comfyui_bfl_file(export, state, inputs, ours, base_out, work):
    # FLUX.2's comfyui_lora.safetensors is on Black Forest Labs' modules under `diffusion_model.`:
    # ComfyUI's FLUX.2 model keeps BFL's weight names, and its key map takes `diffusion_model.<name>`
    # for the weight `diffusion_model.<name>.weight` (comfy/lora.py model_lora_keys_unet, the generic
    # format); diffusers' Flux2 loader reads the same layout (_convert_non_diffusers_flux2_lora_to_diffusers).
    # No .alpha (that loader refuses one; ComfyUI then patches at alpha/r = 1): lora_B holds (alpha/r) B.
    sys.path.insert(0, FIXTURES)
    from bfl_layout import to_bfl  # the fixture's BFL layout, checked against diffusers' own converter

    path = os.path.join(export, "comfyui_lora.safetensors")
    lora = load_file(path)
    base = to_bfl("flux2", state)
    merged = to_bfl("flux2", load_folder(os.path.join(export, "merged")))
    prefix = "diffusion_model."
    modules, stray = {}, []
    for key, value in lora.items():
        part = next((p for p in (".lora_A.weight", ".lora_B.weight") if key.endswith(p)), None)
        if part is None or not key.startswith(prefix):
            stray.append(key)
        else:
            modules.setdefault(key[len(prefix):-len(part)], {})[part] = value
    misfit = [m for m, parts in modules.items()
              if len(parts) != 2 or m + ".weight" not in base
              or parts[".lora_B.weight"].shape[0] != base[m + ".weight"].shape[0]
              or parts[".lora_A.weight"].shape[1] != base[m + ".weight"].shape[1]
              or parts[".lora_A.weight"].shape[0] != parts[".lora_B.weight"].shape[1]]
    check("flux2: comfyui_lora.safetensors on BFL's weights under diffusion_model., no .alpha",
          not stray and not misfit and modules,
          f"{len(modules)} modules ({len(lora)} keys); stray {stray[:3]}, not fitting a BFL weight {misfit[:3]}")

    changed = {k for k in merged if not torch.equal(merged[k], base[k])}
    alpha_over_r = float(load_file_metadata(path)["ditrl_lora_alpha"]) / float(load_file_metadata(path)["ditrl_lora_rank"])
    worst, worst_scaled, effect = 0.0, 0.0, 0.0
    for m, parts in modules.items():
        w = m + ".weight"
        b, a = parts[".lora_B.weight"].float(), parts[".lora_A.weight"].float()
        delta = b @ a
        # Half an fp32 ulp of |W| + sum |b_i a_i|: the scale of the product's rounding, where
        # |B A| itself may cancel.
        u = (base[w].abs() + b.abs() @ a.abs()) * 2.0 ** -24 + 2.0 ** -149
        worst = max(worst, ((base[w] + delta - merged[w]).abs() / u).max().item())
        worst_scaled = max(worst_scaled, ((base[w] + alpha_over_r * delta - merged[w]).abs() / u).max().item())
        effect = max(effect, (delta.abs() / u).max().item())
    covered = changed <= {m + ".weight" for m in modules}
    # Measured: 3.9 u (AMD EPYC); bound 40 u, about 10x (lora_B is rounded once more, scaled by
    # alpha/r before the product, and the product's k is r per adapted part).
    check("flux2: ComfyUI's patch W + B A (no .alpha: scale 1) on BFL's weights == ditrl's merge",
          covered and worst <= 40.0 and effect > 1000.0,
          f"{len(changed)} merged BFL weights differ from the base, all in the file: {covered}; worst difference "
          f"{worst:.2f} u (bound 40; u = 2^-24 (|W| + |B| |A|))")
    check("flux2: negative control: lora_B scaled by alpha/r once more fails that check", worst_scaled > 100.0,
          f"worst difference {worst_scaled:.0f} u")

    transformer = diffusers_model("flux2", state)
    pipe = pipeline("flux2", transformer)
    pipe.load_lora_weights(export, weight_name="comfyui_lora.safetensors")
    compare(f"flux2: {type(pipe).__name__}.load_lora_weights(comfyui_lora.safetensors) forward", ours,
            reference_forward("flux2", transformer, inputs), base_out)

    forward_args = f"--family flux2 --config {base_config('flux2')} --weights {base_weights('flux2')}"
    inputs_file = os.path.join(FIXTURES, "flux2", "case_0.safetensors")
    refused = subprocess.run([DITRL] + shlex.split(f"forward {forward_args} --lora {path} --inputs {inputs_file} "
                                                   f"--out {os.path.join(work, 'refused.safetensors')}"),
                             capture_output=True, text=True)
    check("flux2: ditrl forward --lora refuses the BFL-layout file by name",
          refused.returncode != 0 and "Black Forest Labs' fused modules" in refused.stderr + refused.stdout,
          (refused.stderr + refused.stdout).strip().splitlines()[-1:] or "no output")


def load_file_metadata(path):
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return f.metadata()


def ltx_family(work):
    from ltx_core.loader import LTXV_LORA_COMFY_RENAMING_MAP, LoraStateDictWithStrength, StateDict, apply_loras

    run_dir = os.path.join(work, "lora_run")
    deck = write_deck(os.path.join(work, "lora.toml"), "ltx", run_dir)
    ditrl_mpi(2, f"train {deck}")
    ckpt = os.path.join(run_dir, "checkpoints", "step-1.h5")
    export = os.path.join(work, "export")
    print(ditrl(f"export {ckpt} --out {export}").strip())
    ours = output_of(ditrl_forward("ltx", f"--checkpoint {ckpt}", os.path.join(work, "ckpt_forward.safetensors")))

    # ltx_core's LoRA path: its renaming map on the file's keys, then apply_loras at strength 1 onto
    # the base in bf16 (the dtype of LTX-2 checkpoints; ltx_core fuses bf16 and fp8 weights only).
    # The reference is ditrl's own merge of the same adapter, exported in bf16.
    base_file = base_weights("ltx")
    prefix = "model.diffusion_model."
    base = {k[len(prefix):]: v.to(torch.bfloat16) for k, v in load_file(base_file).items() if k.startswith(prefix)}
    lora_raw = load_file(os.path.join(export, "ltx_lora.safetensors"))
    lora = {LTXV_LORA_COMFY_RENAMING_MAP.apply_to_key(k): v for k, v in lora_raw.items()}
    cpu = torch.device("cpu")
    fused = apply_loras(StateDict(base, cpu, 0, {torch.bfloat16}),
                        [LoraStateDictWithStrength(StateDict(lora, cpu, 0, {torch.float32}), 1.0)]).sd
    merged_dir = os.path.join(work, "export_bf16")
    ditrl(f"export {ckpt} --out {merged_dir} --merged --dtype bf16")
    merged_file = os.path.join(merged_dir, "merged", "ltx_model.safetensors")
    ours_merged = {k[len(prefix):]: v for k, v in load_file(merged_file).items()}
    changed = [k for k in lora_raw if k.endswith(".lora_A.weight")]
    # Both round W + B A to bf16, in other orders (ltx_core: bf16(delta) + bf16(W); ditrl: fp32 W +
    # delta, rounded once): each side is within half a bf16 ulp (2^-8 relative) of |W| + |delta| per
    # rounding, so they agree to a few units of u = 2^-8 (|W| + |delta|). A wrong scale or a missed
    # key would be off by about |delta| (hundreds of u where the adapter matters).
    worst, effect = 0.0, 0.0
    for key in changed:
        w = LTXV_LORA_COMFY_RENAMING_MAP.apply_to_key(key).replace(".lora_A.weight", ".weight")
        delta = lora[w.replace(".weight", ".lora_B.weight")].float() @ lora[w.replace(".weight", ".lora_A.weight")].float()
        u = (base[w].float().abs() + delta.abs()) * 2.0 ** -8 + 2.0 ** -126
        worst = max(worst, ((fused[w].float() - ours_merged[w].float()).abs() / u).max().item())
        effect = max(effect, (delta.abs() / u).max().item())
    check("ltx: ltx_core apply_loras(ltx_lora.safetensors) == ditrl's merge (bf16 weights)",
          set(fused) == set(ours_merged) and worst <= 3.0 and effect > 30.0,
          f"{len(changed)} adapted weights: worst difference {worst:.2f} u, LoRA delta up to {effect:.0f} u "
          f"(u = 2^-8 (|W| + |delta|))")
    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(base_file, "pt") as f:
        metadata = f.metadata()
    fused_file = os.path.join(work, "ltx_core_fused.safetensors")
    save_file({prefix + k: v.contiguous() for k, v in fused.items()}, fused_file, metadata=metadata)
    base_bf16 = os.path.join(work, "base_bf16.safetensors")
    save_file({prefix + k: v.contiguous() for k, v in base.items()}, base_bf16, metadata=metadata)
    args = lambda f: f"--family ltx --config {f} --weights {f}"  # noqa: E731
    fused_out = output_of(ditrl_forward("ltx", args(fused_file), os.path.join(work, "fused.safetensors")))
    merged_out = output_of(ditrl_forward("ltx", args(merged_file), os.path.join(work, "merged.safetensors")))
    base_out = output_of(ditrl_forward("ltx", args(base_bf16), os.path.join(work, "base.safetensors")))
    # bf16 weights on both sides: the forwards differ by the weights' rounding, not by fp32 noise.
    compare("ltx: forward on ltx_core's fused weights vs on ditrl's merge", merged_out, fused_out, base_out,
            tol=1.5e-2 * max(1.0, fused_out.abs().max().item()), effect_factor=5)
    compare("ltx: forward on ditrl's bf16 merge vs ditrl forward --checkpoint (fp32)", ours, merged_out, None,
            tol=2e-2 * max(1.0, ours.abs().max().item()))

    ours_peft = output_of(ditrl_forward("ltx", f"{args(base_file)} --lora {export}",
                                        os.path.join(work, "peft_forward.safetensors")))
    check("ltx: PEFT folder read back by ditrl forward --lora", torch.equal(ours_peft, ours),
          f"bitwise equal to --checkpoint: max diff {max_diff(ours_peft, ours):.1e}")
    ours_ltx = output_of(ditrl_forward("ltx", f"{args(base_file)} --lora {os.path.join(export, 'ltx_lora.safetensors')}",
                                       os.path.join(work, "ltx_forward.safetensors")))
    compare("ltx: ltx_lora.safetensors read back by ditrl forward --lora", ours_ltx, ours)

    # Full export: ltx_core's single-file layout, every key of the reference checkpoint.
    full_dir = os.path.join(work, "full_run")
    deck = write_deck(os.path.join(work, "full.toml"), "ltx", full_dir, full=True)
    ditrl_mpi(1, f"train {deck}")
    ckpt = os.path.join(full_dir, "checkpoints", "step-1.h5")
    full_export = os.path.join(work, "full_export")
    ditrl(f"export {ckpt} --out {full_export}")
    exported = os.path.join(full_export, "ltx_model.safetensors")
    keys = set(load_file(exported).keys())
    reference = {k for k in load_file(base_file) if k.startswith("model.diffusion_model.")}
    check("ltx: full export has exactly the reference checkpoint's DiT keys", keys == reference,
          f"{len(keys)} keys, missing {sorted(reference - keys)[:3]}, unexpected {sorted(keys - reference)[:3]}")
    ours_full = output_of(ditrl_forward("ltx", f"--checkpoint {ckpt}", os.path.join(work, "full_ckpt.safetensors")))
    reread = output_of(ditrl_forward("ltx", f"--family ltx --config {exported} --weights {exported}",
                                     os.path.join(work, "full_reread.safetensors")))
    check("ltx: full export (config from its metadata) reloads", torch.equal(ours_full, reread),
          f"max diff {max_diff(ours_full, reread):.1e}")


def main():
    for family in FAMILIES:
        work = os.path.join(OUT, family)
        shutil.rmtree(work, ignore_errors=True)  # no run of an earlier invocation is resumed or mixed in
        os.makedirs(work, exist_ok=True)
        print(f"== {family}", flush=True)
        if family == "ltx":
            ltx_family(work)
        else:
            diffusers_family(family, work)
    print(f"{len(failures)} failed" if failures else "all interop checks passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
