"""tools/export_text_encoder.py and tools/export_reward.py on the real transformers / diffusers classes.

Tiny models built from configs with seeded random weights (tests/interop/tiny_models.py; nothing is
downloaded) stand in for the pipeline folders. Per family:
  1. `tokenize` and `export --model` (the real paths), then `ditrl encode-prompts`: the dataset's
     embeddings equal the diffusers pipeline's own encode_prompt on the same prompts;
  2. export_reward.py --vae/--pickscore/--processor: the TorchScript reward run by ditrl (the
     rewards of `ditrl rollout` with [reward] kind = "torchscript") equals the eager Python modules'
     score (the diffusers VAE decode, the tool's preprocessing, CLIPModel's features) on the
     rollout's final latents;
  3. `ditrl train` runs on the encoded prompts with that reward.
flux2 is FLUX.2 [klein] (the Qwen3 text path, against Flux2KleinPipeline; its AutoencoderKLFlux2 in
step 2); flux2_dev (FLUX.2-dev's Mistral3 text path, against Flux2Pipeline; the same `--family flux2`,
told apart by the folder) runs step 1 only, as steps 2 and 3 are [klein]'s again.
Prints one line per check with the measured max abs difference; exits non-zero on any failure.

Usage: export_tools.py DITRL MPIEXEC OUT_DIR SOURCE_DIR [case ...]   (a family, or flux2_dev)
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

warnings.filterwarnings("ignore")
torch.set_num_threads(1)

DITRL, MPIEXEC, OUT, SOURCE = sys.argv[1:5]
CASES = sys.argv[5:] or ["sd3", "wan", "qwen_image", "flux", "flux2", "flux2_dev"]
FAMILY_OF = {"flux2_dev": "flux2"}  # cases that are another ditrl family's model folder
sys.path.insert(0, os.path.join(SOURCE, "tools"))
sys.path.insert(0, os.path.join(SOURCE, "tests", "interop"))
import export_reward  # noqa: E402
import scorers  # noqa: E402
import export_text_encoder  # noqa: E402
import tiny_models  # noqa: E402

PROMPTS = ["a red cube", "a cat on a mat", "sunset over the sea, oil painting"]
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


def run_refused(cmd, expected):
    """Negative control: cmd must exit non-zero with `expected` in its output."""
    r = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    named = expected in r.stdout
    return r.returncode != 0 and named, f"exit {r.returncode}, {expected!r} in the output: {named}"


def max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def pipeline(family, folder):
    import diffusers
    import transformers as tf
    load = lambda cls, sub: cls.from_pretrained(os.path.join(folder, sub))  # noqa: E731
    tok = lambda sub: tf.AutoTokenizer.from_pretrained(os.path.join(folder, sub))  # noqa: E731
    sched = diffusers.FlowMatchEulerDiscreteScheduler()
    if family == "sd3":
        return diffusers.StableDiffusion3Pipeline(
            transformer=None, scheduler=sched, vae=None,
            text_encoder=load(tf.CLIPTextModelWithProjection, "text_encoder"), tokenizer=tok("tokenizer"),
            text_encoder_2=load(tf.CLIPTextModelWithProjection, "text_encoder_2"), tokenizer_2=tok("tokenizer_2"),
            text_encoder_3=load(tf.T5EncoderModel, "text_encoder_3"), tokenizer_3=tok("tokenizer_3"))
    if family == "wan":
        return diffusers.WanPipeline(tokenizer=tok("tokenizer"), text_encoder=load(tf.UMT5EncoderModel, "text_encoder"),
                                     transformer=None, vae=None, scheduler=sched)
    if family == "flux":
        return diffusers.FluxPipeline(scheduler=sched, vae=None, transformer=None,
                                      text_encoder=load(tf.CLIPTextModel, "text_encoder"), tokenizer=tok("tokenizer"),
                                      text_encoder_2=load(tf.T5EncoderModel, "text_encoder_2"),
                                      tokenizer_2=tok("tokenizer_2"))
    if family == "flux2_dev":
        return diffusers.Flux2Pipeline(scheduler=sched, vae=None, transformer=None,
                                       tokenizer=tf.AutoProcessor.from_pretrained(os.path.join(folder, "tokenizer")),
                                       text_encoder=load(tf.Mistral3ForConditionalGeneration, "text_encoder"))
    if family == "flux2":
        return diffusers.Flux2KleinPipeline(scheduler=sched, vae=None, tokenizer=tok("tokenizer"), transformer=None,
                                            text_encoder=load(tf.Qwen3ForCausalLM, "text_encoder"))
    return diffusers.QwenImagePipeline(scheduler=sched, vae=None, tokenizer=tok("tokenizer"), transformer=None,
                                       text_encoder=load(tf.Qwen2_5_VLForConditionalGeneration, "text_encoder"))


def pipeline_embeddings(family, pipe):
    """What the diffusers pipeline conditions its DiT on, padded as ditrl's datasets store it."""
    with torch.no_grad():
        if family == "sd3":
            embeds, _, pooled, _ = pipe.encode_prompt(PROMPTS, PROMPTS, PROMPTS, do_classifier_free_guidance=False,
                                                      max_sequence_length=export_text_encoder.SD3_T5_MAX)
            return {"encoder_hidden_states": embeds, "pooled_projections": pooled}
        if family == "wan":
            embeds, _ = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False,
                                           max_sequence_length=export_text_encoder.WAN_MAX)
            return {"encoder_hidden_states": embeds}
        if family == "flux":
            embeds, pooled, _ = pipe.encode_prompt(PROMPTS, PROMPTS,
                                                   max_sequence_length=export_text_encoder.FLUX_T5_MAX)
            return {"encoder_hidden_states": embeds, "pooled_projections": pooled}
        if family in ("flux2", "flux2_dev"):
            # The pipelines' own defaults (512 tokens, their layers), so the tool's constants are checked too.
            embeds, _ = pipe.encode_prompt(PROMPTS)
            return {"encoder_hidden_states": embeds}
        embeds, mask = pipe.encode_prompt(PROMPTS, max_sequence_length=export_text_encoder.QWEN_MAX)
        # The pipeline pads to the batch's longest prompt; ditrl's datasets to the fixed 512.
        pad = export_text_encoder.QWEN_MAX - embeds.shape[1]
        return {"encoder_hidden_states": torch.nn.functional.pad(embeds, (0, 0, 0, pad)),
                "encoder_hidden_states_mask": torch.nn.functional.pad(mask.long(), (0, pad))}


