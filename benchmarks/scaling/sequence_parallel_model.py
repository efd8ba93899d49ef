#!/usr/bin/env python3
"""A model (not a measurement) of Wan2.2-T2V-A14B training memory and time per
H200 with Ulysses sequence parallelism, for benchmarks/results/scaling.md.

Memory per GPU = ZeRO-3 state / world + two gathered blocks (current and
prefetched, bf16) + activations, the last from the same model `ditrl plan`
prints (src/models/activation_memory.cpp): every block's input (B, T/N, D)
kept until backward, one recomputed block's per-token graph
(16 D + 2 F per token), fused attention (O(T) per head). Time per trained
(sample, step) pair = 4 forwards (no-grad forward, recompute, backward = 2)
at an assumed MFU, split over the N ranks of a group, plus the all-to-alls
(4 per attention and pass: q, k, v, out) at an assumed per-GPU all-to-all
bandwidth. Every assumption is a constant below.

    /usr/bin/python3 benchmarks/scaling/sequence_parallel_model.py
"""

GIB = 2**30

# Wan2.2-T2V-A14B (docs/families.md §2.2): two experts of this shape.
EXPERTS, LAYERS, DIM, HEADS, FFN, TEXT = 2, 40, 5120, 40, 13824, 512
PARAMS_PER_EXPERT = 14.3e9  # diffusers WanTransformer3DModel at this config
# 480p x 81 frames: VAE /8 spatial, /4 temporal (+1), patch (1, 2, 2).
TOKENS = ((81 - 1) // 4 + 1) * (480 // 8 // 2) * (832 // 8 // 2)  # 21 x 30 x 52 = 32760

BF16 = 2
PEAK_BF16_FLOPS = 989e12  # H200 dense bf16
MFU = 0.40                # assumed model FLOPs utilisation
A2A_BYTES_PER_S = 300e9   # assumed all-to-all bandwidth per GPU inside an NVLink node


def state_bytes(world, lora):
    params = EXPERTS * PARAMS_PER_EXPERT
    if lora:  # frozen bf16 base shards; adapters negligible
        return BF16 * params / world
    return (4 + 8 + 4 + 2) * params / world  # fp32 master, AdamW moments, fp32 grad, bf16 compute


def gathered_bytes():
    return 2 * BF16 * PARAMS_PER_EXPERT / LAYERS


def activation_bytes(sp, batch=1):
    local = TOKENS // sp
    saved = LAYERS * batch * local * DIM * BF16
    graph = batch * local * (16 * DIM + 2 * FFN) * BF16
    attention = 4 * batch * (HEADS // sp) * TOKENS * 2  # log-sum-exp rows
    return saved + graph + attention


def forward_flops():
    dense = 2 * PARAMS_PER_EXPERT * TOKENS
    attention = 4 * TOKENS * TOKENS * DIM * LAYERS  # q k^T and p v
    return dense + attention


def pair_seconds(sp):
    compute = 4 * forward_flops() / (PEAK_BF16_FLOPS * MFU) / sp
    # Per attention and pass each rank sends (N-1)/N of four (T/N, D) tensors.
    a2a = 0.0 if sp == 1 else 3 * LAYERS * 4 * (TOKENS // sp) * DIM * BF16 * (sp - 1) / sp / A2A_BYTES_PER_S
    return compute, a2a


def main():
    print(f"tokens per sample {TOKENS}; forward {forward_flops() / 1e15:.2f} PFLOP")
    print("| GPUs | SP | groups | state GiB/GPU (full FT / LoRA) | gathered GiB | activations GiB | "
          "total GiB (full FT / LoRA) | s per pair per group: compute + all-to-all | pairs/s (all GPUs) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for world in (8, 32):
        for sp in (1, 2, 4, 8):
            if HEADS % sp or TOKENS % sp:
                continue
            full, lora = state_bytes(world, False), state_bytes(world, True)
            act, gat = activation_bytes(sp), gathered_bytes()
            compute, a2a = pair_seconds(sp)
            groups = world // sp
            print(f"| {world} | {sp} | {groups} | {full / GIB:.1f} / {lora / GIB:.1f} | {gat / GIB:.2f} | "
                  f"{act / GIB:.1f} | {(full + gat + act) / GIB:.1f} / {(lora + gat + act) / GIB:.1f} | "
                  f"{compute:.2f} + {a2a:.3f} | {groups / (compute + a2a):.2f} |")


if __name__ == "__main__":
    main()
