#!/usr/bin/env python3
"""The reference reward server for ditrl's `kind = "http"` rewards (protocol 1, docs/reward-server.md).

  GET  /health  -> {"status": "ok", "protocol": 1, "scorer": NAME, "input": "images" | "latents"}
  POST /score   body: a safetensors file with prompt_index int64 [B] and one of
                latents float32 [B, ...] or images uint8 [B, H, W, 3] / [B, F, H, W, 3];
                __metadata__ "prompts" (JSON array of B strings), "request" (echoed), "family", "rollout"
                -> {"scores": [B numbers], "request": ID}
A request the server cannot score is answered 4xx with the reason as text; a scorer that fails or
returns a wrong count or a non-finite score is answered 500 with the reason.

Serves one scorer of tools/scorers.py (pickscore, hpsv2, clip, aesthetic, imagereward on `--device`; ocr on the
CPU) or a user's function `--function FILE.py:NAME`, called as NAME(data, prompts) with data the
uint8 images [B, H, W, 3] / [B, F, H, W, 3] (`--input images`, default) or the fp32 latents
(`--input latents`) as torch tensors, returning B numbers. Video is scored per frame and averaged
(`--frames N`: N evenly spaced frames; 0, the default: all).

Usage:
  reward_server.py --scorer pickscore --model yuvalkirstain/PickScore_v1 \
      --processor laion/CLIP-ViT-H-14-laion2B-s32B-b79K --device cuda:0 --host 0.0.0.0 --port 8900
  reward_server.py --scorer hpsv2 --model HPS_v2.1_compressed.pt --device cuda:0 --port 8900
  reward_server.py --scorer ocr --port 8900
  reward_server.py --function my_reward.py:score --input latents --port 0 --port-file port.txt
"""

import argparse
import json
import math
import os
import socket
import struct
import sys
import threading
from typing import List

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scorers  # noqa: E402

PROTOCOL = 1
FAMILIES = ("sd3", "wan", "qwen_image", "ltx", "flux")


class BadRequest(Exception):
    """The request is malformed: answered 400 with this message."""


