#!/usr/bin/env python3
"""Write the safetensors fixtures of tests/test_safetensors.c with the
reference implementation (pip install safetensors numpy), so that the C
loader is checked against files it did not write itself. The C tests never
run this script; rerun it only to regenerate the committed files.

    python3 tests/data/safetensors/make_fixtures.py [--check FILE ...]

--check loads files (e.g. ones qkv saved) with the reference loader and
prints their tensors: a cross-check of qkv_safetensors_save.
"""
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def mha():
    # torch.nn.MultiheadAttention(embed_dim=4, num_heads=2).state_dict() names
    # and shapes; values arange(n) / 8 - i, i the index in this list.
    shapes = [("in_proj_bias", (12,)), ("in_proj_weight", (12, 4)),
              ("out_proj.bias", (4,)), ("out_proj.weight", (4, 4))]
    t = {}
    for i, (name, shape) in enumerate(shapes):
        n = int(np.prod(shape))
        t[name] = (np.arange(n, dtype=np.float32) / 8 - i).reshape(shape)
    save_file(t, os.path.join(HERE, "mha.safetensors"), metadata={"format": "pt"})


def dtypes():
    t = {
        "half": np.array([1.0, -2.5, 65504.0, 2.0 ** -24, np.inf, 0.0, np.nan, -0.0],
                         dtype=np.float16).reshape(2, 4),
        "double": np.array([0.1, 0.5, -1e300], dtype=np.float64),
        "int32": np.array([7, -2 ** 31], dtype=np.int32),
        "int64": np.array([2 ** 63 - 1], dtype=np.int64),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 5), dtype=np.float32),
    }
    save_file(t, os.path.join(HERE, "dtypes.safetensors"))


def check(paths):
    for p in paths:
        t = load_file(p)
        for k, v in t.items():
            print(p, k, v.dtype, v.shape, v.ravel()[:6])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        check(sys.argv[2:])
    else:
        mha()
        dtypes()
