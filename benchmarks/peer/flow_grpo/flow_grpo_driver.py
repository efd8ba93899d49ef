"""Runs flow_grpo's own SD3 GRPO loop (scripts/train_sd3.py, its `main`) on the benchmark's tiny SD3, on
the CPU, without editing any of its files, and records one row per iteration.

    OMP_NUM_THREADS=1 python benchmarks/peer/flow_grpo/flow_grpo_driver.py --flow-grpo /path/to/flow_grpo \
        --settings WORK/settings.json --out rows.jsonl

flow_grpo's code is imported from --flow-grpo (a checkout of github.com/yifan123/flow_grpo, never
committed here) and run as it is: its sampler (DistributedKRepeatSampler), pipeline_with_logprob with CFG and
its SDE step, its per-prompt stat tracker, the Accelerate loop with gradient accumulation over the timesteps,
the PPO-clipped loss, clip_grad_norm_ and torch.optim.AdamW. The config is flow_grpo's config/base.py with
the benchmark's values (flow_grpo_config.py). The shims below replace only what needs GPUs, networks, hub
downloads or image-space models, each applied to the imported module at run time:

1. `StableDiffusion3Pipeline.from_pretrained` (in train_sd3's namespace) builds diffusers' real
   StableDiffusion3Pipeline around: diffusers' SD3Transformer2DModel from the shared config.json and
   safetensors (load_state_dict strict), FlowMatchEulerDiscreteScheduler(shift=3) (SD3.5's scheduler config),
   an identity "VAE" (scaling 1, shift 0, decode(z) = z) and a VaeImageProcessor without denormalisation, so
   the "images" flow_grpo hands to its reward function are the final latents, which is what ditrl's analytic
   reward scores; placeholder text-encoder modules (never called) and a tokenizer that maps each prompt string
   to its row id and back (flow_grpo tokenizes prompts only to group them for the stat tracker).
2. `compute_text_embeddings` returns the precomputed embeddings of the prompt dataset (WORK/prompts.h5, the
   same file ditrl reads); "" (flow_grpo's negative prompt) returns the dataset's /negative rows (zeros).
3. `flow_grpo.rewards.multi_score` returns ditrl's analytic reward of the settings (ditrl's AnalyticReward,
   src/rollout/reward.cpp) on each sample's final latent x: brightness = mean(x), or target_pattern =
   -mean((x - p)^2) with p = 0.5 * randn(numel) from a CPU generator seeded with target_seed; or, for
   reward = "torchscript", the very TorchScript module ditrl loads (settings reward_module, e.g.
   tools/export_reward.py's PickScore: VAE decode + CLIP-H tower) called on the final latents and each
   sample's prompt row; as {name: r, "avg": r}, the layout multi_score returns.
4. `eval` (flow_grpo's evaluation, which train_sd3 calls at the top of an epoch when epoch % eval_freq == 0;
   eval_freq = 1 here) is replaced by the iteration clock: it stamps time.perf_counter() at the start of
   every epoch and ends the run after the requested number of iterations. flow_grpo's eval at epoch 0
   (40-step ODE sampling of the test set) is therefore not run and not timed.
5. `wandb` is a stub module that keeps the values train_sd3 logs (reward_ori_avg per epoch, the training
   info dict per optimizer step), and `Image` (PIL, used to JPEG-encode 15 samples for wandb every 10
   epochs) is a no-op stand-in, since the "images" are 16-channel latents.
"""
import argparse
import importlib.util
import json
import math
import os
import sys
import time
import types


class _Done(Exception):
    pass


def _install_wandb_stub(log):
    wandb = types.ModuleType("wandb")
    wandb.init = lambda *a, **k: None
    wandb.finish = lambda *a, **k: None
    wandb.Image = lambda *a, **k: None

    def _log(values, step=None, **_):
        log.append((time.perf_counter(), step, values))

    wandb.log = _log
    sys.modules["wandb"] = wandb