def read_dataset(path):
    import h5py
    with h5py.File(path, "r") as f:
        out = {}

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and obj.dtype.kind in "fiub":
                out[name] = torch.from_numpy(obj[()])
        f.visititems(visit)
        return out


def deck(family, folder, prompts_h5, reward, out_dir):
    body = {"sd3": "height = 8\nwidth = 8\n", "qwen_image": "height = 8\nwidth = 8\n",
            "wan": "frames = 2\nheight = 8\nwidth = 8\n", "flux": "height = 8\nwidth = 8\n",
            "flux2": "height = 8\nwidth = 8\n"}[family]
    text = f"""[run]
out_dir = "{out_dir}"
seed = 5
deterministic = true

[model]
family = "{family}"
config = "{os.path.join(folder, 'ditrl_config.json')}"

[model.lora]
enabled = true
rank = 2
alpha = 4.0

[precision]
forward = "fp32"

[rollout]
steps = 3
sde_steps = 1
guidance_scale = 1.0
samples_per_prompt = 2
batch = 2
{body}
[reward]
kind = "torchscript"
module = "{reward}"

[train]
loss = "grpo"
lr = 1e-3
global_batch = 4
micro_batch = 1
num_rollouts = 1

[data]
prompts = "{prompts_h5}"
"""
    path = os.path.join(os.path.dirname(prompts_h5), "deck.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def eager_reward(family, folder, pickscore, processor, latents, prompt_index, size, frames):
    """The reward from the Python modules themselves (not the traces): diffusers' VAE decode with the
    family's de-normalisation, the tool's CLIP preprocessing, CLIPModel's features and logit scale."""
    from transformers import AutoModel, AutoProcessor
    vae = export_reward.vae_class(family).from_pretrained(os.path.join(folder, "vae")).eval()
    decode = export_reward.DiffusersDecode(vae, family)
    model = AutoModel.from_pretrained(pickscore).eval()
    proc = AutoProcessor.from_pretrained(processor)
    with torch.no_grad():
        text = proc(text=PROMPTS, padding=True, truncation=True, max_length=77, return_tensors="pt")
        text_embeds = model.get_text_features(**text)
        text_embeds = text_embeds if torch.is_tensor(text_embeds) else text_embeds.pooler_output

        head = scorers.ClipSimilarity(model, float(model.logit_scale.exp()))
        reward = export_reward.ScorerReward(decode, head, torch.nn.functional.normalize(text_embeds, dim=-1),
                                            family == "wan", frames, size, "eager")
        return reward(latents, prompt_index)


def main():
    models_dir = os.path.join(OUT, "models")
    tiny_models.main(models_dir, CASES)
    pickscore, processor = os.path.join(models_dir, "pickscore"), os.path.join(models_dir, "processor")
    for case in CASES:
        family = FAMILY_OF.get(case, case)
        print(f"== {case}", flush=True)
        folder = os.path.join(models_dir, case)
        work = os.path.join(OUT, case)
        shutil.rmtree(work, ignore_errors=True)  # no run of an earlier invocation is resumed or mixed in
        os.makedirs(work, exist_ok=True)
        prompts_txt = os.path.join(work, "prompts.txt")
        with open(prompts_txt, "w") as f:
            f.write("\n".join(PROMPTS) + "\n")
        jsonl, encoder = os.path.join(work, "prompts.jsonl"), os.path.join(work, "encoder.pt")
        export_text_encoder.main(["tokenize", "--family", family, "--model", folder, prompts_txt, jsonl])
        export_text_encoder.main(["export", "--family", family, "--model", folder, "--out", encoder, "--dtype", "fp32"])
        h5 = os.path.join(work, "prompts.h5")
        run(f"{shlex.quote(DITRL)} encode-prompts --encoder {encoder} --prompts {jsonl} --out {h5} --family {family} "
            f"--config {os.path.join(folder, 'ditrl_config.json')}")
        stored = read_dataset(h5)
        expected = pipeline_embeddings(case, pipeline(case, folder))
        for name, want in expected.items():
            key = next((k for k in stored if k.endswith(name)), None)
            got = stored.get(key)
            ok = got is not None and tuple(got.shape) == tuple(want.shape)
            diff = max_diff(got, want) if ok else float("inf")
            scale = max(1.0, want.abs().max().item())
            # Bound 1e-5 x max |value|: flux2 measures 1.9e-6 at 2.6 and flux2_dev 2.9e-6 at 3.7 (13x).
            check(f"{case}: encode-prompts {name} vs the diffusers pipeline's encode_prompt",
                  ok and diff <= 1e-5 * scale,
                  f"shape {None if got is None else list(got.shape)}, max |value| {scale:.3g}, max diff {diff:.3e}")
        if case == "flux2_dev":
            # A [klein] tokens file (key "qwen3") given to the dev encoder is refused, naming the key it reads.
            wrong = os.path.join(work, "qwen3_tokens.jsonl")
            with open(jsonl) as f, open(wrong, "w") as out:
                out.writelines(line.replace('"mistral3"', '"qwen3"') for line in f)
            ok, detail = run_refused(f"{shlex.quote(DITRL)} encode-prompts --encoder {encoder} --prompts {wrong} "
                                     f"--out {os.path.join(work, 'wrong.h5')} --family flux2 "
                                     f"--config {os.path.join(folder, 'ditrl_config.json')}", "mistral3")
            check(f"{case}: encode-prompts refuses tokens under another tokenizer's key", ok, detail)
        if case == "flux2_dev":
            continue

        reward = os.path.join(work, "reward.pt")
        size, frames = 32, 2
        export_reward.main(["--family", family, "--vae", os.path.join(folder, "vae"), "--pickscore", pickscore,
                            "--processor", processor, "--prompts", prompts_txt, "--out", reward, "--size", str(size),
                            "--frames", str(frames), "--latent-frames", "2"])
        run_dir = os.path.join(work, "run")
        d = deck(family, folder, h5, reward, run_dir)
        traj = os.path.join(work, "rollout.h5")
        run(f"timeout 600 {MPIEXEC} -np 2 {shlex.quote(DITRL)} rollout {d} --out {traj}")
        t = read_dataset(traj)
        eager = eager_reward(family, folder, pickscore, processor, t["final_latents"], t["prompt_index"], size, frames)
        diff = max_diff(t["rewards"], eager)
        check(f"{family}: ditrl rollout rewards (TorchScript export) vs the eager Python modules",
              diff <= 1e-4 * max(1.0, eager.abs().max().item()),
              f"{t['rewards'].numel()} rewards in [{eager.min().item():.3f}, {eager.max().item():.3f}], max diff {diff:.3e}")
        out = run(f"timeout 600 {MPIEXEC} -np 2 {shlex.quote(DITRL)} train {d}")
        progress = [line for line in out.splitlines() if "rollout 1/1" in line]
        check(f"{family}: ditrl train on the encoded prompts with the exported reward", bool(progress),
              progress[0].split("] ")[-1] if progress else "no progress line")
    print(f"{len(failures)} failed" if failures else "all export-tool checks passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
