#!/usr/bin/env python3
"""Where each recipe stops scaling on 1-32 H200 nodes: a MODEL, not a measurement.

    /usr/bin/python3 benchmarks/scaling/recipe_model.py build/ditrl > /tmp/recipe_model.md

Per recipe (inputs/*.toml), per rollout and per GPU:
  compute  = the recipe's forward passes (rollout steps x CFG x samples on the GPU, then per trained
             (sample, step) pair: forward, the per-block recompute, the backward, the KL or NFT
             reference forward) at the per-sample rate measured on one H200
             (benchmarks/results/gpu_check.md, call 5);
  gathers  = one all-gather of the compute-dtype weights per DiT call (ZeRO-3: frozen weights are
             sharded too), only the active expert of a two-expert model;
  reduce-scatter = the fp32 gradients of the trainable parameters once per micro-batch;
  bytes from `ditrl plan` (parameter shapes), times (N-1)/N, at a bus bandwidth per GPU.
A pass takes max(compute, communication): ditrl gathers one unit ahead and reduce-scatters a unit's
gradient while the next one runs backward (docs/design.md). Samples are split evenly over ranks;
a rank with no sample waits for the others.
"""

import math
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Measured on one H200 (benchmarks/results/gpu_check.md, call 5, commit e550e3f): the per-sample
# part of a bf16 training step (forward + backward, full fine-tune, no recompute) as achieved
# dense-bf16 TFLOP/s. SD3.5-medium: (0.3363 - 0.1978) s per extra sample for 35.8 TFLOP = 260;
# Wan2.1-1.3B: 40.3% of 989 at batch 1 = 399 (its fixed part is not separated: an upper bound).
# Qwen-Image (MMDiT) takes SD3's rate, LTX (video DiT with cross-attention) Wan's: not measured.
RATE_TFLOPS = {"sd3": 260.0, "qwen_image": 260.0, "wan": 399.0, "ltx": 399.0}

# Bus bandwidth per GPU (GB/s, nccl-tests' convention): inside one node NVLink 4 (H200 HGX),
# across nodes one 400 Gb/s NDR NIC per GPU. Assumed, to be replaced by `ditrl preflight`'s figures.
BUSBW_NVLINK = 370.0
BUSBW_IB = 46.0
GPUS_PER_NODE = 8
NODES = [1, 4, 8, 16, 32]

ROW = re.compile(r"^(\S+)(?: \(frozen\))?\s+(\S+)\s+\[([\d, ]*)\]")
TOKENS = re.compile(r"(\d+) tokens \+ (\d+) text tokens")


def plan(ditrl, deck):
    """Parameter rows and token counts of the deck's model, from `ditrl plan`."""
    text = subprocess.run([ditrl, "plan", str(deck), "--ranks", "8"], check=True, capture_output=True,
                          text=True).stdout
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m and m.group(3):
            rows.append((m.group(1), m.group(2), math.prod(int(x) for x in m.group(3).split(","))))
    totals = re.search(r"(\d+) elements, (\d+) trainable", text)
    tokens = TOKENS.search(text)
    return rows, int(totals.group(1)), int(totals.group(2)), int(tokens.group(1)), int(tokens.group(2))


def expert_of(unit):
    # "transformer_2.blocks.3" -> "transformer_2"; single-transformer units have no expert prefix.
    head = unit.split(".")[0]
    return head if head.startswith("transformer") and "." in unit and not head.endswith("blocks") else ""


def model_shape(rows, family):
    """Active parameters of one forward (one expert; LTX's video stream), blocks and width."""
    experts = sorted({expert_of(u) for _, u, _ in rows if expert_of(u)})
    first = experts[0] if experts else ""
    cross_modal = ("audio", "a2v", "v2a", "av_ca")
    active = sum(n for name, unit, n in rows
                 if (not experts or expert_of(unit) in ("", first))
                 and not (family == "ltx" and any(k in name for k in cross_modal)))
    blocks = {u for _, u, _ in rows if re.search(r"blocks\.\d+$", u) and (not experts or u.startswith(first))}
    width = next(n for name, _, n in rows if name.endswith("to_q.weight"))
    return active, len(blocks), int(math.isqrt(width)), max(1, len(experts))


