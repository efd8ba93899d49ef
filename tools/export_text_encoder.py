#!/usr/bin/env python3
"""Prepare prompt data for `ditrl encode-prompts`: tokenize prompts, export a text encoder.

ditrl does not run Python or tokenizers at train time. A prompt dataset is made in two steps
on a machine that has the models (Hugging Face `transformers`, the checkpoint folders):

  1. tokenize: prompts.txt (one prompt per line) -> prompts.jsonl, each line
       {"prompt": str, "tokens": {tokenizer_name: [ids...]}}   (+ one {"negative": true} line)
     with the ids of every tokenizer the family's text encoder reads, padded to a fixed length:
       sd3         clip_l [77], clip_g [77], t5 [256]      (CLIP-L, CLIP-G, T5-XXL tokenizers)
       qwen_image  qwen [34 + 512]                          (Qwen2.5-VL tokenizer, chat template)
       wan         umt5 [512]                               (UMT5-XXL tokenizer)
       flux        clip_l [77], t5 [512]                    (CLIP-L, T5-XXL tokenizers; FLUX.1-schnell: --t5-length 256)
       flux2       qwen3 [512]     FLUX.2 [klein] (Qwen3 tokenizer, chat template)
                   mistral3 [512]  FLUX.2-dev (Mistral-Small-3 processor, chat template with BFL's system message)
                   chosen by the folder: text_encoder/config.json's model_type, "qwen3" or "mistral3"
  2. export: torch.jit.trace the family's text path into one TorchScript module
       forward(tokens: Dict[str, Tensor]) -> Dict[str, Tensor]
     whose outputs carry the family's conditioning names and shapes (ditrl checks them):
       sd3         encoder_hidden_states [B, 333, 4096], pooled_projections [B, 2048]
       qwen_image  encoder_hidden_states [B, 512, 3584], encoder_hidden_states_mask [B, 512] int64
       wan         encoder_hidden_states [B, 512, 4096]  (zero-padded past each prompt, no mask)
       flux        encoder_hidden_states [B, 512, 4096] (T5, no mask), pooled_projections [B, 768] (CLIP-L pooler)
       flux2       encoder_hidden_states [B, 512, 3 x hidden]  (padding kept, no mask; [klein]: Qwen3 layers
                   9, 18, 27; dev: Mistral layers 10, 20, 30)
     and a string attribute `identity` (model ids + this script's version) that
     `ditrl encode-prompts` writes into the dataset's attributes.

Then:  ditrl encode-prompts --encoder encoder.pt --prompts prompts.jsonl --out prompts.h5 \
           --family sd3 --preset sd3.5-medium

Status: tokenize and export run in ditrl's tests on the real transformers classes (CLIP-L/G
with projection, T5, UMT5, Qwen2.5-VL, Qwen3, Mistral3) built from tiny configs with random
weights and saved as pipeline folders (tests/interop/export_tools.py):
the `ditrl encode-prompts` datasets equal the diffusers pipelines' own encode_prompt within 1e-7
(FLUX.2's stacked decoder layers: within 3e-6 at values up to 3.7).
The released checkpoints have NOT been run (the development machine has none). The trace uses a
math attention (tools/torchscript_compat.py), so the module runs in ditrl's LibTorch 1.13 build.
`export --tiny` builds a seeded stand-in with the tiny presets' shapes (tests/unit/test_export_tools.cpp).

Usage:
  export_text_encoder.py tokenize --family sd3 --model MODEL_DIR prompts.txt prompts.jsonl \
      [--negative ""]
  export_text_encoder.py export --family sd3 --model MODEL_DIR --out encoder.pt [--dtype bf16]
  export_text_encoder.py export --family sd3 --tiny --out tiny_encoder.pt
MODEL_DIR is the diffusers pipeline folder (e.g. stable-diffusion-3.5-medium/, Qwen-Image/,
Wan2.2-T2V-A14B-Diffusers/, FLUX.2-dev/) with its tokenizer*/ and text_encoder*/ subfolders.
"""

import argparse
import json
import sys
from typing import Dict, List

import torch

from torchscript_compat import math_attention

VERSION = "ditrl-export-text-encoder 2"
FAMILIES = ("sd3", "qwen_image", "wan", "flux", "flux2")