def safetensors_metadata(body: bytes) -> dict:
    """The __metadata__ map of a safetensors file (its JSON header), {} when absent."""
    if len(body) < 8:
        raise BadRequest(f"body is not a safetensors file: {len(body)} bytes")
    (size,) = struct.unpack("<Q", body[:8])
    if size > len(body) - 8:
        raise BadRequest(f"body is not a safetensors file: header of {size} bytes in a {len(body)}-byte body")
    try:
        header = json.loads(body[8:8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"body is not a safetensors file: header is not JSON ({e})")
    if not isinstance(header, dict):
        raise BadRequest("body is not a safetensors file: header is not a JSON object")
    return header.get("__metadata__") or {}


def parse_request(body: bytes):
    """-> (data tensor, "images" | "latents", prompts, request id)."""
    from safetensors.torch import load
    metadata = safetensors_metadata(body)
    try:
        tensors = load(body)
    except Exception as e:  # safetensors raises its own error types for every malformed body
        raise BadRequest(f"body is not a safetensors file: {e}")
    if "prompt_index" not in tensors:
        raise BadRequest("missing tensor prompt_index (int64 [B])")
    index = tensors["prompt_index"]
    if index.dtype != torch.int64 or index.dim() != 1:
        raise BadRequest(f"prompt_index must be int64 [B], got {index.dtype} {list(index.shape)}")
    kinds = [k for k in ("latents", "images") if k in tensors]
    if len(kinds) != 1:
        raise BadRequest(f"the body must hold exactly one of latents, images; it holds {sorted(tensors)}")
    kind = kinds[0]
    data = tensors[kind]
    batch = index.shape[0]
    if kind == "images" and (data.dtype != torch.uint8 or data.dim() not in (4, 5) or data.shape[-1] != 3):
        raise BadRequest(f"images must be uint8 [B, H, W, 3] or [B, F, H, W, 3], got {data.dtype} {list(data.shape)}")
    if kind == "latents" and (data.dtype != torch.float32 or data.dim() not in (4, 5)):
        raise BadRequest(f"latents must be float32 [B, C, (F,) H, W], got {data.dtype} {list(data.shape)}")
    if data.shape[0] != batch:
        raise BadRequest(f"{kind} has {data.shape[0]} samples but prompt_index has {batch}")
    if batch == 0:
        raise BadRequest("empty batch (B = 0)")
    try:
        prompts = json.loads(metadata.get("prompts", ""))
    except json.JSONDecodeError:
        raise BadRequest("metadata \"prompts\" must be a JSON array of B strings")
    if not isinstance(prompts, list) or len(prompts) != batch or not all(isinstance(p, str) for p in prompts):
        raise BadRequest(f"metadata \"prompts\" must be a JSON array of {batch} strings")
    if "request" not in metadata:
        raise BadRequest("metadata \"request\" (the request id) is missing")
    family = metadata.get("family")
    if family is not None and family not in FAMILIES:
        raise BadRequest(f"metadata \"family\" {family!r} is not one of {', '.join(FAMILIES)}")
    return data, kind, prompts, metadata["request"]


def checked_scores(scores: torch.Tensor, batch: int) -> List[float]:
    values = [float(v) for v in torch.as_tensor(scores).reshape(-1).tolist()]
    if len(values) != batch:
        raise RuntimeError(f"the scorer returned {len(values)} scores for {batch} samples")
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:
        raise RuntimeError(f"the scorer returned non-finite scores for samples {bad}")
    return values


def make_app(scorer):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse

    app = FastAPI(title="ditrl reward server", docs_url=None, redoc_url=None, openapi_url=None)
    lock = threading.Lock()  # one batch at a time on the scorer's device

    @app.get("/health")
    def health():
        return {"status": "ok", "protocol": PROTOCOL, "scorer": scorer.name, "input": scorer.input}

    @app.post("/score")
    async def score(request: Request):
        body = await request.body()
        try:
            data, kind, prompts, request_id = parse_request(body)
        except BadRequest as e:
            return PlainTextResponse(str(e), status_code=400)
        if kind != scorer.input:
            return PlainTextResponse(f"this server's scorer {scorer.name} takes {scorer.input}, the request sent "
                                     f"{kind}", status_code=400)
        try:
            values = await run_scorer(data, prompts)
        except Exception as e:  # the scorer's own failure: the client retries 5xx, then fails naming it
            return PlainTextResponse(f"scorer {scorer.name} failed: {type(e).__name__}: {e}", status_code=500)
        return JSONResponse({"scores": values, "request": request_id})

    async def run_scorer(data, prompts):
        from starlette.concurrency import run_in_threadpool

        def work():
            with lock, torch.no_grad():
                if isinstance(scorer, scorers.FunctionScorer):
                    return checked_scores(scorer.score(data, prompts), len(prompts))
                return checked_scores(scorer.score_images(data, prompts), len(prompts))
        return await run_in_threadpool(work)

    return app


def build_scorer(args):
    if args.function:
        return scorers.FunctionScorer(args.function, args.input)
    if args.input != "images":
        raise ValueError(f"scorer {args.scorer} takes images (--input latents is for --function)")
    return scorers.load_scorer(args.scorer, args.model, args.processor, args.device, args.arch)


def serve(app, host: str, port: int, port_file: str, log_level: str) -> None:
    import uvicorn
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    if port_file:  # written once the socket listens, atomically: a reader never sees half a number
        sock.listen(128)
        tmp = f"{port_file}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{bound}\n")
        os.replace(tmp, port_file)
    print(f"reward_server: listening on {host}:{bound}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_keep_alive=30)).run(sockets=[sock])


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--scorer", choices=scorers.SCORERS)
    which.add_argument("--function", help="FILE.py:NAME, called as NAME(data, prompts) -> B numbers")
    parser.add_argument("--model", help="the scorer's checkpoint (folder, hub id, or HPS .pt file)")
    parser.add_argument("--processor", help="CLIP processor folder or hub id (default: --model)")
    parser.add_argument("--arch", default="ViT-H-14", help="hpsv2: open_clip model name or JSON config")
    parser.add_argument("--input", choices=("images", "latents"), default="images",
                        help="what /score takes (latents only with --function)")
    parser.add_argument("--frames", type=int, default=0, help="video: frames scored per sample (0: all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900, help="0: a free port (see --port-file)")
    parser.add_argument("--port-file", help="write the bound port here once listening")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    if args.frames < 0:
        parser.error("--frames must be >= 0")
    try:
        scorer = build_scorer(args)
    except (ValueError, OSError, ImportError) as e:
        sys.exit(f"reward_server.py: {e}")
    scorer.frames = args.frames
    serve(make_app(scorer), args.host, args.port, args.port_file, args.log_level)


if __name__ == "__main__":
    main(sys.argv[1:])
