#!/usr/bin/python3
"""Independent checks of ditrl's HDF5 outputs for tests/multinode/run.sh
(h5py, not ditrl's own reader, so a reader bug cannot hide a writer bug).

  h5check.py verify CKPT          complete=1 and every slab of the
                                  sha256_manifest matches its bytes
  h5check.py same CKPT_A CKPT_B   bitwise-equal datasets and attributes but the
                                  deck (its out_dir differs) and /rng/torch_cpu
                                  (LibTorch seeds its default generator at random
                                  per process; no metric depends on it)
  h5check.py prefix METRICS_A METRICS_B ROWS
                                  the first ROWS rows of every series but
                                  perf/* are bitwise equal
Exit 0 when the check holds, 1 with the reason otherwise.
"""
import hashlib
import sys

import h5py
import numpy as np


def fail(message):
    print(f"h5check: {message}")
    sys.exit(1)


def manifest_lines(f, name):
    if "sha256_manifest" not in f.attrs:
        fail(f"{name}: no sha256_manifest attribute")
    text = f.attrs["sha256_manifest"]
    text = text.decode() if isinstance(text, bytes) else str(text)
    return [line.split() for line in text.splitlines() if line.strip()]


def verify(path):
    with h5py.File(path, "r") as f:
        if int(f.attrs.get("complete", 0)) != 1:
            fail(f"{path}: not marked complete")
        slabs = manifest_lines(f, path)
        covered = {}
        for dataset, begin, end, digest in slabs:
            begin, end = int(begin), int(end)
            flat = f[dataset][...].reshape(-1)
            if end > flat.size:
                fail(f"{path}: {dataset} [{begin}, {end}) beyond its {flat.size} elements")
            got = hashlib.sha256(np.ascontiguousarray(flat[begin:end]).tobytes()).hexdigest()
            if got != digest:
                fail(f"{path}: {dataset} [{begin}, {end}) does not match its SHA-256")
            covered[dataset] = covered.get(dataset, 0) + end - begin
        for dataset, count in covered.items():
            if count != f[dataset].size:
                fail(f"{path}: {dataset}: slabs cover {count} of {f[dataset].size} elements")
        print(f"{path}: complete, {len(slabs)} slabs over {len(covered)} datasets verified "
              f"(step {int(f.attrs['step'])}, written by {int(f.attrs['world_size'])} ranks)")


def datasets(f):
    names = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return sorted(names)


UNSEEDED = "rng/torch_cpu"


def same(a_path, b_path):
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        if datasets(a) != datasets(b):
            fail(f"{a_path} and {b_path} hold different datasets")
        compared = [name for name in datasets(a) if name != UNSEEDED]
        for name in compared:
            x, y = a[name][...], b[name][...]
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                fail(f"{name} differs between {a_path} and {b_path}")
        # The manifest's lines for every other dataset must agree too.
        lines = [sorted(" ".join(l) for l in manifest_lines(f, p) if l[0].lstrip("/") != UNSEEDED)
                 for f, p in ((a, a_path), (b, b_path))]
        if lines[0] != lines[1]:
            fail(f"the sha256_manifest of {a_path} and {b_path} differ")
        keys = (set(a.attrs) | set(b.attrs)) - {"deck", "sha256_manifest"}
        for key in sorted(keys):
            if key not in a.attrs or key not in b.attrs or str(a.attrs[key]) != str(b.attrs[key]):
                fail(f"attribute {key} differs between {a_path} and {b_path}")
        print(f"{a_path} == {b_path}: {len(compared)} datasets bitwise ({UNSEEDED} aside), "
              f"{len(lines[0])} manifest slabs, {len(keys)} attributes")


def prefix(a_path, b_path, rows):
    rows = int(rows)
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        series = []
        a["metrics"].visititems(lambda n, o: series.append(n) if isinstance(o, h5py.Dataset) else None)
        compared = 0
        for name in sorted(series):
            if name.startswith("perf/"):
                continue
            if name not in b["metrics"]:
                fail(f"{b_path} has no series {name}")
            x, y = a["metrics"][name][...], b["metrics"][name][...]
            if len(x) < rows or len(y) < rows:
                fail(f"{name}: fewer than {rows} rows ({len(x)}, {len(y)})")
            if x[:rows].tobytes() != y[:rows].tobytes():
                first = int(np.nonzero(x[:rows].view(np.uint64) != y[:rows].view(np.uint64))[0][0])
                fail(f"{name} row {first}: {x[first]!r} != {y[first]!r}")
            compared += 1
        print(f"first {rows} rows of {compared} series bitwise equal")


if __name__ == "__main__":
    commands = {"verify": (verify, 1), "same": (same, 2), "prefix": (prefix, 3)}
    if len(sys.argv) < 2 or sys.argv[1] not in commands or len(sys.argv) != 2 + commands[sys.argv[1]][1]:
        print(__doc__)
        sys.exit(2)
    function, _ = commands[sys.argv[1]]
    try:
        function(*sys.argv[2:])
    except (OSError, KeyError) as error:
        fail(str(error))
