#!/usr/bin/env bash
# The whole RL loop on one device (issue #52 points 1 and 6): `ditrl train` for a few rollouts per case with
# seeded weights, and for sd3 flow_grpo's own loop (benchmarks/peer/flow_grpo) on the same weights, prompt
# embeddings, resolution, steps, CFG, group, LoRA rank, precision and reward, the two sides alternating over
# rounds. loop_report.py prints per case: samples per device-second of the whole iteration, its split and
# the peak memory against `ditrl plan`; for sd3 the flow_grpo / ditrl ratio per round.
#
#   benchmarks/gpu/loop.sh --ditrl build/ditrl --out OUT [--size tiny|real] [--device cpu|cuda]
#       [--cases sd3,qwen_image,wan,flux,flux2] [--rounds 2] [--rollouts 4] [--flow-grpo DIR]
#
# --size tiny: the families' tiny presets with the loop's shape (CPU CI: bench.loop_tiny); real:
#   sd3         SD3.5-medium (diffusers' SD3Transformer2DModel, seeded init, shared by both sides), LoRA r32
#               alpha 64, 512 px, 10 steps all SDE and trained, CFG 4.5, PROMPTS x GROUP samples (8 x 8),
#               bf16 forward; reward: the PickScore architecture (CLIP ViT-H/14 + SD3's VAE decoder, random
#               weights: the real cost) exported by tools/export_reward.py (random_pickscore.py)
#   qwen_image  Qwen-Image (20B) LoRA r64 alpha 128 (attention + image/text MLPs, ditrl's Qwen defaults), true
#               CFG 4, noise 1.2, SDE window of 2 steps in [0, 5), group 16 (QWEN_SAMPLES): VeRL-Omni's
#               examples/flowgrpo_trainer/qwen_image/run_qwen_image_ocr_lora.sh (32 prompts x 16 over 4 GPUs, lr
#               3e-4, weight decay 1e-4, bf16). Assumed, not in that script: 512 px and 10 sampling steps (flow_grpo's
#               Qwen-Image setting), one prompt per GPU-run; analytic reward in place of its Qwen3-VL-8B OCR judge;
#               ditrl's seeded init (no weights file: 40 GB)
#   wan         Wan2.1-T2V-1.3B LoRA r32 at 832x480 x 33 frames (9 latent frames), 10 steps, CFG 5, 1 prompt x
#               4 samples, SDE window of 2 steps; analytic reward; ditrl's seeded init
#   flux        FLUX.1-dev (12B) LoRA r32 alpha 64 (ditrl's FLUX defaults), flow_grpo's pickscore_flux sampling:
#               512 px, 6 steps, distilled guidance 3.5 (no CFG), noise 0.9, group FLUX_SAMPLES (24); an SDE
#               window of 2 steps in [0, 5) (flow_grpo trains 5 of 6 steps); analytic reward; ditrl's seeded init
#   flux2       FLUX.2 [klein] 4B LoRA r64 alpha 128 at inputs/flux2_klein_grpo.toml's sampling (Flow-Factory's):
#               384 px, 8 steps, CFG 4 (klein has no guidance embedding), noise 0.7, SDE window of 2 steps in
#               [1, 4), group FLUX2_SAMPLES (16); analytic reward; ditrl's seeded init
# --flow-grpo: a flow_grpo checkout (github.com/yifan123/flow_grpo, never committed); without it the sd3
#   flow_grpo side is reported SKIPPED with the reason. Environment: PYTHON (default the ditrl venv's),
#   PROMPTS / GROUP (sd3's prompts per iteration and group size), QWEN_SAMPLES, WAN_SAMPLES, FLUX_SAMPLES, FLUX2_SAMPLES, DITRL_SET: extra deck
#   settings for every ditrl run, blank-separated (e.g. "parallel.recompute=false precision.attention=flash").
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SIZE=tiny DEVICE=cpu CASES=sd3,qwen_image,wan ROUNDS=2 ROLLOUTS=4 FLOW_GRPO= DITRL= OUT=
while (($#)); do
  case $1 in
    --size) SIZE=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --cases) CASES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --rollouts) ROLLOUTS=$2; shift 2 ;;
    --flow-grpo) FLOW_GRPO=$2; shift 2 ;;
    --ditrl) DITRL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "loop.sh: unknown argument $1"; sed -n 7,9p "$0"; exit 2 ;;
  esac
