"""Writes the shared inputs of the ditrl vs flow_grpo loop benchmark (benchmarks/peer/flow_grpo/run.sh).

    python benchmarks/peer/flow_grpo/prepare.py WORK_DIR --iterations 30 [--lr 1e-3] [--size tiny|real] [--set KEY=JSON ...]

--size real: SD3.5-medium's transformer config instead of the tiny preset (benchmarks/gpu/loop.sh).
--set overrides one SETTINGS value (JSON), e.g. --set use_lora=true --set reward='"torchscript"'.

Everything both sides read comes from here, from one table of settings (SETTINGS), so they cannot drift:

  WORK_DIR/transformer/config.json                    the tiny SD3 (ditrl's `tiny` preset) as diffusers'
  WORK_DIR/transformer/diffusion_pytorch_model.safetensors   SD3Transformer2DModel config and its seeded init
  WORK_DIR/prompts.h5        ditrl's prompt dataset layout (/text, /cond/<name>, /negative/<name>) holding
                             seeded N(0, 1) prompt embeddings and a zero negative (the empty-prompt stand-in)
  WORK_DIR/prompts/{train,test}.txt   the same prompt strings, one a line (flow_grpo's TextPromptDataset)
  WORK_DIR/ditrl.toml        the ditrl deck (1 rank; run.sh writes the 2-rank copy with --set)
  WORK_DIR/settings.json     SETTINGS plus the paths, read by flow_grpo_config.py and flow_grpo_driver.py
"""
import argparse
import json
import os

import diffusers
import h5py
import numpy as np
import torch
from safetensors.torch import save_file

# One table for both sides. Names follow flow_grpo's config where it has one.
SETTINGS = {
    "seed": 42,
    "init_seed": 0,              # torch.manual_seed before building the diffusers model (the shared init)
    "prompts": 16,               # prompt dataset size
    "prompt_seed": 7,            # embeddings ~ N(0, 1) from this seed
    "num_steps": 10,             # denoising steps, SD3.5 FlowMatchEuler schedule, static shift 3
    "shift": 3.0,
    "noise_level": 0.7,          # Flow-SDE eta on every step
    "guidance_scale": 4.5,       # CFG in rollout and in the training forward (flow_grpo train.cfg)
    "prompts_per_iteration": 4,
    "group_size": 4,             # samples per prompt -> 16 samples per iteration
    "timestep_fraction": 1.0,    # every step SDE and trained (ditrl: sde_steps = steps, window [0, steps))
    "latent": 8,                 # latent grid 8 x 8 x 16 channels (flow_grpo resolution = 8 * vae scale 8)
    "vae_scale_factor": 8,
    "lr": 1e-3,
    "betas": [0.9, 0.999],
    "eps": 1e-8,
    "weight_decay": 1e-4,
    "max_grad_norm": 1.0,
    "clip_range": 1e-4,
    "adv_clip_max": 5.0,
    "kl_beta": 0.0,
    # ditrl's analytic reward on the final latents. brightness = mean(x): learnable within 20-30 iterations
    # here (target_pattern, -mean((x - p)^2), did not rise within 60 iterations at lr 3e-4 / 1e-3 with this
    # init and CFG 4.5, measured on ditrl). Both are implemented on the flow_grpo side (flow_grpo_driver.py).
    "reward": "brightness",
    "target_seed": 1234,         # target_pattern only: p = 0.5 * randn(numel, generator seeded with this)
    "threads": 1,
    # flow_grpo's LoRA (train_sd3.py: r 32, alpha 64, gaussian init, the 8 attention projections ditrl's SD3
    # defaults name too); false = full fine-tune.
    "use_lora": False,
    "reward_module": "",         # reward = "torchscript": this TorchScript module, forward(latents, prompt_index)
    "precision": "fp32",         # "bf16": ditrl forward bf16 (fp32 master), flow_grpo mixed_precision "bf16"
    "device": "cpu",
    "micro_batch": 0,            # samples per training forward (0 = the whole iteration); one optimizer step
}

# ditrl's `tiny` SD3 preset (src/models/sd3/sd3.cpp SD3Config::preset("tiny")) in diffusers' config names.
TINY_SD3 = {
    "_class_name": "SD3Transformer2DModel",
    "sample_size": 16,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 4,
    "attention_head_dim": 16,
    "num_attention_heads": 4,
    "joint_attention_dim": 48,
    "caption_projection_dim": 64,
    "pooled_projection_dim": 32,
    "out_channels": 16,
    "pos_embed_max_size": 12,
    "dual_attention_layers": [0, 1],
    "qk_norm": "rms_norm",
}
TEXT_TOKENS = 8  # the tiny preset's text sequence length (SD3Config.text_tokens)

# ditrl's `sd3.5-medium` preset (SD3Config::preset) in diffusers' names: the released transformer's config.
SD35_MEDIUM = {
    "_class_name": "SD3Transformer2DModel",
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "pos_embed_max_size": 384,
    "dual_attention_layers": list(range(13)),
    "qk_norm": "rms_norm",
}
SIZES = {"tiny": (TINY_SD3, "tiny", TEXT_TOKENS), "real": (SD35_MEDIUM, "sd3.5-medium", 333)}

