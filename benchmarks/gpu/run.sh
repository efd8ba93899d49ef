#!/usr/bin/env bash
# The GPU training-step benchmark (scripts/gpu_check.sh runs it): diffusers'
# SD3.5-medium-sized and Wan2.1-1.3B-sized transformers, one fwd + bwd + AdamW
# step each (benchmarks/gpu/diffusers_step.py), and report.md with step time,
# model TFLOP/s and MFU against the bf16 matmul ceiling measured in the same run.
#   benchmarks/gpu/run.sh PYTHON OUT_DIR full|tiny     (tiny: the CPU size CI runs)
# Exit 77 (SKIPPED) where PYTHON has no diffusers.
set -uo pipefail
py=$1 out=$2 size=$3
here=$(dirname "$0")
device=cuda steps=(--warmup 3 --steps 10)
[[ $size == tiny ]] && device=cpu steps=(--warmup 1 --steps 3)
mkdir -p "$out"
for model in sd3.5-medium wan2.1-1.3b; do
  "$py" "$here/diffusers_step.py" --model "$model" --size "$size" --device "$device" "${steps[@]}" \
    --out "$out/$model.json" || exit $?
done
"$py" - "$out" "$size" >"$out/report.md" <<'PY'
import json, sys
out, size = sys.argv[1], sys.argv[2]
print(f"## GPU training step ({size} size)\n")
print("| model | side | device | params | image + text tokens | attention | step s (median / min) | model TFLOP/s | bf16 matmul ceiling TFLOP/s | MFU |")
print("|---|---|---|---|---|---|---|---|---|---|")
for model in ("sd3.5-medium", "wan2.1-1.3b"):
    r = json.load(open(f"{out}/{model}.json"))
    print(f"| {model} | {r['side']} | {r['device']} | {r['params'] / 1e6:.2f} M | {r['image_tokens']} + {r['text_tokens']} | "
          f"{r['attention']} | {r['step_s_median']:.4f} / {r['step_s_min']:.4f} | {r['model_tflops']:.3g} | "
          f"{r['matmul_ceiling_tflops']:.3g} | {100 * r['mfu']:.1f}% |")
print("\nModel FLOPs: torch.utils.flop_counter over one whole step (forward + backward matmuls and attention);"
      " precision: fp32 masters, bf16 autocast, AdamW. The ditrl side is not measured yet (not written).")
PY
cat "$out/report.md"