class _NoImage:
    """Stand-in for PIL.Image inside train_sd3 (sample logging every 10 epochs)."""

    class _Img:
        def resize(self, *a, **k):
            return self

        def save(self, *a, **k):
            pass

    @classmethod
    def fromarray(cls, *a, **k):
        return cls._Img()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--flow-grpo", required=True, help="flow_grpo checkout (github.com/yifan123/flow_grpo)")
    parser.add_argument("--settings", required=True, help="WORK/settings.json from prepare.py")
    parser.add_argument("--out", required=True, help="JSON lines, one per iteration")
    args = parser.parse_args()

    flow_grpo_dir = os.path.abspath(args.flow_grpo)
    settings_path = os.path.abspath(args.settings)
    with open(settings_path) as f:
        s = json.load(f)
    os.environ["FLOW_GRPO_DIR"] = flow_grpo_dir
    os.environ["FLOW_GRPO_BENCH_SETTINGS"] = settings_path
    t_start = time.perf_counter()

    import torch

    torch.set_num_threads(s["threads"])
    import h5py
    import diffusers
    from diffusers.image_processor import VaeImageProcessor
    from safetensors.torch import load_file

    import accelerate  # noqa: F401  (before the wandb stub: accelerate probes wandb's import spec)

    wandb_log = []
    _install_wandb_stub(wandb_log)
    sys.path.insert(0, flow_grpo_dir)
    import flow_grpo.rewards

    spec = importlib.util.spec_from_file_location("flow_grpo_train_sd3",
                                                  os.path.join(flow_grpo_dir, "scripts", "train_sd3.py"))
    train_sd3 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_sd3)  # defines its absl flags (--config) and the loop

    # --- shim 1: the pipeline --------------------------------------------------------------------------
    with h5py.File(s["prompts_h5"], "r") as f:
        texts = [t.decode() if isinstance(t, bytes) else t for t in f["text"][()]]
        cond_hidden = torch.from_numpy(f["cond/encoder_hidden_states"][()])
        cond_pooled = torch.from_numpy(f["cond/pooled_projections"][()])
        neg_hidden = torch.from_numpy(f["negative/encoder_hidden_states"][()])
        neg_pooled = torch.from_numpy(f["negative/pooled_projections"][()])
    row_of = {t: i for i, t in enumerate(texts)}

    class PromptIdTokenizer:
        model_max_length = 77

        def __call__(self, prompts, **_):
            return types.SimpleNamespace(input_ids=torch.tensor([[row_of[p]] for p in prompts], dtype=torch.long))

        def batch_decode(self, ids, **_):
            return [texts[int(row[0])] for row in ids]

    class Placeholder(torch.nn.Module):
        """A parameterless module; diffusers asks every pipeline module for its device and dtype."""

        @property
        def device(self):
            return torch.device(s["device"])

        @property
        def dtype(self):
            return torch.float32

    class UnusedTextEncoder(Placeholder):
        def forward(self, *a, **k):
            raise RuntimeError("flow_grpo_driver: the text encoders are replaced by precomputed embeddings")

    class IdentityVAE(Placeholder):
        def __init__(self, scale_factor):
            super().__init__()
            levels = int(round(math.log2(scale_factor))) + 1
            self.config = types.SimpleNamespace(scaling_factor=1.0, shift_factor=0.0,
                                                block_out_channels=[1] * levels)

        def decode(self, z, return_dict=False):
            return (z,)

    class Pipeline:
        @staticmethod
        def from_pretrained(path, *a, **k):
            transformer = diffusers.SD3Transformer2DModel.from_config(s["transformer_config"])
            transformer.load_state_dict(load_file(s["weights"]), strict=True)
            scheduler = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=s["shift"])
            tok = PromptIdTokenizer()
            pipe = diffusers.StableDiffusion3Pipeline(
                transformer=transformer.float(), scheduler=scheduler, vae=IdentityVAE(s["vae_scale_factor"]),
                text_encoder=UnusedTextEncoder(), tokenizer=tok, text_encoder_2=UnusedTextEncoder(),
                tokenizer_2=tok, text_encoder_3=UnusedTextEncoder(), tokenizer_3=tok)
            pipe.image_processor = VaeImageProcessor(vae_scale_factor=s["vae_scale_factor"], do_normalize=False)
            return pipe

    train_sd3.StableDiffusion3Pipeline = Pipeline

    # --- shim 2: prompt embeddings ------------------------------------------------------------------------
    def compute_text_embeddings(prompt, text_encoders, tokenizers, max_sequence_length, device):
        if list(prompt) == [""]:
            return neg_hidden.clone().to(device), neg_pooled.clone().to(device)
        rows = torch.tensor([row_of[p] for p in prompt], dtype=torch.long)
        return cond_hidden[rows].to(device), cond_pooled[rows].to(device)

    train_sd3.compute_text_embeddings = compute_text_embeddings

    # --- shim 3: the reward ------------------------------------------------------------------------------
    targets = {}
    reward_calls = []

    module = torch.jit.load(s["reward_module"], map_location=s["device"]) if s["reward"] == "torchscript" else None

    def multi_score(device, score_dict):
        assert list(score_dict) == [s["reward"]], score_dict

        def _fn(images, prompts, metadata, only_strict=True):
            if module is not None:
                rows = torch.tensor([row_of[p] for p in prompts], dtype=torch.long, device=images.device)
                with torch.no_grad():
                    r = module(images.float(), rows).float().cpu()
                reward_calls.append(r.clone())
                return {s["reward"]: r.numpy(), "avg": r.numpy()}, {}
            x = images.float().flatten(1).cpu()
            if s["reward"] == "brightness":
                r = x.mean(1)
            elif s["reward"] == "target_pattern":
                if x.shape[1] not in targets:
                    g = torch.Generator().manual_seed(s["target_seed"])
                    targets[x.shape[1]] = torch.randn(x.shape[1], generator=g) * 0.5
                r = -(x - targets[x.shape[1]]).pow(2).mean(1)
            else:
                raise ValueError(f"flow_grpo_driver: no shim for reward {s['reward']!r}")
            reward_calls.append(r.clone())
            scores = r.numpy()
            return {s["reward"]: scores, "avg": scores}, {}

        return _fn

    flow_grpo.rewards.multi_score = multi_score

    # --- shim 4: the iteration clock -------------------------------------------------------------------
    stamps = []
    t_main = []

    def clock(*a, **k):
        stamps.append(time.perf_counter())
        if len(stamps) > s["iterations"]:
            raise _Done()

    train_sd3.eval = clock
    # --- shim 5: PIL inside the loop -------------------------------------------------------------------
    train_sd3.Image = _NoImage

    from absl import app

    def run(argv):
        t_main.append(time.perf_counter())
        try:
            train_sd3.main(argv)
        except _Done:
            pass

    config_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flow_grpo_config.py")
    os.makedirs(os.path.join(s["work"], "flow_grpo-cwd"), exist_ok=True)
    os.chdir(os.path.join(s["work"], "flow_grpo-cwd"))
    try:
        app.run(run, argv=["train_sd3", f"--config={config_file}"])
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    t_end = time.perf_counter()

    if len(stamps) != s["iterations"] + 1:
        sys.exit(f"flow_grpo_driver: the loop stopped after {len(stamps) - 1} of {s['iterations']} iterations")
    # Per epoch: the reward mean flow_grpo logged (reward_ori_avg), the time its rollout + rewards ended (the
    # wandb.log with "epoch", just after the rewards are gathered), the training info of its optimizer step.
    epoch_logs = [(t, v) for t, _, v in wandb_log if "epoch" in v and "reward_ori_avg" in v]
    train_logs = [v for _, _, v in wandb_log if "policy_loss" in v]
    rows = []
    for i in range(s["iterations"]):
        t_rollout_end, logged = epoch_logs[i]
        info = train_logs[i] if i < len(train_logs) else {}
        rows.append({
            "iteration": i,
            "seconds": stamps[i + 1] - stamps[i],
            "rollout_reward_seconds": t_rollout_end - stamps[i],
            "train_seconds": stamps[i + 1] - t_rollout_end,
            "reward_mean": float(logged["reward_ori_avg"]),
            "reward_std": float(reward_calls[i].std(unbiased=False)),
            "loss": float(info.get("loss", float("nan"))),
            "approx_kl": float(info.get("approx_kl", float("nan"))),
        })
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.write(json.dumps({"startup_seconds": t_main[0] - t_start, "loop_start_seconds": stamps[0] - t_main[0],
                            "total_seconds": t_end - t_start, "threads": torch.get_num_threads(),
                            "torch": torch.__version__, "diffusers": diffusers.__version__}) + "\n")
    print(f"flow_grpo_driver: {s['iterations']} iterations, "
          f"{sum(r['seconds'] for r in rows[1:]) / max(1, len(rows) - 1):.3f} s/iteration after the first, "
          f"reward {rows[0]['reward_mean']:.4f} -> {rows[-1]['reward_mean']:.4f}")


if __name__ == "__main__":
    main()