DECK = """# ditrl side of benchmarks/peer/flow_grpo (written by prepare.py; every value from its SETTINGS table)
[run]
name = "flow_grpo_loop"
out_dir = "{out_dir}"
seed = {seed}
deterministic = false         # no CPU-kernel pins: flow_grpo runs unpinned too
threads = {threads}

[model]
family = "sd3"
preset = "{preset}"
weights = "{weights}"
{lora}
[precision]
master = "fp32"
reduce = "fp32"
forward = "{precision}"

[rollout]
steps = {num_steps}
shift = {shift}
sde = "sde"
noise_level = {noise_level}
guidance_scale = {guidance_scale}
samples_per_prompt = {group_size}
batch = {prompts_per_iteration}
strategy = "sde_window"
sde_steps = {trained_steps}
window = [0, {trained_steps}]
height = {latent}
width = {latent}

{reward_section}
[train]
loss = "grpo"
lr = {lr}
betas = [{beta1}, {beta2}]
eps = {eps}
weight_decay = {weight_decay}
clip_grad = {max_grad_norm}
clip_range = {clip_range}
adv_clip_max = {adv_clip_max}
kl_beta = {kl_beta}
global_std = true
std_ddof = 0
global_batch = {samples}
steps_per_rollout = 1
micro_batch = {micro_batch}
num_rollouts = {iterations}

[data]
prompts = "{prompts_h5}"

[checkpoint]
every = 0
keep = 1
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="override a SETTINGS value")
    args = parser.parse_args()

    s = dict(SETTINGS)
    if args.lr is not None:
        s["lr"] = args.lr
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in SETTINGS:
            parser.error(f"--set {item}: no setting {key!r} (known: {', '.join(SETTINGS)})")
        s[key] = json.loads(value)
    if s["reward"] == "torchscript" and not s["reward_module"]:
        parser.error("reward = torchscript needs --set reward_module='\"PATH\"'")
    config, preset, text_tokens = SIZES[args.size]
    s["iterations"] = args.iterations
    s["samples"] = s["prompts_per_iteration"] * s["group_size"]
    s["micro_batch"] = s["micro_batch"] or s["samples"]
    if s["samples"] % s["micro_batch"]:
        parser.error(f"micro_batch {s['micro_batch']} must divide the {s['samples']} samples of an iteration")
    s["trained_steps"] = int(s["num_steps"] * s["timestep_fraction"])
    work = os.path.abspath(args.work)
    os.makedirs(os.path.join(work, "transformer"), exist_ok=True)
    os.makedirs(os.path.join(work, "prompts"), exist_ok=True)

    # The shared transformer: diffusers' class, seeded init, every tensor of its state dict (pos_embed too).
    torch.manual_seed(s["init_seed"])
    model = diffusers.SD3Transformer2DModel.from_config(config)
    weights = os.path.join(work, "transformer", "diffusion_pytorch_model.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
    with open(os.path.join(work, "transformer", "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    # The shared prompts: texts, seeded embeddings, a zero negative.
    texts = [f"prompt {i}" for i in range(s["prompts"])]
    g = torch.Generator().manual_seed(s["prompt_seed"])
    hidden = torch.randn(s["prompts"], text_tokens, config["joint_attention_dim"], generator=g)
    pooled = torch.randn(s["prompts"], config["pooled_projection_dim"], generator=g)
    prompts_h5 = os.path.join(work, "prompts.h5")
    with h5py.File(prompts_h5, "w") as f:
        f.create_dataset("text", data=np.array(texts, dtype=object), dtype=h5py.string_dtype("utf-8"))
        f.create_dataset("cond/encoder_hidden_states", data=hidden.numpy())
        f.create_dataset("cond/pooled_projections", data=pooled.numpy())
        f.create_dataset("negative/encoder_hidden_states", data=np.zeros((1,) + hidden.shape[1:], np.float32))
        f.create_dataset("negative/pooled_projections", data=np.zeros((1,) + pooled.shape[1:], np.float32))
    for split in ("train", "test"):
        with open(os.path.join(work, "prompts", f"{split}.txt"), "w") as f:
            f.write("\n".join(texts) + "\n")

    s.update(work=work, weights=weights, model_dir=work, prompts_h5=prompts_h5,
             prompt_dir=os.path.join(work, "prompts"), transformer_config=config, text_tokens=text_tokens,
             size=args.size)
    with open(os.path.join(work, "settings.json"), "w") as f:
        json.dump(s, f, indent=2)

    lora = "\n[model.lora]\nenabled = true\nrank = 32\nalpha = 64.0\ninit = \"gaussian\"\n" if s["use_lora"] else ""
    if s["reward"] == "torchscript":
        reward_section = f'[reward]\nkind = "torchscript"\nmodule = "{s["reward_module"]}"\n'
    else:
        reward_section = f'[reward]\nkind = "analytic"\nanalytic = "{s["reward"]}"\ntarget_seed = {s["target_seed"]}\n'
    deck = DECK.format(out_dir=os.path.join(work, "ditrl-run"), beta1=s["betas"][0], beta2=s["betas"][1],
                       preset=preset, lora=lora, reward_section=reward_section, **s)
    if s["device"] != "cpu":
        deck = deck.replace("[model]\n", f'device = "{s["device"]}"\n\n[model]\n', 1)
    with open(os.path.join(work, "ditrl.toml"), "w") as f:
        f.write(deck)
    print(f"setup: {work}: {sum(p.numel() for p in model.parameters())} parameters, {len(texts)} prompts, "
          f"{s['samples']} samples x {s['num_steps']} steps per iteration, {s['iterations']} iterations")


if __name__ == "__main__":
    main()
