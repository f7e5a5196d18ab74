#!/usr/bin/env python3
"""max|a - b| / max|ref| over every position of two n_tokens x vocab float32 files.

Usage: compare_logits.py REF.f32 GOT.f32 VOCAB [--tol T]   (exit 1 when above T, default 1e-4)
"""
import argparse
import struct
import sys


def read(path):
    data = open(path, "rb").read()
    return struct.unpack("<%df" % (len(data) // 4), data)


ap = argparse.ArgumentParser()
ap.add_argument("ref")
ap.add_argument("got")
ap.add_argument("vocab", type=int)
ap.add_argument("--tol", type=float, default=1e-4)
a = ap.parse_args()
ref, got = read(a.ref), read(a.got)
if len(ref) != len(got):
    sys.exit(f"size differs: {len(ref)} vs {len(got)} floats")
mx = max(abs(x) for x in ref)
d = max(abs(x - y) for x, y in zip(ref, got))
worst = max(range(len(ref)), key=lambda i: abs(ref[i] - got[i])) // a.vocab
print(f"rel {d / mx:.3g} (max|d| {d:.3g}, max|ref| {mx:.3g}, worst position {worst})")
sys.exit(0 if d / mx <= a.tol else 1)
