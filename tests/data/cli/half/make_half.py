#!/usr/bin/env python3
"""Fixtures of tests/cli/attend_half.sh (qkv attend --dtype bf16|fp16).

q [40, 4, 32], k and v [56, 2, 32] (grouped-query, 4 query heads over 2
key/value heads), N(0, 1) float32, causal mask (aligned bottom-right). Writes
  q.npy k.npy v.npy           float32 inputs
  q_f2.npy k_f2.npy v_f2.npy  the same rounded to fp16 ('<f2')
  q_u2.npy k_u2.npy v_u2.npy  the same rounded to bf16, nearest even, stored
                              as uint16 bit patterns ('<u2': qkv's convention)
  ref.npy                     the exact output in float64 from the float32 inputs
  tol.txt                     per dtype: the error bound the test applies,
                              2 x the max error of a plain half implementation
                              (QK^T of half inputs accumulated in float32,
                              float32 softmax, P rounded to half, PV in
                              float32, output rounded to half) + 1e-5, the
                              library's rule (docs/HALF.md, FlashAttention's)
Needs numpy. Run from anywhere: python3 make_half.py
"""
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(8)
NQ, NK, H, HKV, D = 40, 56, 4, 2, 32
q = rng.standard_normal((NQ, H, D)).astype(np.float32)
k = rng.standard_normal((NK, HKV, D)).astype(np.float32)
v = rng.standard_normal((NK, HKV, D)).astype(np.float32)


def to_bf16_bits(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # nearest even (no NaN here)
    return u.astype("<u2")


def bf16(x):
    return (to_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def attend(q, k, v, dt=np.float64, rnd=lambda x: x):
    """Causal attention; rnd rounds P and the output (the plain half path)."""
    out = np.zeros((NQ, H, D), dt)
    scale = 1.0 / np.sqrt(D)
    for h in range(H):
        g = h // (H // HKV)
        s = (q[:, h, :].astype(dt) @ k[:, g, :].astype(dt).T) * dt(scale)
        i = np.arange(NQ)[:, None] + (NK - NQ)
        s = np.where(np.arange(NK)[None, :] <= i, s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p = p / p.sum(axis=1, keepdims=True)
        out[:, h, :] = rnd(rnd(p.astype(dt)) @ v[:, g, :].astype(dt))
    return out


ref = attend(q, k, v)
tol = {}
for name, r in (("bf16", bf16), ("fp16", f16)):
    plain = attend(r(q), r(k), r(v), np.float32, r)
    tol[name] = 2 * float(np.abs(plain - ref).max()) + 1e-5
np.save(os.path.join(HERE, "q.npy"), q)
np.save(os.path.join(HERE, "k.npy"), k)
np.save(os.path.join(HERE, "v.npy"), v)
for n, x in (("q", q), ("k", k), ("v", v)):
    np.save(os.path.join(HERE, n + "_f2.npy"), x.astype("<f2"))
    np.save(os.path.join(HERE, n + "_u2.npy"), to_bf16_bits(x))
np.save(os.path.join(HERE, "ref.npy"), ref)
with open(os.path.join(HERE, "tol.txt"), "w") as f:
    for name in ("bf16", "fp16"):
        f.write("%s %.6g\n" % (name, tol[name]))
print(tol)
