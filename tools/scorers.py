"""The reward scorers that tools/reward_server.py serves and tools/export_reward.py exports.

A torch scorer is two parts:
  * `head`: an nn.Module, forward(pixels [N, 3, S, S] CLIP-normalised, text [N, D]) -> [N] scores; it
    traces, so export_reward.py puts it into the TorchScript reward module;
  * `encode_prompts(prompts) -> [N, D]`: the per-prompt text features (Python: tokenizers do not
    trace), computed per request by the server and once per prompt list by the exporter.
`Scorer.preprocess` turns RGB in [0, 1] of any size into the head's input (shortest side to S,
bicubic; centre crop; CLIP mean/std), in torch ops so that it scripts.

Scorers and the published scoring they reproduce (the real architectures from their packages):
  pickscore  transformers CLIPModel (PickScore_v1, CLIP-H): logit_scale.exp() * cos(image, prompt)
  hpsv2      open_clip CLIP (HPS v2.1: ViT-H-14): cos(image, prompt), as hpsv2's scorer
  clip       transformers CLIPModel (openai/clip-vit-large-patch14): max(100 * cos(image, prompt), 0),
             torchmetrics' CLIPScore per sample
  imagereward  ImageReward v1.0 (image-reward's BLIP ViT + BLIP text encoder cross-attending to the
             image tokens, [CLS] through its MLP 768-1024-128-64-16-1, (r - mean) / std), on
             transformers' BlipVisionModel and BlipTextModel with the checkpoint's tensors renamed
  aesthetic  LAION aesthetic predictor v2 (simple-aesthetics-predictor's AestheticsPredictorV2Linear:
             CLIP ViT-L/14 image embedding, normalised, then the MLP 768-1024-128-64-16-1); no prompt
  ocr        rapidocr-onnxruntime (its shipped PP-OCR models) read against the prompt's quoted text;
             1 - min(edit distance, len) / len after removing spaces and lower-casing (flow_grpo's OCR
             reward); not torch, so server only. Video: the plain mean over the scored frames
             (flow_grpo's video OCR takes every 4th frame and averages only those read above 0)
Video ([B, F, H, W, 3]) is scored frame by frame and averaged per sample (`frames` evenly spaced
frames, all when 0). A user's function (`load_function`) takes the same inputs as a scorer.
"""

import importlib.util
import json
import os
from typing import Callable, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
TORCH_SCORERS = ("pickscore", "hpsv2", "clip", "aesthetic", "imagereward")
SCORERS = TORCH_SCORERS + ("ocr",)