done
[[ $SIZE == tiny || $SIZE == real ]] || { echo "loop.sh: --size is tiny or real, got '$SIZE'"; exit 2; }
[[ $DEVICE == cpu || $DEVICE == cuda ]] || { echo "loop.sh: --device is cpu or cuda, got '$DEVICE'"; exit 2; }
[[ -x $DITRL ]] || { echo "loop.sh: --ditrl '$DITRL' is not an executable"; exit 2; }
[[ -n $OUT ]] || { echo "loop.sh: --out OUT is required"; exit 2; }
((ROLLOUTS >= 2)) || { echo "loop.sh: --rollouts must be >= 2 (the first is warm-up)"; exit 2; }
PY=${PYTHON:-$HOME/.cache/ditrl/venv/bin/python}
DITRL=$(realpath "$DITRL")
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
# flow_grpo's side needs its checkout and the Python it imports; else the report says SKIPPED and why.
PEER_SKIPPED=
if [[ -n $FLOW_GRPO ]]; then
  FLOW_GRPO=$(realpath "$FLOW_GRPO")
  if [[ ! -f $FLOW_GRPO/scripts/train_sd3.py ]]; then
    PEER_SKIPPED="SKIPPED: $FLOW_GRPO has no scripts/train_sd3.py (not a flow_grpo checkout)"
  elif missing=$("$PY" -c 'import importlib.util as u
print(" ".join(m for m in ("absl", "ml_collections", "peft", "accelerate", "diffusers") if u.find_spec(m) is None))') &&
    [[ -n $missing ]]; then
    PEER_SKIPPED="SKIPPED: $PY lacks flow_grpo's imports: $missing"
  fi
else
  PEER_SKIPPED="SKIPPED: no flow_grpo checkout (--flow-grpo)"
fi
[[ -n $PEER_SKIPPED ]] && FLOW_GRPO=
# CPU: one intra-op thread per side (both sides alike, as benchmarks/peer/flow_grpo); GPU: the defaults.
threads=1
DITRL_EXTRA=()
for setting in ${DITRL_SET:-}; do DITRL_EXTRA+=(--set "$setting"); done
[[ $DEVICE == cpu ]] && export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "size: $SIZE, device: $DEVICE, cases: $CASES, rounds: $ROUNDS, rollouts: $ROLLOUTS"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(getconf _NPROCESSORS_ONLN) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "gpu: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | paste -sd';' || true)"
  echo "ditrl: $("$DITRL" --version | head -1); extra settings: ${DITRL_SET:-none}"
  echo "flow_grpo: ${FLOW_GRPO:-none} @ ${FLOW_GRPO_COMMIT:-$(git -C "${FLOW_GRPO:-/nonexistent}" rev-parse HEAD 2>/dev/null || echo unknown)}"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt"
: >"$OUT/timeline.tsv"  # case, round, side, wall seconds

timed() {  # CASE ROUND SIDE LOG COMMAND...: runs it, one timeline row
  local case=$1 round=$2 side=$3 log=$4 t0
  shift 4
  t0=$(date +%s.%N)
  "$@" >"$log" 2>&1 || { echo "loop.sh: $case $side round $round failed, see $log"; tail -n 20 "$log"; exit 1; }
  printf '%s\t%s\t%s\t%s\n' "$case" "$round" "$side" "$(awk "BEGIN { print $(date +%s.%N) - $t0 }")" >>"$OUT/timeline.tsv"
  echo "$case round $round: $side $(tail -n 1 "$OUT/timeline.tsv" | cut -f4) s"
}

ditrl_side() {  # CASE ROUND DECK [--set ...]
  local case=$1 round=$2 deck=$3 run=$OUT/$1/ditrl-r$2
  shift 3
  rm -rf "$run"
  timed "$case" "$round" ditrl "$run.log" "$DITRL" train "$deck" --set "run.out_dir=\"$run\"" \
    --set "run.device=\"$DEVICE\"" --set run.deterministic=false --set "train.num_rollouts=$ROLLOUTS" "$@" \
    ${DITRL_EXTRA[@]+"${DITRL_EXTRA[@]}"}
}

# `ditrl plan`'s predicted peak for the deck as run (its lines kept for the report).
plan() {  # CASE DECK [--set ...]
  local case=$1 deck=$2
  shift 2
  "$DITRL" plan "$deck" --ranks 1 --set "run.device=\"$DEVICE\"" --set run.deterministic=false "$@" \
    ${DITRL_EXTRA[@]+"${DITRL_EXTRA[@]}"} |
    grep -E "predicted peak" >"$OUT/$case/plan.txt"
}

case_sd3() {
  local work=$OUT/sd3/work prompts group latent precision micro size_args=()
  if [[ $SIZE == real ]]; then prompts=${PROMPTS:-8} group=${GROUP:-8} latent=64 precision=bf16 micro=8; else
    prompts=${PROMPTS:-2} group=${GROUP:-4} latent=8 precision=fp32 micro=0; fi
  mkdir -p "$OUT/sd3"
  if [[ $SIZE == real ]] && ! "$PY" -c 'import transformers, tokenizers' 2>/dev/null; then
    echo "loop.sh: sd3 at real size exports the PickScore architecture with transformers and tokenizers; $PY lacks them"
    exit 1
  fi
  "$PY" benchmarks/peer/flow_grpo/prepare.py "$work" --size "$SIZE" --iterations "$ROLLOUTS" \
    --set use_lora=true --set "prompts=$((prompts * 2))" --set "prompts_per_iteration=$prompts" \
    --set "group_size=$group" --set "latent=$latent" --set "precision=\"$precision\"" \
    --set "device=\"$DEVICE\"" --set reward='"torchscript"' --set "reward_module=\"$work/reward.pt\"" \
    --set "threads=$threads" --set "micro_batch=$micro" >"$OUT/sd3/prepare.log"
  if [[ $SIZE == real ]]; then
    "$PY" benchmarks/gpu/random_pickscore.py "$work/reward-models" >"$OUT/sd3/reward.log"
    size_args=(--vae "$work/reward-models/vae" --pickscore "$work/reward-models/pickscore"
      --processor "$work/reward-models/processor")
  else
    size_args=(--tiny)
  fi
  (cd tools && "$PY" export_reward.py --family sd3 "${size_args[@]}" --prompts "$work/prompts/train.txt" \
    --out "$work/reward.pt") >>"$OUT/sd3/reward.log"
  plan sd3 "$work/ditrl.toml"
  local r
  for r in $(seq 1 "$ROUNDS"); do
    # Alternating order: both sides see the same background load over the rounds.
    if [[ -z $FLOW_GRPO ]]; then
      ditrl_side sd3 "$r" "$work/ditrl.toml"
    elif ((r % 2)); then
      ditrl_side sd3 "$r" "$work/ditrl.toml"
      flow_grpo_side "$r"
    else
      flow_grpo_side "$r"
      ditrl_side sd3 "$r" "$work/ditrl.toml"
    fi
  done
  [[ -z $PEER_SKIPPED ]] || echo "$PEER_SKIPPED" >"$OUT/sd3/flow_grpo.skipped"
}

flow_grpo_side() {  # ROUND
  timed sd3 "$1" flow_grpo "$OUT/sd3/flow_grpo-r$1.log" "$PY" benchmarks/peer/flow_grpo/flow_grpo_driver.py \
    --flow-grpo "$FLOW_GRPO" --settings "$OUT/sd3/work/settings.json" --out "$OUT/sd3/flow_grpo-r$1.jsonl"
}

# qwen_image and wan: ditrl alone (no peer loop here), decks from the family's tiny or real preset.
family_deck() {  # CASE PRESET LORA_RANK HEIGHT WIDTH FRAMES STEPS CFG_KEYS NOISE WINDOW SAMPLES PRECISION
  cat >"$OUT/$1/deck.toml" <<EOF
# benchmarks/gpu/loop.sh case $1 ($SIZE), written by the script
[run]
name = "loop_$1"
seed = 42
threads = $threads

[model]
family = "$1"
preset = "$2"

[model.lora]
enabled = true
rank = $3
alpha = $(($3 * 2)).0
init = "gaussian"

[precision]
master = "fp32"
reduce = "fp32"
forward = "${12}"

[rollout]
steps = $7
$8
sde = "sde"
noise_level = $9
samples_per_prompt = ${11}
batch = 1
strategy = "sde_window"
sde_steps = 2
window = ${10}
height = $4
width = $5
frames = $6

[reward]
kind = "analytic"
analytic = "brightness"

[train]
loss = "grpo"
lr = 3e-4
clip_range = 1e-4
adv_clip_max = 5.0
global_std = true
global_batch = ${11}
steps_per_rollout = 1
micro_batch = 1

[data]
synthetic_prompts = 4
EOF
}

case_family() {  # CASE
  local case=$1 r
  mkdir -p "$OUT/$case"
  if [[ $case == flux ]]; then
    if [[ $SIZE == real ]]; then
      family_deck flux flux.1-dev 32 64 64 1 6 'guidance_scale = 3.5' 0.9 "[0, 5]" "${FLUX_SAMPLES:-24}" bf16
    else
      family_deck flux tiny 32 8 8 1 6 'guidance_scale = 3.5' 0.9 "[0, 5]" 8 fp32
    fi
  elif [[ $case == flux2 ]]; then
    if [[ $SIZE == real ]]; then
      family_deck flux2 flux.2-klein-4b 64 48 48 1 8 'guidance_scale = 4.0' 0.7 "[1, 4]" "${FLUX2_SAMPLES:-16}" bf16
    else
      family_deck flux2 tiny 64 8 8 1 8 'guidance_scale = 4.0' 0.7 "[1, 4]" 8 fp32
    fi
  elif [[ $case == qwen_image ]]; then
    if [[ $SIZE == real ]]; then
      family_deck qwen_image qwen-image 64 64 64 1 10 $'guidance_scale = 4.0\ntrue_cfg_scale = 4.0' 1.2 "[0, 5]" "${QWEN_SAMPLES:-16}" bf16
    else
      family_deck qwen_image tiny 64 8 8 1 10 $'guidance_scale = 4.0\ntrue_cfg_scale = 4.0' 1.2 "[0, 5]" 8 fp32
    fi
  else
    if [[ $SIZE == real ]]; then
      family_deck wan wan2.1-t2v-1.3b 32 60 104 9 10 'guidance_scale = 5.0' 0.7 "[0, 2]" "${WAN_SAMPLES:-4}" bf16
    else
      family_deck wan tiny 32 8 8 3 10 'guidance_scale = 5.0' 0.7 "[0, 2]" 4 fp32
    fi
  fi
  plan "$case" "$OUT/$case/deck.toml"
  for r in $(seq 1 "$ROUNDS"); do ditrl_side "$case" "$r" "$OUT/$case/deck.toml"; done
}

IFS=, read -ra cases <<<"$CASES"
for c in "${cases[@]}"; do
  case $c in
    sd3) case_sd3 ;;
    qwen_image | wan | flux | flux2) case_family "$c" ;;
    *) echo "loop.sh: unknown case '$c' (sd3, qwen_image, wan, flux, flux2)"; exit 2 ;;
  esac
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"
# --check: every field of every case present (a number, or the flow_grpo side's SKIPPED reason), else exit 1.
"$PY" benchmarks/gpu/loop_report.py "$OUT" --check | tee "$OUT/report.md"
