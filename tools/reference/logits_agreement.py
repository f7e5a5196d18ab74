#!/usr/bin/env python3
"""Greedy agreement and KL between two runs' logits (n_tokens x vocab float32 files).

Usage: logits_agreement.py A.f32 B.f32 VOCAB     prints argmax agreement and mean / max
KL(softmax(A) || softmax(B)) over positions (A is the reference).
"""
import sys

import numpy as np

a = np.fromfile(sys.argv[1], dtype="<f4")
b = np.fromfile(sys.argv[2], dtype="<f4")
V = int(sys.argv[3])
if a.size != b.size or a.size % V:
    sys.exit(f"sizes differ or are not rows of {V}: {a.size} vs {b.size}")
a = a.reshape(-1, V).astype(np.float64)
b = b.reshape(-1, V).astype(np.float64)
agree = float((a.argmax(1) == b.argmax(1)).mean())
la = a - a.max(1, keepdims=True)
la -= np.log(np.exp(la).sum(1, keepdims=True))
lb = b - b.max(1, keepdims=True)
lb -= np.log(np.exp(lb).sum(1, keepdims=True))
kl = (np.exp(la) * (la - lb)).sum(1)
print(f"positions {a.shape[0]}  argmax agreement {100 * agree:.2f}%  KL mean {kl.mean():.3g} max {kl.max():.3g}")
