#!/usr/bin/env python3
"""Write the four-word example of the articles as .npy files (no numpy needed).

The sentence "Hello, I love you!" has four tokens. Each token gets an input
vector x (dimension 8); three fixed projections W_q, W_k, W_v (8 x 4) turn the
inputs into queries, keys and values, q = x W_q, k = x W_k, v = x W_v, as in
the articles' figure 2. The files hello_q.npy, hello_k.npy and hello_v.npy are
float32 arrays of shape [4, 4] (4 tokens, head dimension 4):

    qkv attend --q hello_q.npy --k hello_k.npy --v hello_v.npy -o out.npy --print

All numbers come from a small linear congruential generator with a fixed seed,
so the files are the same on every machine and every Python 3 version. The
seed was picked so that, as in the articles, "Hello" attends most to "I" and
least to "you". Run this script to regenerate the files next to it; it also
prints the attention matrix it expects (scaled dot product, softmax).
"""
import math
import os
import struct

TOKENS = ["Hello", "I", "love", "you"]
D_MODEL = 8   # dimension of the input vectors x
D_HEAD = 4    # dimension of q, k, v
SEED = 5      # see the docstring: "Hello" -> "I" strongest, "Hello" -> "you" weakest


class Lcg:
    """Numerical Recipes' 32-bit LCG: tiny, explicit, identical everywhere."""

    def __init__(self, seed):
        self.state = seed & 0xFFFFFFFF

    def uniform(self):
        """A number in [-1, 1), rounded to 2 decimals so the inputs stay readable."""
        self.state = (1664525 * self.state + 1013904223) & 0xFFFFFFFF
        return round(self.state / 2**31 - 1.0, 2)

    def matrix(self, rows, cols):
        return [[self.uniform() for _ in range(cols)] for _ in range(rows)]


def matmul(a, b):
    return [[sum(a[i][t] * b[t][j] for t in range(len(b))) for j in range(len(b[0]))]
            for i in range(len(a))]


def to_f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def npy_bytes(rows):
    """A version 1.0 .npy file of a 2-D float32 array given as a list of rows."""
    shape = (len(rows), len(rows[0]))
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % shape
    # Pad with spaces so that magic + version + length + header is a multiple of 64.
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * (pad % 64) + "\n"
    data = b"".join(struct.pack("<%df" % len(r), *r) for r in rows)
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + data


def attention(q, k):
    d = len(q[0])
    out = []
    for qi in q:
        s = [sum(a * b for a, b in zip(qi, kj)) / math.sqrt(d) for kj in k]
        m = max(s)
        e = [math.exp(x - m) for x in s]
        out.append([x / sum(e) for x in e])
    return out


def make(seed):
    rng = Lcg(seed)
    x = rng.matrix(len(TOKENS), D_MODEL)
    w_q = rng.matrix(D_MODEL, D_HEAD)
    w_k = rng.matrix(D_MODEL, D_HEAD)
    w_v = rng.matrix(D_MODEL, D_HEAD)
    q, k, v = ([[to_f32(e) for e in row] for row in matmul(x, w)] for w in (w_q, w_k, w_v))
    return x, q, k, v


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    x, q, k, v = make(SEED)
    a = attention(q, k)
    first = a[0]
    assert max(first) == first[1] and min(first) == first[3], "the seed no longer fits the story"
    for name, rows in (("q", q), ("k", k), ("v", v)):
        path = os.path.join(here, "hello_%s.npy" % name)
        with open(path, "wb") as f:
            f.write(npy_bytes(rows))
        print("wrote", path)
    print("expected A' = softmax(q k^T / sqrt(%d)):" % D_HEAD)
    print("%8s" % "" + "".join("%8s" % t for t in TOKENS))
    for t, row in zip(TOKENS, a):
        print("%8s" % t + "".join("%8.4f" % e for e in row))


if __name__ == "__main__":
    main()
