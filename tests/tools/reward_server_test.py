"""tools/reward_server.py and tools/scorers.py against the scorers' own packages, on random weights.

Every model is built from a tiny config of the real architecture with seeded random weights and saved
as the checkpoint the server loads (nothing is downloaded): PickScore and CLIP score on transformers'
CLIPModel + CLIPProcessor, HPS v2.1 on open_clip's CLIP (a tiny config of ViT-H-14's layout, open_clip's
own shipped BPE tokenizer), the LAION aesthetic predictor on simple-aesthetics-predictor's
AestheticsPredictorV2Linear, ImageReward on image-reward 1.5's own ImageReward class (loaded without its
package __init__, with the three transformers 4 helpers, fairscale's checkpoint wrapper and the
BERT tokenizer download it makes replaced: see import_imagereward). OCR runs rapidocr-onnxruntime's shipped models for real. Each server is
started by the test on 127.0.0.1 with --port 0 and stopped by it; every wait is bounded.

Modes (one CTest test each):
  scorers   per scorer: the package's own eager scoring (its processor on PIL images, its model's
            forward, the published formula) vs the scorer in-process vs the server's /score, on
            images at the scorer's input size; a video batch [B, F, H, W, 3] through the server
            equals the mean of the eager per-frame scores; OCR reads rendered text (accuracy 1,
            blank image 0 as the negative control) and matches the in-process scorer.
  protocol  a user function served (--function FILE:NAME): /health, /score on images, on video and
            (--input latents) on latents, the request id echoed; every malformed request is
            answered 4xx with its reason, every scorer failure (wrong count, NaN, exception) 500 with
            its reason; bad command lines exit non-zero naming the problem.
  export    tools/export_reward.py --scorer for pickscore, hpsv2, clip, aesthetic on a tiny SD3 VAE
            (and clip on a tiny Wan VAE, 2 frames averaged, and on a tiny FLUX.2 VAE from its 2x2-patchified
            latents): the TorchScript module's rewards vs the eager decode + scorer.
Usage: reward_server_test.py MODE SOURCE_DIR WORK_DIR
"""

import functools
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import torch

MODE, SOURCE, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(SOURCE, "tools"))
sys.path.insert(0, os.path.join(SOURCE, "tests", "interop"))
import scorers  # noqa: E402
import tiny_models  # noqa: E402

SERVER = os.path.join(SOURCE, "tools", "reward_server.py")
SIZE = 32  # the tiny models' input size
PROMPTS = ["a red cube on a table", "two cats", "a sign that says \"hello\"", "sunset"]
failures = []


def check(name, ok, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


# ---------------------------------------------------------------- servers and requests

class Server:
    """tools/reward_server.py on 127.0.0.1, a free port, stopped on exit (TERM, then KILL)."""

    def __init__(self, name, args, timeout=180):
        self.port_file = os.path.join(WORK, f"{name}.port")
        self.log_path = os.path.join(WORK, f"{name}.log")
        if os.path.exists(self.port_file):
            os.remove(self.port_file)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, SERVER, *args, "--host", "127.0.0.1", "--port", "0",
                                      "--port-file", self.port_file], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"server {name} did not start: {open(self.log_path).read()[-2000:]}")
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{open(self.port_file).read().strip()}"
        while True:  # listening; /health answers once uvicorn serves
            try:
                self.health = get(self.url + "/health")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.time() > deadline:
                    self.stop()
                    raise RuntimeError(f"server {name} never answered /health")
                time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def post(url, body):
    """-> (status, parsed JSON or text)."""
    req = urllib.request.Request(url + "/score", data=body, method="POST",
                                 headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def body(data=None, kind="images", prompts=None, request="7", index=None, metadata=None):
    from safetensors.torch import save
    tensors = {}
    if data is not None:
        tensors[kind] = data
        tensors["prompt_index"] = torch.arange(data.shape[0], dtype=torch.int64) if index is None else index
    elif index is not None:
        tensors["prompt_index"] = index
    meta = {"family": "sd3", "rollout": "3"}
    if prompts is not None:
        meta["prompts"] = json.dumps(prompts)
    if request is not None:
        meta["request"] = request
    meta.update(metadata or {})
    return save(tensors, metadata=meta)


def random_images(n, h=SIZE, w=SIZE, seed=0, frames=0):
    g = torch.Generator().manual_seed(seed)
    shape = (n, frames, h, w, 3) if frames else (n, h, w, 3)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)


