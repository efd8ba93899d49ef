"""ml_collections config file for flow_grpo's scripts/train_sd3.py (its `--config` flag), used by
flow_grpo_driver.py. It starts from flow_grpo's own config/base.py (read from FLOW_GRPO_DIR) and sets
the values of the benchmark's shared table (FLOW_GRPO_BENCH_SETTINGS = WORK/settings.json, written by
prepare.py), so the loop runs with flow_grpo's defaults everywhere this benchmark does not pin a value.
"""
import importlib.util
import json
import os


def get_config():
    flow_grpo = os.environ["FLOW_GRPO_DIR"]
    spec = importlib.util.spec_from_file_location("flow_grpo_base_config", os.path.join(flow_grpo, "config", "base.py"))
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    with open(os.environ["FLOW_GRPO_BENCH_SETTINGS"]) as f:
        s = json.load(f)

    config = base.get_config()
    config.run_name = "flow_grpo_loop"
    config.seed = s["seed"]
    config.logdir = os.path.join(s["work"], "flow_grpo-logs")
    config.mixed_precision = "no" if s["precision"] == "fp32" else s["precision"]  # as the ditrl deck's forward
    config.use_lora = s["use_lora"]      # flow_grpo's LoRA (r 32, alpha 64) or full fine-tune, as the ditrl deck
    config.pretrained.model = s["model_dir"]
    config.dataset = s["prompt_dir"]
    config.prompt_fn = "general_ocr"     # the branch that reads DATASET/{train,test}.txt (TextPromptDataset)
    config.resolution = s["latent"] * s["vae_scale_factor"]

    config.sample.num_steps = s["num_steps"]
    config.sample.eval_num_steps = s["num_steps"]
    config.sample.guidance_scale = s["guidance_scale"]
    config.sample.noise_level = s["noise_level"]
    config.sample.train_batch_size = s["samples"]            # one sampling batch = the whole iteration
    config.sample.num_image_per_prompt = s["group_size"]
    config.sample.num_batches_per_epoch = 1
    config.sample.test_batch_size = 1
    config.sample.global_std = True

    config.train.batch_size = s["micro_batch"]                # per training forward, as ditrl's micro_batch
    config.train.learning_rate = s["lr"]
    config.train.adam_beta1, config.train.adam_beta2 = s["betas"]
    config.train.adam_weight_decay = s["weight_decay"]
    config.train.adam_epsilon = s["eps"]
    # times the trained timesteps (train_sd3 multiplies): one optimizer step per iteration
    config.train.gradient_accumulation_steps = s["samples"] // s["micro_batch"]
    config.train.max_grad_norm = s["max_grad_norm"]
    config.train.num_inner_epochs = 1
    config.train.cfg = True
    # base.py has adv_clip_max = 5 (an int) and ConfigDict keeps a field's type
    config.train.adv_clip_max = type(config.train.adv_clip_max)(s["adv_clip_max"])
    config.train.clip_range = s["clip_range"]
    config.train.timestep_fraction = s["timestep_fraction"]
    config.train.beta = s["kl_beta"]
    config.train.ema = False

    config.reward_fn = {s["reward"]: 1.0}                    # the driver's multi_score shim
    config.per_prompt_stat_tracking = True
    config.eval_freq = 1          # eval() is replaced by the driver's per-iteration clock (called every epoch)
    config.save_freq = 10**9      # no checkpoints (ditrl writes one at the end, timed apart)
    config.save_dir = os.path.join(s["work"], "flow_grpo-save")
    return config