class ClipPreprocess(torch.nn.Module):
    """CLIPProcessor / open_clip's validation transform on tensors: shortest side to `size`
    (bicubic, antialiased like PIL's resize), centre crop, normalise. An image already size x size
    passes through unresized."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size
        self.register_buffer("mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(CLIP_STD).view(1, 3, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        h, w = images.shape[-2], images.shape[-1]
        if h != self.size or w != self.size:
            # The long side as CLIPProcessor and torchvision's Resize size it: floor(long * size / short).
            short = min(h, w)
            nh, nw = h * self.size // short, w * self.size // short
            images = F.interpolate(images, size=[nh, nw], mode="bicubic", align_corners=False,
                                   antialias=True).clamp(0.0, 1.0)
            top, left = (nh - self.size) // 2, (nw - self.size) // 2
            images = images[:, :, top:top + self.size, left:left + self.size]
        return (images - self.mean) / self.std


def projected(features):
    """CLIPModel.get_*_features: a tensor (transformers 4), or an output whose pooler_output is the
    projected embedding (transformers 5)."""
    return features if torch.is_tensor(features) else features.pooler_output


class ClipSimilarity(torch.nn.Module):
    """scale * cos(image, prompt) with a transformers CLIPModel; `floor` clamps from below (CLIP score)."""

    def __init__(self, clip, scale: float, floor: Optional[float] = None):
        super().__init__()
        self.clip = clip
        self.scale = scale
        self.floor = floor

    def forward(self, pixels: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        image = F.normalize(projected(self.clip.get_image_features(pixel_values=pixels)).float(), dim=-1)
        score = self.scale * (image * text).sum(-1)
        return score if self.floor is None else score.clamp_min(self.floor)


class OpenClipSimilarity(torch.nn.Module):
    """cos(image, prompt) with an open_clip CLIP (HPS v2's score)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        return (self.model.encode_image(pixels, normalize=True).float() * text).sum(-1)


class AestheticHead(torch.nn.Module):
    """The LAION aesthetic MLP on the normalised CLIP image embedding; the prompt is not used."""

    def __init__(self, predictor):
        super().__init__()
        self.predictor = predictor

    def forward(self, pixels: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        embeds = self.predictor.visual_projection(self.predictor.vision_model(pixel_values=pixels).pooler_output)
        return self.predictor.layers(F.normalize(embeds, dim=-1)).squeeze(-1).float()


def frame_picks(frames: int, count: int) -> torch.Tensor:
    """`count` evenly spaced frame indices out of `frames` (all when count is 0)."""
    if count <= 0 or count >= frames:
        return torch.arange(frames)
    return torch.linspace(0, frames - 1, count).round().long()


def as_frames(images: torch.Tensor, frames: int):
    """uint8 [B, H, W, 3] or [B, F, H, W, 3] -> ([B * f, H, W, 3], f) with f scored frames per sample."""
    if images.dim() == 4:
        return images, 1
    picks = frame_picks(images.shape[1], frames).to(images.device)
    images = images.index_select(1, picks)
    return images.reshape(-1, *images.shape[2:]), picks.numel()


class Scorer:
    """A torch scorer: preprocessing, traced-able head and its prompt encoder, on one device."""

    def __init__(self, name: str, head: torch.nn.Module, encode_prompts: Callable[[List[str]], torch.Tensor],
                 size: int, device: str, identity: str):
        self.name = name
        self.input = "images"
        self.device = torch.device(device)
        self.head = head.to(self.device).eval()
        self.preprocess = ClipPreprocess(size).to(self.device)
        self.encode_prompts = encode_prompts
        self.size = size
        self.identity = identity
        self.frames = 0
        self._text_cache = {}

    def text_features(self, prompts: List[str]) -> torch.Tensor:
        missing = [p for p in dict.fromkeys(prompts) if p not in self._text_cache]
        if missing:
            with torch.no_grad():
                feats = self.encode_prompts(missing).float().to(self.device)
            self._text_cache.update(zip(missing, feats))
        return torch.stack([self._text_cache[p] for p in prompts])

    def score_pixels(self, pixels: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """RGB in [0, 1], [N, 3, H, W] -> [N]."""
        return self.head(self.preprocess(pixels.to(self.device)), text.to(self.device)).float()

    @torch.no_grad()
    def score_images(self, images: torch.Tensor, prompts: List[str], chunk: int = 64) -> torch.Tensor:
        """uint8 [B, H, W, 3] or [B, F, H, W, 3] -> [B] (frames averaged). Frames go to the device
        `chunk` at a time: a video batch in fp32 at full resolution would not fit."""
        flat, f = as_frames(images, self.frames)
        text = self.text_features(prompts).repeat_interleave(f, 0)
        scores = []
        for start in range(0, flat.shape[0], chunk):
            pixels = flat[start:start + chunk].to(self.device).permute(0, 3, 1, 2).float() / 255.0
            scores.append(self.score_pixels(pixels, text[start:start + chunk]))
        return torch.cat(scores).view(-1, f).mean(1).cpu()


def clip_model_and_processor(model_dir: str, processor_dir: Optional[str]):
    from transformers import AutoModel, AutoProcessor
    model = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(processor_dir or model_dir)
    return model, processor


def clip_text_encoder(model, processor, device: str):
    def encode(prompts: List[str]) -> torch.Tensor:
        text = processor(text=prompts, padding=True, truncation=True, max_length=77, return_tensors="pt")
        text = {k: v.to(device) for k, v in text.items()}
        return F.normalize(projected(model.get_text_features(**text)).float(), dim=-1)
    return encode


def image_size(processor) -> int:
    crop = processor.image_processor.crop_size  # an int, a dict or (transformers 5) a SizeDict
    height = getattr(crop, "height", None)
    return int(height if height is not None else crop["height"] if isinstance(crop, dict) else crop)


def load_pickscore(model_dir: str, processor_dir: Optional[str], device: str, **_) -> Scorer:
    model, processor = clip_model_and_processor(model_dir, processor_dir)
    model.to(device)
    head = ClipSimilarity(model, float(model.logit_scale.detach().exp()))
    return Scorer("pickscore", head, clip_text_encoder(model, processor, device), image_size(processor), device,
                  f"PickScore {model_dir}")


def load_clip(model_dir: str, processor_dir: Optional[str], device: str, **_) -> Scorer:
    model, processor = clip_model_and_processor(model_dir, processor_dir)
    model.to(device)
    head = ClipSimilarity(model, 100.0, floor=0.0)
    return Scorer("clip", head, clip_text_encoder(model, processor, device), image_size(processor), device,
                  f"CLIP score {model_dir}")


def load_aesthetic(model_dir: str, processor_dir: Optional[str], device: str, **_) -> Scorer:
    from aesthetics_predictor import AestheticsPredictorV2Linear
    from transformers import AutoProcessor
    predictor = AestheticsPredictorV2Linear.from_pretrained(model_dir, torch_dtype=torch.float32).eval().to(device)
    processor = AutoProcessor.from_pretrained(processor_dir or model_dir)

    def no_text(prompts: List[str]) -> torch.Tensor:
        return torch.zeros(len(prompts), 1)
    return Scorer("aesthetic", AestheticHead(predictor), no_text, image_size(processor), device,
                  f"LAION aesthetic v2 {model_dir}")


def load_hpsv2(model_dir: str, processor_dir: Optional[str], device: str, arch: str = "ViT-H-14", **_) -> Scorer:
    """model_dir: HPS_v2.1_compressed.pt (a {'state_dict': ...} checkpoint); arch: an open_clip model
    name, or a JSON model config (registered under its file stem; tests use a tiny one)."""
    import open_clip
    if arch.endswith(".json"):
        open_clip.add_model_config(arch)
        arch = os.path.splitext(os.path.basename(arch))[0]
    model = open_clip.create_model(arch, precision="fp32", device="cpu")
    state = torch.load(model_dir, map_location="cpu", weights_only=True)
    model.load_state_dict(state.get("state_dict", state))
    model.eval().to(device)
    tokenizer = open_clip.get_tokenizer(arch)

    def encode(prompts: List[str]) -> torch.Tensor:
        return model.encode_text(tokenizer(prompts).to(device), normalize=True).float()
    size = model.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    return Scorer("hpsv2", OpenClipSimilarity(model), encode, int(size), device, f"HPS v2.1 {arch} {model_dir}")


# ImageReward's published score normalisation (image-reward 1.5, ImageReward.mean / .std).
IMAGEREWARD_MEAN = 0.16717362830052426
IMAGEREWARD_STD = 1.0333394966054072
IMAGEREWARD_TOKENS = 35  # the prompt is padded / truncated to 35 BERT tokens


class ImageRewardHead(torch.nn.Module):
    """The prompt's tokens attend to the BLIP ViT's image tokens; the [CLS] feature goes through the
    MLP (linear layers only: the package comments its activations out) and the published
    normalisation. `text` is [N, 2, 35]: token ids and attention mask, as floats (exact below 2^24),
    because the text side cross-attends to each image and cannot be reduced to a vector beforehand."""

    def __init__(self, vision, text, mlp):
        super().__init__()
        self.vision = vision
        self.text = text
        self.mlp = mlp

    def forward(self, pixels: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        image = self.vision(pixel_values=pixels).last_hidden_state
        ids, mask = text[:, 0].long(), text[:, 1].long()
        image_mask = torch.ones(image.shape[:2], dtype=torch.long, device=image.device)
        hidden = self.text(input_ids=ids, attention_mask=mask, encoder_hidden_states=image,
                           encoder_attention_mask=image_mask).last_hidden_state
        return ((self.mlp(hidden[:, 0]) - IMAGEREWARD_MEAN) / IMAGEREWARD_STD).squeeze(-1)


def imagereward_mlp(width: int) -> torch.nn.Sequential:
    """Linear layers at the checkpoint's `mlp.layers.{0,2,4,6,7}` (dropouts between them)."""
    identity = torch.nn.Identity
    return torch.nn.Sequential(torch.nn.Linear(width, 1024), identity(), torch.nn.Linear(1024, 128), identity(),
                               torch.nn.Linear(128, 64), identity(), torch.nn.Linear(64, 16), torch.nn.Linear(16, 1))


def imagereward_vision_name(name: str) -> str:
    """blip.visual_encoder.* (BLIP's timm-style ViT) -> BlipVisionModel's name."""
    for old, new in (("cls_token", "embeddings.class_embedding"), ("pos_embed", "embeddings.position_embedding"),
                     ("patch_embed.proj", "embeddings.patch_embedding"), ("blocks.", "encoder.layers."),
                     (".norm1.", ".layer_norm1."), (".norm2.", ".layer_norm2."), (".attn.proj.", ".self_attn.projection."),
                     (".attn.qkv.", ".self_attn.qkv.")):
        name = name.replace(old, new)
    return "post_layernorm." + name[len("norm."):] if name.startswith("norm.") else name


def imagereward_modules(state: dict, med: dict):
    """BlipVisionModel and BlipTextModel sized from the checkpoint (ViT heads of 64 channels, as in
    BLIP's ViT-B and ViT-L) and med_config.json, with the checkpoint's tensors loaded strictly."""
    from transformers import BlipTextConfig, BlipTextModel, BlipVisionConfig, BlipVisionModel
    prefix = "blip.visual_encoder."
    vision_state = {imagereward_vision_name(k[len(prefix):]): v for k, v in state.items() if k.startswith(prefix)}
    width = vision_state["embeddings.class_embedding"].shape[-1]
    patch = vision_state["embeddings.patch_embedding.weight"].shape[-1]
    grid = round((vision_state["embeddings.position_embedding"].shape[1] - 1) ** 0.5)
    layers = 1 + max(int(k.split(".")[2]) for k in vision_state if k.startswith("encoder.layers."))
    vision = BlipVisionModel(BlipVisionConfig(
        hidden_size=width, intermediate_size=vision_state["encoder.layers.0.mlp.fc1.weight"].shape[0],
        num_hidden_layers=layers, num_attention_heads=width // 64, image_size=grid * patch, patch_size=patch,
        layer_norm_eps=1e-6, hidden_act="gelu"))
    text = BlipTextModel(BlipTextConfig(
        vocab_size=med["vocab_size"], hidden_size=med["hidden_size"], encoder_hidden_size=width,
        intermediate_size=med["intermediate_size"], num_hidden_layers=med["num_hidden_layers"],
        num_attention_heads=med["num_attention_heads"], max_position_embeddings=med["max_position_embeddings"],
        layer_norm_eps=med.get("layer_norm_eps", 1e-12), hidden_act=med.get("hidden_act", "gelu"),
        pad_token_id=med.get("pad_token_id", 0), is_decoder=True), add_pooling_layer=False)
    prefix = "blip.text_encoder."
    text_state = {k[len(prefix):]: v for k, v in state.items()
                  if k.startswith(prefix) and not k.endswith("embeddings.position_ids")}
    mlp = imagereward_mlp(med["hidden_size"])
    mlp_state = {k[len("mlp.layers."):]: v for k, v in state.items() if k.startswith("mlp.layers.")}
    for module, part in ((vision, vision_state), (text, text_state), (mlp, mlp_state)):
        module.load_state_dict(part, strict=True)
    return vision, text, mlp, grid * patch


def load_imagereward(model_dir: str, processor_dir: Optional[str], device: str, **_) -> Scorer:
    """model_dir: the folder of ImageReward.pt and med_config.json (THUDM/ImageReward's files) or the
    .pt beside its med_config.json; processor_dir: bert-base-uncased's tokenizer (default model_dir),
    given BLIP's two extra tokens as image-reward does."""
    from transformers import BertTokenizer
    checkpoint = model_dir if os.path.isfile(model_dir) else os.path.join(model_dir, "ImageReward.pt")
    folder = os.path.dirname(checkpoint)
    with open(os.path.join(folder, "med_config.json")) as f:
        med = json.load(f)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    vision, text, mlp, size = imagereward_modules(state.get("state_dict", state), med)
    tokenizer = BertTokenizer.from_pretrained(processor_dir or folder)
    tokenizer.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})

    def encode(prompts: List[str]) -> torch.Tensor:
        t = tokenizer(prompts, padding="max_length", truncation=True, max_length=IMAGEREWARD_TOKENS,
                      return_tensors="pt")
        return torch.stack([t["input_ids"], t["attention_mask"]], 1).float()
    head = ImageRewardHead(vision.float().eval(), text.float().eval(), mlp.float().eval())
    return Scorer("imagereward", head, encode, size, device, f"ImageReward {checkpoint}")


LOADERS = {"pickscore": load_pickscore, "hpsv2": load_hpsv2, "clip": load_clip, "aesthetic": load_aesthetic,
           "imagereward": load_imagereward}


def load_scorer(name: str, model: str, processor: Optional[str] = None, device: str = "cpu",
                arch: str = "ViT-H-14"):
    if name == "ocr":
        return OcrScorer()
    if name not in LOADERS:
        raise ValueError(f"unknown scorer {name!r}: one of {', '.join(SCORERS)}")
    if not model:
        raise ValueError(f"scorer {name} needs --model (its checkpoint folder or file)")
    return LOADERS[name](model, processor, device, arch=arch)


def quoted_text(prompt: str) -> str:
    """The text an OCR prompt asks for: after its first double quote up to the next (the whole prompt
    when it has none), without spaces, lower case."""
    parts = prompt.split('"')
    text = parts[1] if len(parts) > 1 else prompt
    return text.replace(" ", "").lower()


def edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[len(b)]


def ocr_accuracy(read: str, prompt: str) -> float:
    target = quoted_text(prompt)
    read = read.replace(" ", "").lower()
    return 1.0 - min(edit_distance(read, target), len(target)) / max(len(target), 1)


class OcrScorer:
    """rapidocr-onnxruntime with the detection/recognition models it ships; CPU (onnxruntime)."""

    def __init__(self):
        from rapidocr_onnxruntime import RapidOCR
        self.name = "ocr"
        self.input = "images"
        self.frames = 0
        self.identity = "rapidocr-onnxruntime (PP-OCR, shipped models)"
        self.engine = RapidOCR()

    def read(self, image: np.ndarray) -> str:
        result, _ = self.engine(np.ascontiguousarray(image[:, :, ::-1]))  # RapidOCR takes OpenCV's BGR
        return "".join(text for _, text, confidence in (result or []) if float(confidence) > 0)

    def score_images(self, images: torch.Tensor, prompts: List[str]) -> torch.Tensor:
        flat, f = as_frames(images, self.frames)
        frames = flat.cpu().numpy()
        scores = [ocr_accuracy(self.read(frames[k]), prompts[k // f]) for k in range(frames.shape[0])]
        return torch.tensor(scores, dtype=torch.float32).view(-1, f).mean(1)


class FunctionScorer:
    """A user's Python function fn(images or latents, prompts) -> B numbers, served as a scorer."""

    def __init__(self, spec: str, input_kind: str):
        path, _, name = spec.rpartition(":")
        if not path or not name:
            raise ValueError(f"--function {spec!r}: expected path/to/file.py:function_name")
        if not os.path.isfile(path):
            raise ValueError(f"--function {spec!r}: no file {path}")
        module_spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        self.fn = getattr(module, name, None)
        if not callable(self.fn):
            raise ValueError(f"--function {spec!r}: {path} has no function {name}")
        self.name = f"function:{os.path.basename(path)}:{name}"
        self.input = input_kind
        self.frames = 0
        self.identity = self.name

    def score(self, data: torch.Tensor, prompts: List[str]) -> torch.Tensor:
        return torch.as_tensor(np.asarray(self.fn(data, prompts), dtype=np.float64)).reshape(-1)


def describe(scorer) -> str:
    return json.dumps({"scorer": scorer.name, "input": scorer.input, "identity": scorer.identity})
