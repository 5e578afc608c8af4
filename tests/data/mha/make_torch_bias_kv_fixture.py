#!/usr/bin/env python3
"""Make torch_mha_bias_kv.safetensors: torch.nn.MultiheadAttention with
add_bias_kv=True (learned bias_k, bias_v appended to every sequence's keys
and values), so tests/test_mha.c checks that qkv's layer computes what
PyTorch's does (batch_first) from the same state_dict, masks included.

torch appends the extra key LAST and pads attn_mask and key_padding_mask
with one visible column: every query sees it, whatever the mask. qkv's attn
output has the same order (extra key last).

Needs torch; the C tests only read the committed file, written by hand
(8-byte header length, JSON, data) so that no other package is needed.

Layers (prefixes):
  self.    E 8, H 2, self-attention, n = 5
  nobias.  E 8, H 2, bias=False, self-attention, n = 5
  cross.   E 8, H 2, kdim 6, vdim 5, n_q = 7 > n_k = 6 (the causal case
           then has a query, row 0, whose only visible key is the extra one)
Tensors: <prefix><state_dict names>, <prefix>x [B, n_q, E],
<prefix>xk, <prefix>xv (cross), <prefix>y_<case> [B, n_q, E],
<prefix>attn_<case> [B, H, n_q, n_k + 1].
Cases: plain; causal (bottom-right: query i sees keys j <= i + n_k - n_q, as
qkv's mask); padded (key_padding_mask from lengths LENGTHS: batch 1 of the
self layers sees no key at all but the extra one); causal_padded (both).
"""
import json
import struct
import sys

import torch

torch.manual_seed(4242)
B, E, H = 2, 8, 2
out = {}


def run(mha, prefix, x, xk, xv, lengths):
    n_q = x.shape[1]
    kk = x if xk is None else xk
    vv = x if xv is None else xv
    n_k = kk.shape[1]
    for name, t in mha.state_dict().items():
        out[prefix + name] = t.detach().float().contiguous()
    out[prefix + "x"] = x
    if xk is not None:
        out[prefix + "xk"] = xk
        out[prefix + "xv"] = xv
    causal = torch.zeros(n_q, n_k, dtype=torch.bool)
    for i in range(n_q):
        causal[i, max(0, i + n_k - n_q + 1):] = True
    pad = torch.zeros(B, n_k, dtype=torch.bool)
    for b, L in enumerate(lengths):
        pad[b, L:] = True
    cases = {
        "plain": {},
        "causal": {"attn_mask": causal},
        "padded": {"key_padding_mask": pad},
        "causal_padded": {"attn_mask": causal, "key_padding_mask": pad},
    }
    for name, kw in cases.items():
        y, w = mha(x, kk, vv, need_weights=True, average_attn_weights=False, **kw)
        assert w.shape == (B, H, n_q, n_k + 1)
        assert not torch.isnan(y).any(), (prefix, name)
        out[prefix + "y_" + name] = y.detach().contiguous()
        out[prefix + "attn_" + name] = w.detach().contiguous()


with torch.no_grad():
    m1 = torch.nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=True)
    torch.nn.init.normal_(m1.in_proj_bias, std=0.1)
    torch.nn.init.normal_(m1.out_proj.bias, std=0.1)
    run(m1, "self.", torch.randn(B, 5, E), None, None, [3, 0])
    m2 = torch.nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=True, bias=False)
    run(m2, "nobias.", torch.randn(B, 5, E), None, None, [4, 0])
    m3 = torch.nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=True, kdim=6, vdim=5)
    torch.nn.init.normal_(m3.in_proj_bias, std=0.1)
    run(m3, "cross.", torch.randn(B, 7, E), torch.randn(B, 6, 6), torch.randn(B, 6, 5), [6, 2])

header, blobs, at = {}, [], 0
for name in sorted(out):
    t = out[name].float().contiguous()
    data = t.numpy().astype("<f4").tobytes()
    header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(data)]}
    blobs.append(data)
    at += len(data)
header["__metadata__"] = {"made_by": "tests/data/mha/make_torch_bias_kv_fixture.py", "torch": torch.__version__}
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
path = sys.argv[1] if len(sys.argv) > 1 else "torch_mha_bias_kv.safetensors"
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
print("wrote", path, at, "bytes of data")
