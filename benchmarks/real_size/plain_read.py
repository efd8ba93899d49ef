"""Every shard's bytes of a weights folder read plainly, from the page cache: into one
reused 64 MB buffer (the bandwidth of the copy alone), then into fresh memory kept until
the end (what any loader that keeps the bytes pays: every page faulted in and cleared by
the kernel, then copied). --warm: one untimed pass first, so that both timed reads find
the files in the page cache as the runs that follow do.

    python3 plain_read.py WEIGHTS_DIR [--warm]
"""
import mmap
import os
import sys
import time

files = sorted(os.path.join(sys.argv[1], f) for f in os.listdir(sys.argv[1]) if f.endswith(".safetensors"))
buf = bytearray(64 << 20)
if "--warm" in sys.argv[2:]:
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
start, n = time.perf_counter(), 0
for path in files:
    with open(path, "rb", buffering=0) as f:
        while (k := f.readinto(buf)):
            n += k
s = time.perf_counter() - start
print(f"plain read: {n / 1e9:.3f} GB in {s:.2f} s = {n / 1e9 / s:.2f} GB/s")
kept, start, n = [], time.perf_counter(), 0
for path in files:
    size = os.path.getsize(path)
    m = mmap.mmap(-1, size)
    with open(path, "rb", buffering=0) as f:
        view, got = memoryview(m), 0
        while got < size:
            got += f.readinto(view[got:])
    n += size
    kept.append(m)
s = time.perf_counter() - start
print(f"plain read into fresh memory: {n / 1e9:.3f} GB in {s:.2f} s = {n / 1e9 / s:.2f} GB/s")
