"""What the Python peers of benchmarks/peer/peer_harness.hpp share: the pipe
protocol (serve) and a safetensors reader for bf16 files without the package."""

import json
import resource
import struct
import sys
import time

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "F16": np.float16,
          "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path):
    """Minimal safetensors reader (Debian ships no `safetensors` package)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = data[8 + n + begin : 8 + n + end]
        if info["dtype"] == "BF16":
            words = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            tensor = torch.from_numpy(words.view(np.float32).copy()).to(torch.bfloat16)
        else:
            tensor = torch.from_numpy(np.frombuffer(raw, dtype=DTYPES[info["dtype"]]).copy())
        out[name] = tensor.reshape(info["shape"])
    return out


def serve(model, train_step):
    """Answers the C++ driver (benchmarks/peer/peer_harness.hpp) over stdin/stdout.

    Prints {"ready", "threads", "torch", "params"} once, then for every input
    line "<n>" runs train_step() (one step, returns the loss as a float) n
    times and prints {"step_seconds", "losses", "minor_faults"}. The driver
    alternates rounds of ditrl and Python steps so both see the same load.
    """
    def timed():
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        value = train_step()
        elapsed = time.perf_counter() - start
        return elapsed, value, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    print(json.dumps({"ready": True, "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "params": sum(p.numel() for p in model.parameters())}), flush=True)
    for line in sys.stdin:
        times, losses, faults = zip(*(timed() for _ in range(int(line))))
        print(json.dumps({"step_seconds": times, "losses": losses, "minor_faults": faults}), flush=True)
