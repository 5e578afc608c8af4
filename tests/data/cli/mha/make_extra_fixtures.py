#!/usr/bin/env python3
"""Write the `qkv mha` fixtures of the layer's two optional parts (read by
tests/test_cli_mha.c and tests/cli/mha_ok.sh; the tests need no Python):

  bias_kv.safetensors   torch.nn.MultiheadAttention(8, 2, add_bias_kv=True)'s
                        state_dict (bias_k, bias_v [1, 1, 8]), no prefix
  y_bias_kv.npy, y_bias_kv_causal_padded.npy [2, 5, 8],
  attn_bias_kv_causal_padded.npy [2, 2, 5, 6]  torch's outputs on x.npy
                        (causal: torch's attn_mask triu(1); padded: the
                        key_padding_mask of lens.npy), extra key last
  additive.safetensors  a torch layer's weights plus qkv's additive score
                        parameters additive.w1, additive.w2 [2, 3, 4],
                        additive.w [2, 3] (torch has no additive score)
  y_additive.npy, y_additive_causal_padded.npy [2, 5, 8]  a float64 numpy
                        transcription of the layer with the additive score
                        s = w_h . tanh(W1_h q + W2_h k) (include/qkv.h)

Inputs x.npy and lens.npy are those of make_fixtures.py. Needs torch, numpy:
    python tests/data/cli/mha/make_extra_fixtures.py
"""
import json
import os
import struct

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
E, H, A = 8, 2, 3
DH = E // H


def write_safetensors(name, tensors):
    header, blobs, at = {}, [], 0
    for key in sorted(tensors):
        data = np.ascontiguousarray(tensors[key], dtype="<f4").tobytes()
        header[key] = {"dtype": "F32", "shape": list(np.shape(tensors[key])),
                       "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    header["__metadata__"] = {"made_by": "tests/data/cli/mha/make_extra_fixtures.py"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def save(name, a):
    np.save(os.path.join(HERE, name), np.ascontiguousarray(a, dtype="<f4"))


def additive_mha(x, sd, w1, w2, w, causal=False, lens=None):
    """The layer in float64 with the additive score (self-attention)."""
    x = x.astype(np.float64)
    W = {k: v.astype(np.float64) for k, v in sd.items()}
    B, n, _ = x.shape
    qkv = x @ W["in_proj_weight"].T + W["in_proj_bias"]
    q, k, v = qkv[..., :E], qkv[..., E:2 * E], qkv[..., 2 * E:]
    o = np.zeros((B, n, E))
    for b in range(B):
        for h in range(H):
            sl = slice(h * DH, (h + 1) * DH)
            uq = q[b, :, sl] @ w1[h].T          # [n, A]
            uk = k[b, :, sl] @ w2[h].T          # [n, A]
            s = np.tanh(uq[:, None, :] + uk[None, :, :]) @ w[h]   # [n, n]
            vis = np.ones((n, n), bool)
            if causal:
                vis &= np.tril(np.ones((n, n), bool))
            if lens is not None:
                vis &= np.arange(n)[None, :] < lens[b]
            s = np.where(vis, s, -np.inf)
            mx = s.max(axis=1, keepdims=True)
            p = np.where(vis, np.exp(s - mx), 0.0)
            p /= p.sum(axis=1, keepdims=True)
            o[b, :, sl] = p @ v[b, :, sl]
    return o @ W["out_proj.weight"].T + W["out_proj.bias"]


def main():
    x = np.load(os.path.join(HERE, "x.npy"))
    lens = np.load(os.path.join(HERE, "lens.npy"))
    xt = torch.from_numpy(x)
    n = x.shape[1]
    causal = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
    pad = torch.arange(n)[None, :] >= torch.from_numpy(lens)[:, None]

    torch.manual_seed(77)
    with torch.no_grad():
        m = torch.nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=True)
        torch.nn.init.normal_(m.in_proj_bias, std=0.1)
        torch.nn.init.normal_(m.out_proj.bias, std=0.1)
        sd = {k: v.numpy() for k, v in m.state_dict().items()}
        write_safetensors("bias_kv.safetensors", sd)
        y, _ = m(xt, xt, xt, need_weights=False)
        save("y_bias_kv.npy", y.numpy())
        y, a = m(xt, xt, xt, attn_mask=causal, key_padding_mask=pad, need_weights=True,
                 average_attn_weights=False)
        save("y_bias_kv_causal_padded.npy", y.numpy())
        save("attn_bias_kv_causal_padded.npy", a.numpy())

        m2 = torch.nn.MultiheadAttention(E, H, batch_first=True)
        torch.nn.init.normal_(m2.in_proj_bias, std=0.1)
        torch.nn.init.normal_(m2.out_proj.bias, std=0.1)
        sd2 = {k: v.numpy() for k, v in m2.state_dict().items()}
    rng = np.random.default_rng(5)
    w1 = rng.uniform(-0.6, 0.6, (H, A, DH)).astype(np.float32)
    w2 = rng.uniform(-0.6, 0.6, (H, A, DH)).astype(np.float32)
    w = rng.uniform(-1.0, 1.0, (H, A)).astype(np.float32)
    t = dict(sd2)
    t.update({"additive.w1": w1, "additive.w2": w2, "additive.w": w})
    write_safetensors("additive.safetensors", t)
    save("y_additive.npy", additive_mha(x, sd2, w1.astype(np.float64), w2.astype(np.float64),
                                        w.astype(np.float64)))
    save("y_additive_causal_padded.npy",
         additive_mha(x, sd2, w1.astype(np.float64), w2.astype(np.float64), w.astype(np.float64),
                      causal=True, lens=lens))
    print("wrote the bias_kv and additive fixtures in", HERE)


if __name__ == "__main__":
    main()