def max_diff(a, b):
    return float((torch.as_tensor(a, dtype=torch.float64) - torch.as_tensor(b, dtype=torch.float64)).abs().max())


# ---------------------------------------------------------------- tiny checkpoints

def build_models():
    """-> {scorer: server arguments}; models saved under WORK/models."""
    from aesthetics_predictor import AestheticsPredictorV2Linear
    import open_clip
    from transformers import CLIPVisionConfig
    out = os.path.join(WORK, "models")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)  # the libraries' own inits of the weights seeded() only perturbs (CLIP's class embedding)
    tiny_models.pickscore(out)  # out/pickscore: CLIPModel, out/processor: CLIPProcessor (size 32)
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                              image_size=SIZE, patch_size=8, projection_dim=16)
    tiny_models.seeded(AestheticsPredictorV2Linear(vision), 11).save_pretrained(os.path.join(out, "aesthetic"))
    config = os.path.join(out, "tiny-hps-vit.json")  # ViT-H-14's layout, tiny widths; the real vocabulary
    with open(config, "w") as f:
        json.dump({"embed_dim": 16, "vision_cfg": {"image_size": SIZE, "layers": 1, "width": 32, "head_width": 16,
                                                   "patch_size": 8},
                   "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}, f)
    open_clip.add_model_config(config)
    hps = tiny_models.seeded(open_clip.create_model("tiny-hps-vit"), 12)
    torch.save({"state_dict": hps.state_dict()}, os.path.join(out, "hps.pt"))
    clip = ["--model", os.path.join(out, "pickscore"), "--processor", os.path.join(out, "processor")]
    build_imagereward(os.path.join(out, "imagereward"))
    return {"imagereward": ["--model", os.path.join(out, "imagereward")],
            "pickscore": clip, "clip": clip,
            "aesthetic": ["--model", os.path.join(out, "aesthetic"), "--processor", os.path.join(out, "processor")],
            "hpsv2": ["--model", os.path.join(out, "hps.pt"), "--arch", config]}


IMAGEREWARD_SIZE = 224  # image-reward's ImageReward builds its BLIP and its transform at 224


@functools.lru_cache(maxsize=None)
def import_imagereward():
    """image-reward 1.5's ImageReward and BLIP modules on transformers 5, without the package __init__
    (it imports ReFL's training stack and OpenAI's clip, which scoring never runs). Three helpers med.py
    imports from transformers.modeling_utils moved or went in transformers 5: apply_chunking_to_forward
    is taken from transformers.pytorch_utils, the two head-pruning ones (never called when scoring)
    raise. fairscale's checkpoint_wrapper is only applied with gradient checkpointing (off here)."""
    import importlib
    import importlib.util
    import types
    import transformers.modeling_utils as modeling_utils
    import transformers.pytorch_utils as pytorch_utils

    def unused(name):
        def fail(*_, **__):
            raise NotImplementedError(f"{name} is not part of ImageReward's scoring")
        return fail
    for name in ("apply_chunking_to_forward", "find_pruneable_heads_and_indices", "prune_linear_layer"):
        if not hasattr(modeling_utils, name):
            setattr(modeling_utils, name, getattr(pytorch_utils, name, None) or unused(name))
    wrapper = types.ModuleType("fairscale.nn.checkpoint.checkpoint_activations")
    wrapper.checkpoint_wrapper = unused("checkpoint_wrapper")
    for name in ("fairscale", "fairscale.nn", "fairscale.nn.checkpoint"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules[wrapper.__name__] = wrapper
    root = os.path.dirname(importlib.util.find_spec("ImageReward").origin)
    for package, path in (("ImageReward", root), ("ImageReward.models", os.path.join(root, "models")),
                          ("ImageReward.models.BLIP", os.path.join(root, "models", "BLIP"))):
        module = types.ModuleType(package)
        module.__path__ = [path]
        sys.modules[package] = module
    med = importlib.import_module("ImageReward.models.BLIP.med")
    # transformers 5's init_weights needs post_init's bookkeeping, which med's BertModel never runs; the
    # test draws every matrix itself (tiny_models.seeded), so torch's constructor inits are enough.
    med.BertModel.init_weights = lambda self: None

    def invert_attention_mask(self, mask):  # transformers 4's ModuleUtilsMixin methods, gone in 5
        mask = (mask[:, None, :, :] if mask.dim() == 3 else mask[:, None, None, :]).to(self.dtype)
        return (1.0 - mask) * torch.finfo(self.dtype).min
    med.BertModel.invert_attention_mask = invert_attention_mask
    med.BertModel.get_head_mask = lambda self, head_mask, layers: [None] * layers  # scoring masks no head
    return (importlib.import_module("ImageReward.ImageReward"), importlib.import_module("ImageReward.models.BLIP.blip"),
            importlib.import_module("ImageReward.models.BLIP.blip_pretrain"),
            importlib.import_module("ImageReward.models.BLIP.vit"))


def imagereward_package(folder):
    """The package's ImageReward on folder's med_config.json and tokenizer, its ViT a tiny
    VisionTransformer of the package's own class (ViT-L's 64-channel heads, 2 layers, width 128)."""
    from transformers import BertTokenizer
    reward, _, blip_pretrain, vit = import_imagereward()

    def local_tokenizer():  # blip.init_tokenizer on folder's vocabulary instead of bert-base-uncased's
        tokenizer = BertTokenizer.from_pretrained(folder)
        tokenizer.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
        tokenizer.enc_token_id = tokenizer.convert_tokens_to_ids("[ENC]")  # transformers 5 dropped *_ids
        return tokenizer
    blip_pretrain.init_tokenizer = local_tokenizer
    blip_pretrain.create_vit = lambda _vit, size, *_: (vit.VisionTransformer(
        img_size=size, patch_size=16, embed_dim=128, depth=2, num_heads=2, mlp_ratio=2.0), 128)
    return reward.ImageReward(med_config=os.path.join(folder, "med_config.json"), device="cpu").eval()


def build_imagereward(folder):
    """ImageReward.pt + med_config.json (BLIP's med config: hidden 768 as the MLP needs, one layer) and a
    BERT tokenizer over the prompts' words, as a THUDM/ImageReward-style folder."""
    from transformers import BertTokenizer
    os.makedirs(folder, exist_ok=True)
    words = sorted({w.strip('"').lower() for p in PROMPTS for w in p.split()} - {""})
    vocab = os.path.join(folder, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", '"', *words]) + "\n")
    BertTokenizer(vocab).save_pretrained(folder)
    with open(os.path.join(folder, "med_config.json"), "w") as f:
        json.dump({"architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": 768,
                   "intermediate_size": 256, "layer_norm_eps": 1e-12, "max_position_embeddings": 64,
                   "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 1, "pad_token_id": 0,
                   "type_vocab_size": 2, "vocab_size": len(words) + 8, "encoder_width": 768,
                   "add_cross_attention": True, "attention_probs_dropout_prob": 0.1,
                   "hidden_dropout_prob": 0.1, "initializer_range": 0.02}, f)
    model = tiny_models.seeded(imagereward_package(folder), 13)
    torch.save(model.state_dict(), os.path.join(folder, "ImageReward.pt"))


def option(args, name):
    return args[args.index(name) + 1]


# ---------------------------------------------------------------- the packages' own scoring

def pil(images):
    from PIL import Image
    return [Image.fromarray(im) for im in images.numpy()]


class Features(torch.nn.Module):
    """CLIPModel whose get_*_features return the projected tensor, as torchmetrics 1.9 expects
    (transformers 5 returns an output object; torchmetrics calls .norm on it)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config

    def get_image_features(self, *args, **kwargs):
        return scorers.projected(self.model.get_image_features(*args, **kwargs))

    def get_text_features(self, *args, **kwargs):
        return scorers.projected(self.model.get_text_features(*args, **kwargs))


def eager_clip_model(args, formula):
    """transformers' CLIPProcessor on PIL images + CLIPModel; PickScore's or torchmetrics' formula."""
    from transformers import AutoModel, AutoProcessor
    model = AutoModel.from_pretrained(option(args, "--model")).eval()
    processor = AutoProcessor.from_pretrained(option(args, "--processor"))

    def score(images, prompts):
        with torch.no_grad():
            if formula == "clip":  # torchmetrics' CLIPScore update on (image, caption) pairs, per sample
                from torchmetrics.functional.multimodal.clip_score import _clip_score_update
                per_sample, _ = _clip_score_update(list(images.permute(0, 3, 1, 2)), prompts, Features(model),
                                                   processor)
                return per_sample.clamp_min(0.0)  # CLIPScore = max(100 cos, 0)
            pixels = processor(images=pil(images), return_tensors="pt")["pixel_values"]
            text = processor(text=prompts, padding=True, truncation=True, max_length=77, return_tensors="pt")
            image = scorers.projected(model.get_image_features(pixel_values=pixels))
            text = scorers.projected(model.get_text_features(**text))
            image, text = image / image.norm(dim=-1, keepdim=True), text / text.norm(dim=-1, keepdim=True)
            return model.logit_scale.exp() * (image * text).sum(-1)  # PickScore
    return score


def eager_aesthetic(args):
    from aesthetics_predictor import AestheticsPredictorV2Linear
    from transformers import AutoProcessor
    predictor = AestheticsPredictorV2Linear.from_pretrained(option(args, "--model")).eval()
    processor = AutoProcessor.from_pretrained(option(args, "--processor"))

    def score(images, prompts):
        with torch.no_grad():
            pixels = processor(images=pil(images), return_tensors="pt")["pixel_values"]
            return predictor(pixel_values=pixels).logits.reshape(-1)
    return score


def eager_hpsv2(args):
    """open_clip's validation transform on PIL, the model's forward, diag(image @ text.T) as hpsv2."""
    import open_clip
    name = os.path.splitext(os.path.basename(option(args, "--arch")))[0]
    model = open_clip.create_model(name)
    model.load_state_dict(torch.load(option(args, "--model"), weights_only=True)["state_dict"])
    model.eval()
    transform = open_clip.image_transform(SIZE, is_train=False)
    tokenizer = open_clip.get_tokenizer(name)

    def score(images, prompts):
        with torch.no_grad():
            out = model(torch.stack([transform(im) for im in pil(images)]), tokenizer(prompts))
            image, text = (out["image_features"], out["text_features"]) if isinstance(out, dict) else out[:2]
            return torch.diagonal(image @ text.T)
    return score


def eager_imagereward(args):
    """ImageReward.score(prompt, PIL image): the package's transform, BLIP and MLP, one image at a time."""
    folder = option(args, "--model")
    model = imagereward_package(folder)
    model.load_state_dict(torch.load(os.path.join(folder, "ImageReward.pt"), weights_only=True))

    def score(images, prompts):
        with torch.no_grad():
            return torch.tensor([model.score(p, im) for p, im in zip(prompts, pil(images))], dtype=torch.float64)
    return score


def eager_scorer(name, args):
    if name == "imagereward":
        return eager_imagereward(args)
    if name in ("pickscore", "clip"):
        return eager_clip_model(args, name)
    return eager_aesthetic(args) if name == "aesthetic" else eager_hpsv2(args)


# ---------------------------------------------------------------- modes

def mode_scorers():
    models = build_models()
    for name, args in models.items():
        start = time.time()
        size = IMAGEREWARD_SIZE if name == "imagereward" else SIZE
        images = random_images(4, size, size, seed=1)
        video = random_images(2, size, size, seed=2, frames=3)
        eager = eager_scorer(name, args)
        want = eager(images, PROMPTS)
        scorer = scorers.load_scorer(name, option(args, "--model"), option(args, "--processor")
                                     if "--processor" in args else None, "cpu",
                                     option(args, "--arch") if "--arch" in args else "ViT-H-14")
        local = scorer.score_images(images, PROMPTS)
        scale = max(1.0, float(want.abs().max()))
        diff = max_diff(local, want)
        check(f"{name}: in-process scorer vs the package's eager scoring", diff <= 1e-4 * scale,
              f"scores {[round(v, 4) for v in want.tolist()]}, max diff {diff:.2e} (bound {1e-4 * scale:.1e})")
        if name == "imagereward":  # the prompt reaches the score through cross-attention, not a vector
            moved = max_diff(scorer.score_images(images, PROMPTS[::-1]), want)
            check("imagereward: other prompts move the scores beyond that bound (negative control)",
                  moved > 1e-4 * scale, f"max change {moved:.2e}")
        chunked = scorer.score_images(video, PROMPTS[:2], chunk=2)  # 6 frames in chunks of 2
        diff = max_diff(chunked, scorer.score_images(video, PROMPTS[:2]))
        check(f"{name}: video scored in chunks of 2 frames = in one", diff <= 1e-6 * scale, f"max diff {diff:.2e}")
        with Server(name, ["--scorer", name, *args]) as server:
            check(f"{name}: /health", server.health == {"status": "ok", "protocol": 1, "scorer": name,
                                                        "input": "images"}, json.dumps(server.health))
            status, reply = post(server.url, body(images, prompts=PROMPTS, request="41"))
            ok = status == 200 and reply.get("request") == "41" and len(reply.get("scores", [])) == 4
            diff = max_diff(reply["scores"], local) if ok else float("inf")
            check(f"{name}: server /score vs in-process", ok and diff <= 1e-6 * scale,
                  f"status {status}, max diff {diff:.2e}" if ok else f"status {status}: {reply}")
            status, reply = post(server.url, body(video, prompts=PROMPTS[:2]))
            frames = [eager(video[:, f], PROMPTS[:2]) for f in range(video.shape[1])]
            want_video = torch.stack(frames).mean(0)
            diff = max_diff(reply["scores"], want_video) if status == 200 else float("inf")
            check(f"{name}: video [2, 3, {size}, {size}, 3] = mean of the eager per-frame scores",
                  diff <= 1e-4 * scale, f"status {status}, max diff {diff:.2e}")
            bigger = random_images(2, 40, 52, seed=3)
            status, reply = post(server.url, body(bigger, prompts=PROMPTS[:2]))
            diff = max_diff(reply["scores"], eager(bigger, PROMPTS[:2])) if status == 200 else float("inf")
            # The server resizes in float (torch bicubic, antialiased), the packages in uint8 (PIL): the
            # scores differ by that preprocessing difference, reported here and bounded per pixel below.
            check(f"{name}: 40x52 images resized by the server (vs the package's PIL resize)", status == 200,
                  f"max diff {diff:.3e} of scores up to {scale:.3g}")
            if name == "pickscore":
                from transformers import AutoProcessor
                processor = AutoProcessor.from_pretrained(option(args, "--processor"))
                ref = processor(images=pil(bigger), return_tensors="pt")["pixel_values"]
                mine = scorer.preprocess(bigger.permute(0, 3, 1, 2).float() / 255.0)
                error = (mine - ref).abs()
                check("resize + crop of 40x52 images vs CLIPProcessor's (normalised units; 1 uint8 level = 0.015)",
                      error.mean() <= 0.05 and mine.shape == ref.shape,
                      f"mean {error.mean():.4f} (bound 0.05), max {error.max():.3f}")
        print(f"     {name}: {time.time() - start:.1f} s", flush=True)
    mode_ocr()


def render(text, width=320, height=80):
    from PIL import Image, ImageDraw, ImageFont
    import cv2
    fonts = [os.path.join(os.path.dirname(cv2.__file__), "qt", "fonts", "DejaVuSans.ttf"),
             "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"]
    font = ImageFont.truetype(next(f for f in fonts if os.path.exists(f)), 40)
    image = Image.new("RGB", (width, height), "white")
    ImageDraw.Draw(image).text((12, 14), text, fill="black", font=font)
    return torch.from_numpy(np.asarray(image).copy())


def mode_ocr():
    start = time.time()
    cases = [("helo", 'a sign "hello"', 0.8), ("HELLO", 'a sign that says "Hello"', 1.0),
             ("", 'say "ab"', 0.0), ("abcxyz", 'say "abc"', 0.0), ("Hello World", "hello world", 1.0),
             ("hel1o w0rld", 'a "Hello World" poster', 0.8), ("HELLO", 'say "hello', 1.0), ("x", 'empty ""', 1.0)]
    for read, prompt, want in cases:
        got = scorers.ocr_accuracy(read, prompt)
        check(f"ocr accuracy of {read!r} for {prompt!r}", abs(got - want) < 1e-12, f"{got} (hand: {want})")
    images = torch.stack([render("HELLO"), render("ditrl"), render("")])
    prompts = ['a sign that says "hello"', 'the word "ditrl" on a wall', 'a sign that says "hello"']
    local = scorers.OcrScorer().score_images(images, prompts)
    check("ocr: rendered HELLO and ditrl read exactly, the blank image scores 0 (negative control)",
          local.tolist() == [1.0, 1.0, 0.0], f"{local.tolist()}")
    with Server("ocr", ["--scorer", "ocr"]) as server:
        status, reply = post(server.url, body(images, prompts=prompts))
        check("ocr: server /score vs in-process", status == 200 and reply["scores"] == local.tolist(),
              f"status {status}: {reply}")
        video = torch.stack([images[:2], images[1:]])  # [2, 2, H, W, 3]: (HELLO, ditrl), (ditrl, blank)
        status, reply = post(server.url, body(video, prompts=['"hello"', '"ditrl"']))
        check("ocr: video frames averaged", status == 200 and reply["scores"] == [0.5, 0.5],
              f"status {status}: {reply}")
    print(f"     ocr: {time.time() - start:.1f} s", flush=True)


USER_FUNCTION = '''
import math
import torch


def score(data, prompts):
    """mean value per sample + prompt length; misbehaves on request (the tests' failure modes)."""
    if prompts[0] == "wrong count":
        return [1.0]
    if prompts[0] == "nan":
        return [math.nan] * len(prompts)
    if prompts[0] == "raise":
        raise RuntimeError("the user function failed on purpose")
    return [float(d.double().mean()) + len(p) for d, p in zip(data, prompts)]
'''


def expected_function(data, prompts):
    return [float(d.double().mean()) + len(p) for d, p in zip(data, prompts)]


def mode_protocol():
    path = os.path.join(WORK, "user_reward.py")
    with open(path, "w") as f:
        f.write(USER_FUNCTION)
    images = random_images(3, 8, 12, seed=4)
    with Server("function", ["--function", f"{path}:score"]) as server:
        check("function: /health", server.health == {"status": "ok", "protocol": 1,
                                                     "scorer": "function:user_reward.py:score", "input": "images"},
              json.dumps(server.health))
        status, reply = post(server.url, body(images, prompts=["a", "bb", "ccc"], request="123456789012"))
        check("function: /score on images, request id echoed", status == 200 and reply == {
            "scores": expected_function(images, ["a", "bb", "ccc"]), "request": "123456789012"}, f"{reply}")
        video = random_images(2, 8, 8, seed=5, frames=4)
        status, reply = post(server.url, body(video, prompts=["x", "yy"]))
        check("function: /score on video [2, 4, 8, 8, 3]",
              status == 200 and reply["scores"] == expected_function(video, ["x", "yy"]), f"{reply}")
        latents = torch.randn(3, 16, 4, 4)
        bad = {
            "not a safetensors body": b"this is not safetensors",
            "truncated safetensors": body(images, prompts=["a", "b", "c"])[:100],
            "no prompt_index": _without_index(images),
            "prompt_index not int64": body(images, prompts=["a", "b", "c"], index=torch.arange(3, dtype=torch.int32)),
            "images and latents both": _both(images, latents),
            "images not uint8": body(images.float(), prompts=["a", "b", "c"]),
            "images without 3 channels last": body(images[..., :2].contiguous(), prompts=["a", "b", "c"]),
            "count mismatch": body(images, prompts=["a", "b", "c"], index=torch.arange(2)),
            "prompts missing": body(images),
            "prompts not JSON": body(images, metadata={"prompts": "[not json"}),
            "prompts wrong count": body(images, prompts=["a"]),
            "request id missing": body(images, prompts=["a", "b", "c"], request=None),
            "unknown family": body(images, prompts=["a", "b", "c"], metadata={"family": "sdxl"}),
            "latents to an images server": body(latents, kind="latents", prompts=["a", "b", "c"]),
        }
        for what, payload in bad.items():
            status, reply = post(server.url, payload)
            check(f"bad request answered 400 with a reason: {what}", status == 400 and isinstance(reply, str)
                  and len(reply) > 10, f"{status}: {reply if isinstance(reply, str) else json.dumps(reply)}")
        for what in ("wrong count", "nan", "raise"):
            status, reply = post(server.url, body(images, prompts=[what, "b", "c"]))
            check(f"scorer failure answered 500 with the reason: {what}", status == 500 and "failed" in str(reply),
                  f"{status}: {reply}")
        try:
            urllib.request.urlopen(server.url + "/score", timeout=30)
            check("GET /score refused", False, "answered 2xx")
        except urllib.error.HTTPError as e:
            check("GET /score refused 405", e.code == 405, f"{e.code}")
        status, reply = post(server.url, body(images, prompts=["a", "b", "c"]))
        check("the server still scores after the failures", status == 200, f"{status}")
    with Server("function_latents", ["--function", f"{path}:score", "--input", "latents"]) as server:
        check("function --input latents: /health says latents", server.health["input"] == "latents",
              json.dumps(server.health))
        video_latents = torch.randn(2, 16, 3, 4, 4)
        for data in (latents, video_latents):
            prompts = ["p"] * data.shape[0]
            status, reply = post(server.url, body(data, kind="latents", prompts=prompts))
            want = expected_function(data, prompts)
            check(f"function: /score on latents {list(data.shape)}",
                  status == 200 and max_diff(reply["scores"], want) == 0.0, f"{status}: {reply}")
        status, reply = post(server.url, body(images, prompts=["a", "b", "c"]))
        check("images to a latents server: 400", status == 400, f"{status}: {reply}")
    for what, args, needle in [("missing function file", ["--function", "/nonexistent.py:f"], "no file"),
                               ("function not in file", ["--function", f"{path}:nope"], "no function nope"),
                               ("scorer without --model", ["--scorer", "pickscore"], "needs --model"),
                               ("latents for a model scorer", ["--scorer", "clip", "--model", "x", "--input",
                                                               "latents"], "takes images")]:
        run = subprocess.run([sys.executable, SERVER, *args, "--port", "0"], capture_output=True, text=True,
                             timeout=120)
        check(f"command line refused: {what}", run.returncode != 0 and needle in run.stderr,
              run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}")


def _without_index(images):
    from safetensors.torch import save
    return save({"images": images}, metadata={"prompts": json.dumps(["a", "b", "c"]), "request": "1"})


def _both(images, latents):
    from safetensors.torch import save
    return save({"images": images, "latents": latents, "prompt_index": torch.arange(3)},
                metadata={"prompts": json.dumps(["a", "b", "c"]), "request": "1"})


def mode_export():
    import export_decoder
    import export_reward
    models = build_models()
    prompts_txt = os.path.join(WORK, "prompts.txt")
    with open(prompts_txt, "w") as f:
        f.write("\n".join(PROMPTS) + "\n")
    for family in ("sd3", "wan", "flux2"):
        folder = os.path.join(WORK, f"vae_{family}")
        export_decoder.tiny_vae(family).save_pretrained(folder)
    cases = [(name, "sd3") for name in models] + [("clip", "wan"), ("clip", "flux2")]
    for name, family in cases:
        start = time.time()
        args = models[name]
        out = os.path.join(WORK, f"{name}_{family}.pt")
        extra = ["--processor", option(args, "--processor")] if "--processor" in args else []
        extra += ["--arch", option(args, "--arch")] if "--arch" in args else []
        export_reward.main(["--family", family, "--vae", os.path.join(WORK, f"vae_{family}"), "--scorer", name,
                            "--model", option(args, "--model"), *extra, "--prompts", prompts_txt, "--out", out,
                            "--frames", "2", "--latent-frames", "2", "--latent-size", "4"])
        module = torch.jit.load(out)
        index = torch.tensor([2, 0, 3])
        with torch.no_grad():
            scorer = scorers.load_scorer(name, option(args, "--model"), extra[1] if extra[:1] == ["--processor"]
                                         else None, "cpu", option(args, "--arch") if "--arch" in args else "ViT-H-14")
            vae = export_decoder.load_vae(family, os.path.join(WORK, f"vae_{family}"))
            text = scorer.text_features([PROMPTS[i] for i in index])
            # CLIP score clamps negative cosines to 0: take the first seeded latents with a positive
            # score, so that the comparison is not between zeros.
            for seed in range(50):
                torch.manual_seed(seed)
                shape = {"wan": (3, 16, 2, 16, 16), "flux2": (3, 128, 10, 13)}.get(family, (3, 16, 20, 26))
                latents = torch.randn(shape)  # sd3 and flux2 decode to 40x52, resized by the scorer
                pixels = (export_reward.DiffusersDecode(vae, family)(latents) * 0.5 + 0.5).clamp(0, 1)
                if family == "wan":  # 2 latent frames -> 2 video frames, both scored
                    frames = [scorer.score_pixels(pixels[:, :, f], text) for f in range(pixels.shape[2])]
                    want = torch.stack(frames).mean(0)
                else:
                    want = scorer.score_pixels(pixels, text)
                if bool((want != 0).any()):
                    break
            got = module(latents, index)
        scale = max(1.0, float(want.abs().max()))
        diff = max_diff(got, want)
        check(f"export_reward --scorer {name} --family {family}: TorchScript vs eager decode + scorer",
              diff <= 1e-4 * scale and bool((want != 0).any()),
              f"rewards {[round(v, 4) for v in want.tolist()]}, max diff {diff:.2e}")
        print(f"     {name} {family}: {time.time() - start:.1f} s", flush=True)


def main():
    os.makedirs(WORK, exist_ok=True)
    start = time.time()
    {"scorers": mode_scorers, "protocol": mode_protocol, "export": mode_export}[MODE]()
    print(f"{MODE}: {time.time() - start:.1f} s; "
          f"{'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
