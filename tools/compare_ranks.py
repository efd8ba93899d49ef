#!/usr/bin/env python3
"""Row-by-row comparison of metrics.h5 files from runs of one deck at several
rank counts (perf/* excluded): for each series that is not bitwise equal to
the first file's, the first differing row (optimizer step) and the largest
absolute difference. Exit status 1 when any series differs.

    tools/compare_ranks.py runs/x-1/metrics.h5 runs/x-2/metrics.h5 runs/x-4/metrics.h5
"""
import sys

import h5py
import numpy as np


def series(path):
    out = {}
    with h5py.File(path, "r") as f:
        f["metrics"].visititems(
            lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return {k: v for k, v in out.items() if not k.startswith("perf/")}


def differences(ref, other):
    rows = []
    for key in sorted(set(ref) | set(other)):
        if key not in ref or key not in other:
            rows.append((key, "missing in " + ("first" if key not in ref else "second"), 0.0))
            continue
        a, b = ref[key], other[key]
        if a.shape != b.shape:
            rows.append((key, f"shape {a.shape} vs {b.shape}", 0.0))
            continue
        same = (a.view(np.uint64) == b.view(np.uint64)) if a.dtype == np.float64 else (a == b)
        if not same.all():
            first = int(np.argmin(same))
            rows.append((key, f"row {first}", float(np.nanmax(np.abs(a - b)))))
    return rows


def main(paths):
    ref = series(paths[0])
    bad = False
    for path in paths[1:]:
        rows = differences(ref, series(path))
        print(f"{path} vs {paths[0]}: {len(rows)} of {len(ref)} series differ")
        for key, where, diff in rows:
            print(f"  {key}: first at {where}, max |diff| {diff:.3g}")
        bad = bad or bool(rows)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
