"""Checks that the two sides of benchmarks/peer/flow_grpo compute the same thing, on one ditrl rollout:

    python benchmarks/peer/flow_grpo/check.py DITRL FLOW_GRPO WORK

WORK is prepare.py's folder. `ditrl rollout WORK/ditrl.toml` writes one scored rollout (16 samples, every
latent, every step's log-prob, the rewards); then, in Python:

1. schedule: ditrl's timesteps and sigmas against diffusers' FlowMatchEulerDiscreteScheduler(shift=3) after
   set_timesteps(steps), the scheduler flow_grpo's pipeline uses;
2. reward: ditrl's rewards against the driver's reward shim (brightness or target_pattern) on ditrl's final latents;
3. rollout math: for every sample and step, flow_grpo's own sde_step_with_logprob (imported from FLOW_GRPO)
   on diffusers' SD3Transformer2DModel (the shared weights) with CFG exactly as flow_grpo's pipeline applies
   it (one forward over [negative, positive], uncond + g * (text - uncond)) scores ditrl's transition
   x_j -> x_{j+1}; the log-probs are compared with the ones ditrl recorded. Equal log-probs mean equal model,
   conditioning, CFG, timesteps and SDE kernel.
Prints the largest differences and exits 1 when one exceeds its bound.
"""
import json
import os
import subprocess
import sys

import h5py
import torch


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    ditrl, flow_grpo_dir, work = (os.path.abspath(a) for a in sys.argv[1:])
    s = json.load(open(os.path.join(work, "settings.json")))
    torch.set_num_threads(s["threads"])
    traj = os.path.join(work, "check-traj.h5")
    subprocess.run([ditrl, "rollout", os.path.join(work, "ditrl.toml"), "--out", traj], check=True,
                   stdout=subprocess.DEVNULL)
    with h5py.File(traj, "r") as f:
        t = {k: torch.from_numpy(f[k][()]) for k in ("timesteps", "sigmas", "sde_steps", "latent_steps", "latents",
                                                       "log_probs", "final_latents", "rewards", "prompt_index")}
    with h5py.File(s["prompts_h5"], "r") as f:
        hidden = torch.from_numpy(f["cond/encoder_hidden_states"][()])
        pooled = torch.from_numpy(f["cond/pooled_projections"][()])
        neg_hidden = torch.from_numpy(f["negative/encoder_hidden_states"][()])
        neg_pooled = torch.from_numpy(f["negative/pooled_projections"][()])

    import diffusers
    from safetensors.torch import load_file

    sys.path.insert(0, flow_grpo_dir)
    from flow_grpo.diffusers_patch.sd3_sde_with_logprob import sde_step_with_logprob

    ok = True

    def report(name, diff, bound):
        nonlocal ok
        ok &= diff <= bound
        print(f"check: {name}: max abs diff {diff:.3g} (bound {bound:g}) {'ok' if diff <= bound else 'FAIL'}")

    # 1. schedule
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=s["shift"])
    scheduler.set_timesteps(s["num_steps"])
    report("timesteps vs FlowMatchEulerDiscreteScheduler", (t["timesteps"] - scheduler.timesteps).abs().max().item(), 0)
    report("sigmas vs FlowMatchEulerDiscreteScheduler", (t["sigmas"] - scheduler.sigmas).abs().max().item(), 0)

    # 2. reward
    x = t["final_latents"].float().flatten(1)
    if s["reward"] == "brightness":
        r = x.mean(1)
    else:
        p = torch.randn(x.shape[1], generator=torch.Generator().manual_seed(s["target_seed"])) * 0.5
        r = -(x - p).pow(2).mean(1)
    report(f"rewards vs the driver's {s['reward']}", (t["rewards"] - r).abs().max().item(), 1e-6)

    # 3. rollout math
    model = diffusers.SD3Transformer2DModel.from_config(s["transformer_config"])
    model.load_state_dict(load_file(s["weights"]), strict=True)
    model.eval()
    steps = t["sde_steps"].tolist()
    latent_steps = t["latent_steps"].tolist()
    n = t["latents"].shape[0]
    rows = t["prompt_index"].long()
    emb = torch.cat([neg_hidden.expand(n, -1, -1), hidden[rows]])
    pool = torch.cat([neg_pooled.expand(n, -1), pooled[rows]])
    worst, scale = 0.0, 0.0
    with torch.no_grad():
        for k, j in enumerate(steps):
            xj = t["latents"][:, latent_steps.index(j)]
            xn = t["latents"][:, latent_steps.index(j + 1)]
            ts = scheduler.timesteps[j].expand(2 * n)
            v = model(hidden_states=torch.cat([xj, xj]), timestep=ts, encoder_hidden_states=emb,
                      pooled_projections=pool, return_dict=False)[0]
            uncond, text = v.chunk(2)
            v = uncond + s["guidance_scale"] * (text - uncond)
            _, log_prob, _, _ = sde_step_with_logprob(scheduler, v.float(), scheduler.timesteps[j].expand(n), xj.float(),
                                                      noise_level=s["noise_level"], prev_sample=xn.float())
            worst = max(worst, (log_prob - t["log_probs"][:, k]).abs().max().item())
            scale = max(scale, t["log_probs"][:, k].abs().max().item())
    print(f"check: {len(steps)} steps x {n} samples; ditrl log-probs up to {scale:.3g} in magnitude")
    report("ditrl's rollout log-probs vs flow_grpo's sde_step_with_logprob on diffusers' model", worst, 1e-3)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