def forward_tflop(family, active, blocks, width, img, txt):
    """One sample's forward: the linear layers plus attention's two matmuls."""
    if family in ("sd3", "qwen_image"):  # joint attention: text tokens run through every block
        seq = img + txt
        return (2 * active * seq + 4 * blocks * seq * seq * width) / 1e12
    return (2 * active * img + 4 * blocks * width * (img * img + img * txt)) / 1e12


def recipe(deck_path, ditrl):
    deck = tomllib.loads(deck_path.read_text())
    r, t, m = deck["rollout"], deck["train"], deck["model"]
    family = m["family"]
    rows, elements, trainable, img, txt = plan(ditrl, deck_path)
    active, blocks, width, experts = model_shape(rows, family)
    loss = t.get("loss", "grpo")
    lora = m.get("lora", {}).get("enabled", False)
    guided = r.get("guidance_scale", 1.0) > 1.0
    steps = r.get("steps", 10)
    samples = r["batch"] * r.get("samples_per_prompt", 1)
    if loss == "grpo":
        pairs_per_sample = r.get("sde_steps", 1)
    elif loss == "nft":
        pairs_per_sample = int(steps * r.get("timestep_fraction", 1.0))
    else:
        pairs_per_sample = 1
    parallel = deck.get("parallel", {})
    recompute = parallel.get("recompute", True)
    backward = 1.0 if lora else 2.0  # LoRA: input gradients only; the frozen weights get none
    train_cfg = 2 if (guided and loss == "grpo") else 1
    reference = (train_cfg if t.get("kl_beta", 0.0) > 0 else 0) + (1 if loss == "nft" else 0)
    fwd_s = forward_tflop(family, active, blocks, width, img, txt) / RATE_TFLOPS[family]
    return {
        "name": deck_path.stem, "family": family, "loss": loss, "lora": lora, "samples": samples,
        "global_batch": t["global_batch"], "micro_batch": t.get("micro_batch", 1),
        "microgroup": r.get("microgroup", 0) or t.get("micro_batch", 1), "pairs_per_sample": pairs_per_sample,
        "steps": 0 if loss == "sft" else steps,  # SFT trains on the dataset's latents: no sampling
        "rollout_fwds": 0 if loss == "sft" else steps * (2 if guided else 1),
        "train_fwds": train_cfg * (1 + (1 if recompute else 0) + backward) + reference,
        # gathered passes per micro-batch: the forward, and the recompute unless the forward's
        # gathered units stay resident until the backward (reshard_after_forward = false)
        "train_passes": train_cfg * (2 if recompute and parallel.get("reshard_after_forward", True) else 1)
        + (1 if reference else 0),
        "keep_gathered": parallel.get("rollout_keep_gathered", False), "train_cfg": train_cfg,
        "reference": 1 if reference else 0,
        "fwd_s": fwd_s, "gather_gb": 2 * elements / experts / 1e9, "rs_gb": 4 * trainable / 1e9,
        "active_b": active / 1e9, "elements_b": elements / 1e9, "img": img, "txt": txt,
    }