# Qwen-Image pipeline prompt template; its first 34 tokens (the system part) are dropped
# from the hidden states (diffusers pipeline_qwenimage.py).
QWEN_TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
                 "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
                 "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
QWEN_DROP = 34
QWEN_MAX = 512
SD3_T5_MAX = 256
WAN_MAX = 512
FLUX_T5_MAX = 512  # FluxPipeline's max_sequence_length default (FLUX.1-dev)
# FLUX.2 [klein] (diffusers pipeline_flux2_klein.py): 512 tokens of the chat-templated prompt,
# the hidden states after these Qwen3 layers stacked along the features.
FLUX2_MAX = 512
FLUX2_LAYERS = (9, 18, 27)
# FLUX.2-dev (diffusers pipeline_flux2.py): Mistral-Small-3's chat template over Black Forest Labs'
# system message and the prompt (no generation prompt), padded to 512, and the hidden states after
# these layers of Mistral3's language model.
FLUX2_DEV_SYSTEM = ("You are an AI that reasons about image descriptions. You give structured responses focusing "
                    "on object relationships, object\nattribution and actions without speculation.")
FLUX2_DEV_LAYERS = (10, 20, 30)
FLUX2_TEXT_LAYERS = {"qwen3": FLUX2_LAYERS, "mistral3": FLUX2_DEV_LAYERS}


def fail(message: str) -> None:
    sys.exit(f"export_text_encoder.py: {message}")


def flux2_text_encoder(model: str) -> str:
    """"qwen3" (FLUX.2 [klein]) or "mistral3" (FLUX.2-dev): read from the pipeline folder, so that
    tokenize and export of one folder always agree and no option can pick the wrong text path."""
    path = f"{model}/text_encoder/config.json"
    try:
        with open(path, encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError) as e:
        fail(f"{path}: cannot read the FLUX.2 text encoder's config ({e})")
    if model_type not in FLUX2_TEXT_LAYERS:
        fail(f"{path}: model_type {model_type!r}, expected \"qwen3\" (FLUX.2 [klein]) or \"mistral3\" (FLUX.2-dev)")
    return model_type


# --------------------------------------------------------------------------- tokenize

