#!/usr/bin/env python3
"""Write the small .npy fixtures of the CLI tests (tests/cli/*.sh).

Pure Python 3 standard library (no numpy), so the fixtures can be regenerated
anywhere; the shell tests only read the committed files and need no Python.
Values come from a fixed-seed LCG and are rounded to 2 decimals. Every file is
tiny (well under 2 KB). Run: python3 tests/data/cli/make_fixtures.py
"""
import os
import struct

FORMATS = {"<f4": "f", "<f8": "d", "<i4": "i", "<i8": "q"}


class Lcg:
    def __init__(self, seed):
        self.state = seed & 0xFFFFFFFF

    def uniform(self):
        self.state = (1664525 * self.state + 1013904223) & 0xFFFFFFFF
        return round(self.state / 2**31 - 1.0, 2)


def count(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def npy_bytes(descr, shape, values):
    """A version 1.0 .npy file: C order, little-endian, values flattened."""
    assert len(values) == count(shape)
    dims = ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    data = struct.pack("<%d%s" % (len(values), FORMATS[descr]), *values)
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + data


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    rng = Lcg(2024)

    def rand(descr, shape):
        return descr, shape, [rng.uniform() for _ in range(count(shape))]

    fixtures = {
        # rank 2 (B = H = 1), companions of examples/data/hello_*.npy ([4, 4])
        "zeros_q": ("<f4", [4, 4], [0.0] * 16),            # uniform attention: 0.25 each
        "vidx": ("<f4", [4, 2], [0, 0, 1, 2, 2, 4, 3, 6]),  # v[j] = [j, 2j]
        "dout2": rand("<f4", [4, 4]),
        "bias2": rand("<f4", [4, 4]),
        "offsets": ("<i8", [3], [0, 1, 4]),
        "lens1": ("<i4", [1], [3]),
        # rank 3: n_q = 4, n_k = 5, H = 2, D = 4, D_v = 3 (cross-attention, D_v != D)
        "q3": rand("<f4", [4, 2, 4]),
        "k3": rand("<f4", [5, 2, 4]),
        "v3": rand("<f4", [5, 2, 3]),
        "dout3": rand("<f4", [4, 2, 3]),
        "bias3": rand("<f4", [2, 4, 5]),
        # GQA: 4 query heads over the 2 key/value heads of k3, v3
        "q3h4": rand("<f4", [4, 4, 4]),
        "dout3h4": rand("<f4", [4, 4, 3]),
        # rank 4: B = 2, n = 3, H = 2, H_kv = 1 (multi-query), float64 queries
        "q4": rand("<f8", [2, 3, 2, 4]),
        "k4": rand("<f4", [2, 3, 1, 4]),
        "v4": rand("<f4", [2, 3, 1, 4]),
        "dout4": rand("<f4", [2, 3, 2, 4]),
        "lens4": ("<i4", [2], [3, 1]),
        # 20 tokens: --print shows 16 x 16 and says it is truncated
        "long": rand("<f4", [20, 2]),
        # bad inputs for attend_errors.sh
        "q_int": ("<i4", [4, 4], list(range(16))),
        "k_d3": rand("<f4", [4, 3]),         # head dim 3 != 4 of hello_q
        "v_n5": rand("<f4", [5, 4]),         # 5 keys != 4 of hello_k
        "q3h3": rand("<f4", [4, 3, 4]),      # 3 heads, not a multiple of k3's 2
        "vec": rand("<f4", [4]),             # rank 1
        "lens_bad": ("<i4", [1], [9]),       # > n_k = 4
        "lens_float": ("<f4", [1], [3.0]),
        "offsets_bad": ("<i8", [3], [0, 3, 2]),  # decreasing
        "offsets_end": ("<i8", [3], [0, 2, 5]),  # ends past n = 4
        "bias_bad": rand("<f4", [3, 4]),
    }
    for name, (descr, shape, values) in sorted(fixtures.items()):
        path = os.path.join(here, name + ".npy")
        data = npy_bytes(descr, shape, values)
        assert len(data) < 2048, name
        with open(path, "wb") as f:
            f.write(data)
    print("wrote %d fixtures to %s" % (len(fixtures), here))


if __name__ == "__main__":
    main()
