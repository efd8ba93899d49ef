"""Exit 0 when every dataset under the given groups of two HDF5 files has the
same name, dtype, shape and bytes in both; else name the first difference.
    python h5_equal.py A.h5 B.h5 /model /optimizer
(h5diff, which the e2e suites use, does not travel in the GPU kit.)"""
import sys

import h5py


def datasets(group):
    found = {}
    group.visititems(lambda name, item: found.__setitem__(name, item) if isinstance(item, h5py.Dataset) else None)
    return found


def main(a_path, b_path, *groups):
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        for group in groups:
            left, right = datasets(a[group]), datasets(b[group])
            if left.keys() != right.keys():
                sys.exit(f"{group}: datasets differ: {sorted(left.keys() ^ right.keys())[:5]}")
            for name, x in left.items():
                y = right[name]
                if x.dtype != y.dtype or x.shape != y.shape or x[()].tobytes() != y[()].tobytes():
                    sys.exit(f"{group}/{name}: {x.dtype}{x.shape} differs from {y.dtype}{y.shape} or its bytes do")
            print(f"{group}: {len(left)} datasets bitwise equal")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit("usage: h5_equal.py A.h5 B.h5 GROUP...")
    main(*sys.argv[1:])