def tokenizers_for(family: str, model: str, t5_length: int = FLUX_T5_MAX):
    """(name, tokenizer, length) per tokenizer the family's encoder reads."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        fail("tokenize needs the `transformers` package (pip install transformers sentencepiece)")
    load = lambda sub: AutoTokenizer.from_pretrained(f"{model}/{sub}")  # noqa: E731
    if family == "sd3":
        return [("clip_l", load("tokenizer"), 77), ("clip_g", load("tokenizer_2"), 77),
                ("t5", load("tokenizer_3"), SD3_T5_MAX)]
    if family == "qwen_image":
        return [("qwen", load("tokenizer"), QWEN_DROP + QWEN_MAX)]
    if family == "flux":
        return [("clip_l", load("tokenizer"), 77), ("t5", load("tokenizer_2"), t5_length)]
    if family == "flux2" and flux2_text_encoder(model) == "mistral3":
        # The pipeline tokenizes through the processor: its chat template renders typed content blocks.
        from transformers import AutoProcessor
        return [("mistral3", AutoProcessor.from_pretrained(f"{model}/tokenizer"), FLUX2_MAX)]
    if family == "flux2":
        return [("qwen3", load("tokenizer"), FLUX2_MAX)]
    return [("umt5", load("tokenizer"), WAN_MAX)]


def token_ids(name: str, tokenizer, length: int, text: str) -> List[int]:
    if name == "mistral3":
        # Images are not passed, so an "[IMG]" in the prompt is dropped as the pipeline does.
        chat = [{"role": "system", "content": [{"type": "text", "text": FLUX2_DEV_SYSTEM}]},
                {"role": "user", "content": [{"type": "text", "text": text.replace("[IMG]", "")}]}]
        ids = tokenizer.apply_chat_template([chat], add_generation_prompt=False, tokenize=True, return_dict=True,
                                            padding="max_length", truncation=True, max_length=length)["input_ids"][0]
        ids = [int(i) for i in ids]
        if len(ids) != length:
            fail(f"chat template gave {len(ids)} ids, expected {length}")
        return ids
    if name == "qwen":
        text = QWEN_TEMPLATE.format(text)
    if name == "qwen3":
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
    ids = tokenizer(text, padding="max_length", max_length=length, truncation=True)["input_ids"]
    if len(ids) != length:
        fail(f"tokenizer returned {len(ids)} ids, expected {length}")
    return ids


def tokenize(args: argparse.Namespace) -> None:
    with open(args.prompts, encoding="utf-8") as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        fail(f"{args.prompts}: no prompts (one per line)")
    toks = tokenizers_for(args.family, args.model, args.t5_length)
    lines = [(p, False) for p in prompts] + ([(args.negative, True)] if args.negative is not None else [])
    with open(args.out, "w", encoding="utf-8") as out:
        for text, negative in lines:
            row = {"prompt": text, "tokens": {n: token_ids(n, t, L, text) for n, t, L in toks}}
            if negative:
                row["negative"] = True
            out.write(json.dumps(row) + "\n")
    print(f"wrote {len(lines)} lines to {args.out}")


# --------------------------------------------------------------------------- export

class SD3Text(torch.nn.Module):
    """SD3 pipeline text path: CLIP-L || CLIP-G penultimate states (zero-padded to the T5
    width) followed by T5 states on the sequence axis; pooled = CLIP-L || CLIP-G pooled."""

    def __init__(self, clip_l, clip_g, t5, t5_width: int):
        super().__init__()
        self.clip_l, self.clip_g, self.t5, self.t5_width = clip_l, clip_g, t5, t5_width

    def forward(self, tokens: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        out_l = self.clip_l(tokens["clip_l"], output_hidden_states=True)
        out_g = self.clip_g(tokens["clip_g"], output_hidden_states=True)
        clip = torch.cat([out_l.hidden_states[-2], out_g.hidden_states[-2]], dim=-1)
        clip = torch.nn.functional.pad(clip, (0, self.t5_width - clip.shape[-1]))
        t5 = self.t5(tokens["t5"]).last_hidden_state
        pooled = torch.cat([out_l.text_embeds, out_g.text_embeds], dim=-1)
        return {"encoder_hidden_states": torch.cat([clip, t5], dim=1).float(),
                "pooled_projections": pooled.float()}


class QwenText(torch.nn.Module):
    """Qwen-Image text path: last hidden state of Qwen2.5-VL's language model on the templated
    prompt, template tokens dropped, left-aligned and zero-padded to 512 with its mask."""

    def __init__(self, lm, pad_id: int):
        super().__init__()
        self.lm, self.pad_id = lm, pad_id

    def forward(self, tokens: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        ids = tokens["qwen"]
        mask = (ids != self.pad_id).long()
        states = self.lm(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
        states = states[:, QWEN_DROP:] * mask[:, QWEN_DROP:, None].to(states.dtype)
        return {"encoder_hidden_states": states.float(), "encoder_hidden_states_mask": mask[:, QWEN_DROP:]}


class WanText(torch.nn.Module):
    """Wan text path: UMT5-XXL encoder states, zeroed past each prompt's length (the pipeline
    truncates to the real length, then zero-pads to 512)."""

    def __init__(self, umt5, pad_id: int):
        super().__init__()
        self.umt5, self.pad_id = umt5, pad_id

    def forward(self, tokens: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        ids = tokens["umt5"]
        mask = (ids != self.pad_id).long()
        states = self.umt5(input_ids=ids, attention_mask=mask).last_hidden_state
        return {"encoder_hidden_states": (states * mask[:, :, None].to(states.dtype)).float()}


class FluxText(torch.nn.Module):
    """FLUX.1 pipeline text path: T5 encoder states (no attention mask, padding included, as
    FluxPipeline runs it) and CLIP-L's pooler output."""

    def __init__(self, clip_l, t5):
        super().__init__()
        self.clip_l, self.t5 = clip_l, t5

    def forward(self, tokens: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        pooled = self.clip_l(tokens["clip_l"], output_hidden_states=False).pooler_output
        states = self.t5(tokens["t5"], output_hidden_states=False).last_hidden_state
        return {"encoder_hidden_states": states.float(), "pooled_projections": pooled.float()}


class Flux2Text(torch.nn.Module):
    """FLUX.2 text path: the hidden states after three layers of the decoder ([klein]: Qwen3 9, 18,
    27; dev: Mistral 10, 20, 30) on the templated, padded prompt (attention masked, padding positions
    kept), concatenated per token."""

    def __init__(self, lm, name: str, pad_id: int):
        super().__init__()
        self.lm, self.name, self.layers, self.pad_id = lm, name, FLUX2_TEXT_LAYERS[name], pad_id

    def forward(self, tokens: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        ids = tokens[self.name]
        mask = (ids != self.pad_id).long()
        hidden = self.lm(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False).hidden_states
        states = torch.stack([hidden[k] for k in self.layers], dim=1)  # [B, 3, L, H]
        b, n, length, width = states.shape
        return {"encoder_hidden_states": states.permute(0, 2, 1, 3).reshape(b, length, n * width).float()}


def real_encoder(family: str, model: str, dtype: torch.dtype):
    try:
        import transformers as tf
    except ImportError:
        fail("export needs the `transformers` package and the model folder")
    kw = {"dtype": dtype}
    if family == "sd3":
        t5 = tf.T5EncoderModel.from_pretrained(f"{model}/text_encoder_3", **kw)
        pad = tf.AutoTokenizer.from_pretrained(f"{model}/tokenizer_3").pad_token_id
        return SD3Text(tf.CLIPTextModelWithProjection.from_pretrained(f"{model}/text_encoder", **kw),
                       tf.CLIPTextModelWithProjection.from_pretrained(f"{model}/text_encoder_2", **kw),
                       t5, t5.config.d_model), f"{model} (CLIP-L, CLIP-G, T5-XXL)", pad
    if family == "flux":
        pad = tf.AutoTokenizer.from_pretrained(f"{model}/tokenizer_2").pad_token_id
        return FluxText(tf.CLIPTextModel.from_pretrained(f"{model}/text_encoder", **kw),
                        tf.T5EncoderModel.from_pretrained(f"{model}/text_encoder_2", **kw)), \
            f"{model} (CLIP-L pooled, T5-XXL)", pad
    name = flux2_text_encoder(model) if family == "flux2" else ""
    pad = tf.AutoTokenizer.from_pretrained(f"{model}/tokenizer").pad_token_id
    if family == "qwen_image":
        lm = tf.Qwen2_5_VLForConditionalGeneration.from_pretrained(f"{model}/text_encoder", **kw)
        return QwenText(lm, pad), f"{model} (Qwen2.5-VL text path)", pad
    if name == "mistral3":
        # Only the language model runs: with no image the vision tower is unused, and the hidden
        # states are those of the full model without its 131k-word LM head.
        lm = tf.Mistral3ForConditionalGeneration.from_pretrained(f"{model}/text_encoder", **kw).model.language_model
        return Flux2Text(lm, name, pad), f"{model} (Mistral3 layers {FLUX2_DEV_LAYERS})", pad
    if name == "qwen3":
        lm = tf.Qwen3ForCausalLM.from_pretrained(f"{model}/text_encoder", **kw)
        return Flux2Text(lm, name, pad), f"{model} (Qwen3 layers {FLUX2_LAYERS})", pad
    umt5 = tf.UMT5EncoderModel.from_pretrained(f"{model}/text_encoder", **kw)
    return WanText(umt5, pad), f"{model} (UMT5-XXL)", pad


class TinyText(torch.nn.Module):
    """Seeded stand-in with the family's output names and the tiny presets' shapes: an
    embedding table per tokenizer, mean-pooled where the family has a pooled output."""

    def __init__(self, family: str):
        super().__init__()
        torch.manual_seed(0)
        self.family = family
        self.embed = torch.nn.ModuleDict({n: torch.nn.Embedding(1000, w) for n, w in TINY[family]["embed"].items()})

    def forward(self, tokens: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        spec = TINY[self.family]
        states = torch.cat([self.embed[n](tokens[n] % 1000) for n in spec["embed"]], dim=1)
        out = {"encoder_hidden_states": states[:, :spec["text_tokens"]]}
        if self.family in ("sd3", "flux"):
            out["pooled_projections"] = states.mean(dim=1)[:, :spec["pooled"]]
        if self.family == "qwen_image":
            out["encoder_hidden_states_mask"] = torch.ones_like(tokens["qwen"][:, :spec["text_tokens"]])
        return out


# Conditioning shapes of the tiny presets (src/models/{sd3,qwen_image,wan,flux,flux2}/).
TINY = {
    "sd3": {"embed": {"clip_l": 48, "t5": 48}, "lengths": {"clip_l": 4, "t5": 4}, "text_tokens": 8, "pooled": 32},
    "qwen_image": {"embed": {"qwen": 32}, "lengths": {"qwen": 8}, "text_tokens": 8},
    "wan": {"embed": {"umt5": 32}, "lengths": {"umt5": 8}, "text_tokens": 8},
    "flux": {"embed": {"clip_l": 32, "t5": 32}, "lengths": {"clip_l": 4, "t5": 8}, "text_tokens": 8, "pooled": 24},
    "flux2": {"embed": {"qwen3": 32}, "lengths": {"qwen3": 8}, "text_tokens": 8},
}


def example_tokens(family: str, tiny: bool, pad_id: int = 0, t5_length: int = FLUX_T5_MAX,
                   model: str = "") -> Dict[str, torch.Tensor]:
    """Tracing inputs. The second row is half padding: a trace of unpadded rows only would record
    the attention path without a mask (transformers drops an all-true mask) and ignore padding."""
    if tiny:
        return {n: torch.arange(L, dtype=torch.long).repeat(2, 1) for n, L in TINY[family]["lengths"].items()}
    if family == "flux2":
        lengths = {flux2_text_encoder(model): FLUX2_MAX}
    else:
        lengths = {"sd3": {"clip_l": 77, "clip_g": 77, "t5": SD3_T5_MAX}, "qwen_image": {"qwen": QWEN_DROP + QWEN_MAX},
                   "wan": {"umt5": WAN_MAX}, "flux": {"clip_l": 77, "t5": t5_length}}[family]
    out = {}
    for n, L in lengths.items():
        ids = torch.full((2, L), pad_id + 1, dtype=torch.long)
        ids[1, L // 2:] = pad_id
        out[n] = ids
    return out


class Exported(torch.nn.Module):
    """The traced text path plus the `identity` attribute ditrl records."""
    identity: str

    def __init__(self, traced, identity: str):
        super().__init__()
        self.traced = traced
        self.identity = identity

    def forward(self, tokens: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        return self.traced(tokens)


def export(args: argparse.Namespace) -> None:
    if args.tiny == bool(args.model):
        fail("export needs exactly one of --model MODEL_DIR or --tiny")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if args.tiny:
        encoder, identity, pad = TinyText(args.family), f"tiny-{args.family} seed 0", 0
    else:
        encoder, identity, pad = real_encoder(args.family, args.model, dtype)
    encoder.eval()
    example = example_tokens(args.family, args.tiny, pad, args.t5_length, args.model)
    with torch.no_grad(), math_attention():
        traced = torch.jit.trace(encoder, (example,), strict=False)
    module = torch.jit.script(Exported(traced, f"{identity}; {args.dtype}; {VERSION}"))
    module.save(args.out)
    with torch.no_grad():
        shapes = {k: list(v.shape) for k, v in module(example).items()}
    print(f"wrote {args.out}: {shapes}")


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tokenize", help="prompts.txt -> prompts.jsonl with token ids")
    t.add_argument("--family", required=True, choices=FAMILIES)
    t.add_argument("--model", required=True, help="diffusers pipeline folder (tokenizer*/ subfolders)")
    t.add_argument("--negative", default=None, help="negative prompt for CFG runs (\"\" = empty prompt)")
    t.add_argument("--t5-length", type=int, default=FLUX_T5_MAX,
                   help="flux: T5 tokens per prompt (max_sequence_length: 512 dev, 256 schnell)")
    t.add_argument("prompts", help="text file, one prompt per line")
    t.add_argument("out", help="JSONL output for ditrl encode-prompts")
    e = sub.add_parser("export", help="trace the family's text encoder into TorchScript")
    e.add_argument("--family", required=True, choices=FAMILIES)
    e.add_argument("--model", help="diffusers pipeline folder (text_encoder*/ subfolders)")
    e.add_argument("--tiny", action="store_true", help="seeded tiny encoder for the tiny presets (tests)")
    e.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "fp16"),
                   help="encoder weights dtype (outputs are written as fp32)")
    e.add_argument("--t5-length", type=int, default=FLUX_T5_MAX, help="flux: T5 tokens the trace takes")
    e.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    (tokenize if args.command == "tokenize" else export)(args)


if __name__ == "__main__":
    main(sys.argv[1:])
