#!/usr/bin/env bash
# The GPU training-step benchmark (scripts/gpu_check.sh runs it): one
# fwd + bwd + AdamW step of an SD3.5-medium-sized and a Wan2.1-1.3B-sized
# model, ditrl (bench_gpu_step: its families and ShardedParams on one rank)
# and PyTorch eager running diffusers' own transformer classes
# (diffusers_step.py), alternating (ROUNDS rounds, default 1) on the same device; report.md
# gives step times, the ratio, model TFLOP/s and MFU against the bf16 matmul
# ceiling measured in the same run (model FLOPs: the peer's flop_counter
# count of the same architecture at the same token counts).
#   [MODELS="sd3.5-medium wan2.1-1.3b"] [ROUNDS=1] [BATCH=1] [PROFILE=1] benchmarks/gpu/run.sh PYTHON OUT_DIR full|tiny BENCH_GPU_STEP
# (BATCH: samples per step on both sides, each at the model's token count; PROFILE=1: ditrl's first
# round then profiles two steps' CUDA kernels by family, appended to report.md)
# (tiny: the CPU size CI runs; the check kit runs one model per step, each within its time budget)
# Exit 77 (SKIPPED) where PYTHON has no diffusers.
set -uo pipefail
py=$1 out=$2 size=$3 ours=$4
here=$(dirname "$0")
# One round per side by default: the check kit has one 600 s call on the GPU
# for everything (build, tests, benchmark); ROUNDS=2 alternates twice.
device=cuda steps=(--warmup 3 --steps 10 --batch "${BATCH:-1}") rounds=($(seq 1 "${ROUNDS:-1}"))
[[ $size == tiny ]] && device=cpu steps=(--warmup 1 --steps 3 --batch "${BATCH:-1}") rounds=(1)
mkdir -p "$out"
models=(${MODELS:-sd3.5-medium wan2.1-1.3b})
for model in "${models[@]}"; do
  for round in "${rounds[@]}"; do
    profile=()
    [[ -n ${PROFILE:-} && $round == 1 ]] && profile=(--profile "$out/$model.profile.md")
    "$ours" --model "$model" --size "$size" --device "$device" "${steps[@]}" --out "$out/$model.ditrl.$round.json" \
      "${profile[@]}" || exit $?
    "$py" "$here/diffusers_step.py" --model "$model" --size "$size" --device "$device" "${steps[@]}" \
      --out "$out/$model.peer.$round.json" || exit $?
  done
done
"$py" - "$out" "$size" "$(cut -d' ' -f1-3 /proc/loadavg)" "${models[*]}" "${rounds[@]}" >"$out/report.md" <<'PY'
import json, sys
out, size, load, models = sys.argv[1:5]
rounds = sys.argv[5:]
print(f"## GPU training step ({size} size; load average at the end {load})\n")
print("| model | side | device | params | batch | image + text tokens | attention | step s (best round's median / min) "
      "| ditrl speedup | model TFLOP/s | bf16 matmul ceiling TFLOP/s | MFU | peak memory GiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for model in models.split():
    sides = {s: min((json.load(open(f"{out}/{model}.{s}.{r}.json")) for r in rounds), key=lambda x: x["step_s_median"])
             for s in ("ditrl", "peer")}
    peer = sides["peer"]
    flops, ceiling = peer["model_flops_per_step"], peer["matmul_ceiling_tflops"]
    for name in ("ditrl", "peer"):
        r = sides[name]
        tflops = flops / r["step_s_median"] / 1e12
        speedup = f"{peer['step_s_median'] / r['step_s_median']:.2f}x" if name == "ditrl" else ""
        mem = r.get("peak_memory_gib")
        print(f"| {model} | {r['side']} | {r['device']} | {r['params'] / 1e6:.2f} M | {r['batch']} | {r['image_tokens']} + "
              f"{r['text_tokens']} | {r['attention']} | {r['step_s_median']:.4f} / {r['step_s_min']:.4f} | {speedup} | "
              f"{tflops:.3g} | {ceiling:.3g} | {100 * tflops / ceiling:.1f}% | "
              f"{'-' if mem is None or mem < 0 else f'{mem:.1f}'} |")
print("\nBoth sides: fp32 master weights, bf16 compute, AdamW, MSE against a fixed target, only the named SDPA "
      "backend enabled. ditrl: ShardedParams on one rank (bf16 compute copies, fp32 gradient reduction, "
      "parallel.recompute = false and train.fused_adamw = true, as the peer keeps its activations and runs the fused "
      f"AdamW on CUDA); peer: bf16 autocast over fp32 parameters. {len(rounds)} alternating round(s) per side; the better round is shown.")
PY
for model in "${models[@]}"; do
  [[ -f $out/$model.profile.md ]] && { echo; cat "$out/$model.profile.md"; } >>"$out/report.md"
done
cat "$out/report.md"