def per_rollout(c, gpus):
    """Seconds per rollout on every GPU, its compute and communication parts."""
    busbw = BUSBW_NVLINK if gpus <= GPUS_PER_NODE else BUSBW_IB
    share = (gpus - 1) / gpus
    gather_s = c["gather_gb"] * share / busbw
    rs_s = c["rs_gb"] * share / busbw
    per_gpu = math.ceil(c["samples"] / gpus)
    calls = math.ceil(per_gpu / c["microgroup"])
    # rollout: each denoising step is `calls` DiT calls (CFG's two halves in one), one gather each
    roll_compute = c["rollout_fwds"] * per_gpu * c["fwd_s"]
    roll_comm = (min(1, c["steps"]) if c["keep_gathered"] else c["steps"] * calls) * gather_s
    pairs = per_gpu * c["pairs_per_sample"]
    micro = math.ceil(pairs / c["micro_batch"])
    train_compute = c["train_fwds"] * pairs * c["fwd_s"]
    train_comm = micro * (c["train_passes"] * gather_s + rs_s)
    total = max(roll_compute, roll_comm) + max(train_compute, train_comm)
    bound = [f"{phase}'s gathers take {comm / compute:.1f}x its compute"
             for phase, compute, comm in (("the rollout", roll_compute, roll_comm),
                                          ("training", train_compute, train_comm)) if comm > compute]
    return total, roll_compute + train_compute, roll_comm + train_comm, "; ".join(bound)


def resident(c):
    """The same recipe with the gathered weights kept resident: rollout_keep_gathered = true
    (one gather per rollout) and reshard_after_forward = false (no gather for the recompute)."""
    return dict(c, keep_gathered=True, train_passes=c["train_cfg"] + c["reference"])


def report(cases):
    out = ["| recipe | GPUs | samples / GPU | s per rollout | compute s | comm s | comm / compute | "
           "samples/s per GPU | efficiency vs 1 node |", "|---|---|---|---|---|---|---|---|---|"]
    stops = []
    for c in cases:
        base_total = per_rollout(c, GPUS_PER_NODE)[0]
        base = c["samples"] / base_total / GPUS_PER_NODE
        stop = None
        for nodes in NODES:
            gpus = nodes * GPUS_PER_NODE
            total, compute, comm, bound = per_rollout(c, gpus)
            rate = c["samples"] / total / gpus
            eff = rate / base
            if stop is None and (eff < 0.8 or gpus > c["samples"]):
                stop = (gpus, "idle GPUs: the rollout has fewer samples than GPUs" if gpus > c["samples"]
                        else bound or "uneven split of samples over GPUs")
            out.append(f"| {c['name']} | {gpus} | {c['samples'] / gpus:.1f} | {total:.2f} | {compute:.2f} | "
                       f"{comm:.2f} | {comm / compute:.3f} | {rate:.3f} | {eff:.0%} |")
        stops.append((c, stop))
    return out, stops


def main():
    ditrl = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "build" / "ditrl")
    decks = sorted(p for p in (ROOT / "inputs").glob("*.toml") if p.stem != "quickstart")
    cases = [recipe(p, ditrl) for p in decks]
    print("| recipe | model | active / all params (B) | tokens (image + text) | samples per rollout | "
          "trained pairs per sample | forward s per sample (modelled) | gather GB per pass | RS GB per micro-batch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in cases:
        kind = f"{c['family']} {c['loss']}{' LoRA' if c['lora'] else ' full'}"
        print(f"| {c['name']} | {kind} | {c['active_b']:.2f} / {c['elements_b']:.2f} | {c['img']} + {c['txt']} | "
              f"{c['samples']} | {c['pairs_per_sample']} | {c['fwd_s']:.4f} | {c['gather_gb']:.2f} | "
              f"{c['rs_gb']:.3f} |")
    for title, variant in (("As the recipes are written", cases),
                           ("Gathered weights kept resident (rollout_keep_gathered = true, "
                            "reshard_after_forward = false)", [resident(c) for c in cases])):
        table, stops = report(variant)
        print(f"\n### {title}\n")
        print("\n".join(table))
        print()
        for c, stop in stops:
            where = (f"stops scaling at {stop[0]} GPUs ({stop[0] // GPUS_PER_NODE} nodes): {stop[1]}" if stop
                     else f"scales to {NODES[-1]} nodes (efficiency >= 80%)")
            print(f"- {c['name']}: {where}")

if __name__ == "__main__":
    main()
