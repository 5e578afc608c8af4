#!/usr/bin/env python3
"""Make torch_mha.safetensors: torch.nn.MultiheadAttention weights, inputs
and outputs, so tests/test_mha.c checks that qkv's layer computes what
PyTorch's does (batch_first) from the same state_dict.

Needs torch (pip install torch); the C tests only read the committed file.
The safetensors file is written by hand (8-byte header length, JSON, data)
so that no other package is needed.

Tensors (prefix "self." and "cross." for the two layers):
  <prefix><state_dict names>            the layer's weights
  <prefix>x, <prefix>xk, <prefix>xv     inputs [B, n, E] / [B, n_k, kdim|vdim]
  <prefix>y_<case>, <prefix>attn_<case> outputs [B, n, E], weights [B, H, n, n_k]
cases: plain, causal (self only), padded (key_padding_mask from lengths 5, 3)
"""
import json
import struct
import sys

import torch

torch.manual_seed(2024)
B, N, NK, E, H = 2, 5, 6, 8, 2
LENGTHS = [5, 3]
out = {}


def run(mha, prefix, x, xk, xv, n_k, causal_ok):
    sd = mha.state_dict()
    for name, t in sd.items():
        out[prefix + name] = t.detach().float().contiguous()
    out[prefix + "x"] = x
    if xk is not None:
        out[prefix + "xk"] = xk
        out[prefix + "xv"] = xv
    kk = x if xk is None else xk
    vv = x if xv is None else xv
    cases = {"plain": {}}
    if causal_ok:
        cases["causal"] = {"attn_mask": torch.triu(torch.ones(N, n_k, dtype=torch.bool), 1)}
    pad = torch.zeros(B, n_k, dtype=torch.bool)
    for b, L in enumerate(LENGTHS):
        pad[b, L:] = True
    cases["padded"] = {"key_padding_mask": pad}
    for name, kw in cases.items():
        y, w = mha(x, kk, vv, need_weights=True, average_attn_weights=False, **kw)
        out[prefix + "y_" + name] = y.detach().contiguous()
        out[prefix + "attn_" + name] = w.detach().contiguous()


with torch.no_grad():
    m1 = torch.nn.MultiheadAttention(E, H, batch_first=True)
    torch.nn.init.normal_(m1.in_proj_bias, std=0.1)
    torch.nn.init.normal_(m1.out_proj.bias, std=0.1)
    run(m1, "self.", torch.randn(B, N, E), None, None, N, True)
    m2 = torch.nn.MultiheadAttention(E, H, batch_first=True, kdim=6, vdim=5)
    torch.nn.init.normal_(m2.in_proj_bias, std=0.1)
    run(m2, "cross.", torch.randn(B, N, E), torch.randn(B, NK, 6), torch.randn(B, NK, 5), NK, False)

header, blobs, at = {}, [], 0
for name in sorted(out):
    t = out[name].float().contiguous()
    data = t.numpy().astype("<f4").tobytes()
    header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(data)]}
    blobs.append(data)
    at += len(data)
header["__metadata__"] = {"made_by": "tests/data/mha/make_torch_fixture.py", "torch": torch.__version__}
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
path = sys.argv[1] if len(sys.argv) > 1 else "torch_mha.safetensors"
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
print("wrote", path, at, "bytes of data")
