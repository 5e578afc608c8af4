#!/usr/bin/env python3
"""Write the fixtures of the `qkv mha` tests (tests/test_cli_mha.c,
tests/cli/mha_ok.sh, tests/cli/mha_errors.sh). The tests only read the
committed files; they need no Python.

Needs torch and numpy. Run from anywhere:
    python tests/data/cli/mha/make_fixtures.py

Sources of truth:
  * torch.nn.MultiheadAttention (batch_first): the weights, inputs and outputs
    of tests/data/mha/torch_mha.safetensors (made by make_torch_fixture.py),
    copied here as .npy and a weights-only safetensors file, plus new torch
    layers (no bias; kdim = vdim = 6 for --kv) and the torch layer on inputs
    with the sinusoidal encoding added;
  * a plain float64 numpy transcription of the layer's formulas in
    include/qkv.h for what torch does not have: --join mean, grouped-query
    heads, RoPE and ALiBi.

Files (B = 2, n = 5, n_k = 6, E = 8, H = 2 unless said):
  weights.safetensors   "self." (fused in_proj_weight) and "cross." (kdim 6,
                        vdim 5: q/k/v_proj_weight) layers of the torch fixture
  x.npy [2,5,8], y_{plain,causal,padded}.npy, attn_{plain,causal,padded}.npy
  cx.npy [2,5,8], cxk.npy [2,6,6], cxv.npy [2,6,5], cy_{plain,padded}.npy,
  cattn_{plain,padded}.npy                                  (cross.)
  lens.npy int64 [5, 3]; lens1.npy int64 [3] (for x1.npy); x1.npy = x[1] [5,8]
  cx1.npy, cxk1.npy, cxv1.npy: batch 1 of the cross inputs, rank 2
  split.safetensors     the self layer with q/k/v_proj_weight instead of
                        in_proj_weight, no prefix (must give y_plain)
  nobias.safetensors    torch layer with bias=False, y_nobias.npy
  kv.safetensors        torch layer kdim = vdim = 6; kv.npy [2,6,6];
                        y_kv.npy, attn_kv.npy (keys = values = kv)
  y_sinusoidal.npy      torch self layer on x + PE
  mean.safetensors      self in_proj + out_proj.weight [8, 4]; y_mean.npy
  gqa.safetensors       H = 4, H_kv = 2, Dh = 2; y_gqa.npy, y_gqa_causal.npy
  y_rope.npy, y_alibi.npy, y_alibi_causal.npy   self layer, numpy reference
"""
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))
SRC = os.path.join(ROOT, "tests", "data", "mha", "torch_mha.safetensors")
E, H, N, NK = 8, 2, 5, 6
LENGTHS = [5, 3]


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (hl,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + hl])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        assert h["dtype"] == "F32"
        b, e = h["data_offsets"]
        out[name] = np.frombuffer(blob[8 + hl + b : 8 + hl + e], dtype="<f4").reshape(h["shape"])
    return out


def write_safetensors(name, tensors):
    header, blobs, at = {}, [], 0
    for key in sorted(tensors):
        data = np.ascontiguousarray(tensors[key], dtype="<f4").tobytes()
        header[key] = {"dtype": "F32", "shape": list(np.shape(tensors[key])),
                       "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    header["__metadata__"] = {"made_by": "tests/data/cli/mha/make_fixtures.py"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def save(name, a, dtype="<f4"):
    np.save(os.path.join(HERE, name), np.ascontiguousarray(a, dtype=dtype))


# ---- a float64 transcription of include/qkv.h's layer -------------------------

def alibi_slopes(h):
    assert h & (h - 1) == 0, "powers of two only here"
    return np.array([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)])


def rope(t, offset, base=10000.0):
    """t [B, n, heads, D], rotate-half layout, position offset + i."""
    t = t.copy()
    d = t.shape[-1]
    half = d // 2
    pos = offset + np.arange(t.shape[1], dtype=np.float64)
    ang = pos[:, None] * base ** (-2.0 * np.arange(half) / d)  # [n, half]
    cs, sn = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
    x0, x1 = t[..., :half].copy(), t[..., half:].copy()
    t[..., :half] = x0 * cs - x1 * sn
    t[..., half:] = x0 * sn + x1 * cs
    return t


def ref_mha(x, xk, xv, wq, wk, wv, b_in, wo, bo, heads, heads_kv, causal=False, lens=None,
            join="concat", pos="none"):
    x, xk, xv = (np.asarray(a, np.float64) for a in (x, xk, xv))
    dh = wq.shape[0] // heads
    dq, dkv = heads * dh, heads_kv * dh
    bq = b_in[:dq] if b_in is not None else 0.0
    bk = b_in[dq : dq + dkv] if b_in is not None else 0.0
    bv = b_in[dq + dkv :] if b_in is not None else 0.0
    B, n, nk = x.shape[0], x.shape[1], xk.shape[1]
    q = (x @ wq.T.astype(np.float64) + bq).reshape(B, n, heads, dh)
    k = (xk @ wk.T.astype(np.float64) + bk).reshape(B, nk, heads_kv, dh)
    v = (xv @ wv.T.astype(np.float64) + bv).reshape(B, nk, heads_kv, dh)
    if pos == "rope":
        q, k = rope(q, nk - n), rope(k, 0)
    o = np.zeros((B, n, heads, dh))
    slopes = alibi_slopes(heads)
    for b in range(B):
        for h in range(heads):
            g = h // (heads // heads_kv)
            s = q[b, :, h] @ k[b, :, g].T / np.sqrt(dh)
            p = np.arange(n)[:, None] + nk - n
            j = np.arange(nk)[None, :]
            if pos == "alibi":
                s = s - slopes[h] * np.abs(j - p)
            vis = np.ones((n, nk), bool)
            if causal:
                vis &= j <= p
            if lens is not None:
                vis &= j < lens[b]
            s = np.where(vis, s, -np.inf)
            a = np.exp(s - s.max(axis=1, keepdims=True))
            a /= a.sum(axis=1, keepdims=True)
            o[b, :, h] = a @ v[b, :, g]
    if join == "mean":
        oj = o.mean(axis=2)
    else:
        oj = o.reshape(B, n, dq)
    y = oj @ wo.T.astype(np.float64)
    if bo is not None:
        y = y + bo
    return y


def sinusoidal(n, e):
    pe = np.zeros((n, e))
    for i in range(n):
        for t in range(0, e, 2):
            w = i * np.exp(-np.log(10000.0) * t / e)
            pe[i, t] = np.sin(w)
            if t + 1 < e:
                pe[i, t + 1] = np.cos(w)
    return pe.astype(np.float32)


def torch_layer(sd, **kw):
    m = torch.nn.MultiheadAttention(E, H, batch_first=True, **kw)
    m.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()})
    return m


def main():
    src = read_safetensors(SRC)
    sub = lambda p: {k[len(p):]: v for k, v in src.items() if k.startswith(p)}
    weight_names = ("in_proj_weight", "in_proj_bias", "q_proj_weight", "k_proj_weight",
                    "v_proj_weight", "out_proj.weight", "out_proj.bias")
    s, c = sub("self."), sub("cross.")

    # The torch fixture, as the CLI takes it.
    write_safetensors("weights.safetensors",
                      {p + k: v for p, d in (("self.", s), ("cross.", c)) for k, v in d.items()
                       if k in weight_names})
    save("x.npy", s["x"])
    save("x1.npy", s["x"][1])
    for case in ("plain", "causal", "padded"):
        save("y_%s.npy" % case, s["y_" + case])
        save("attn_%s.npy" % case, s["attn_" + case])
    save("cx.npy", c["x"])
    save("cxk.npy", c["xk"])
    save("cxv.npy", c["xv"])
    save("cx1.npy", c["x"][1])
    save("cxk1.npy", c["xk"][1])
    save("cxv1.npy", c["xv"][1])
    for case in ("plain", "padded"):
        save("cy_%s.npy" % case, c["y_" + case])
        save("cattn_%s.npy" % case, c["attn_" + case])
    save("lens.npy", LENGTHS, "<i8")
    save("lens1.npy", LENGTHS[1:], "<i8")

    self_sd = {k: s[k] for k in ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")}
    x = s["x"]
    xt = torch.from_numpy(np.array(x))
    wq, wk, wv = np.split(s["in_proj_weight"], 3)

    # Separate q/k/v matrices of a fused-shape layer (no prefix).
    write_safetensors("split.safetensors", {"q_proj_weight": wq, "k_proj_weight": wk,
                                            "v_proj_weight": wv, "in_proj_bias": s["in_proj_bias"],
                                            "out_proj.weight": s["out_proj.weight"],
                                            "out_proj.bias": s["out_proj.bias"]})

    torch.manual_seed(7)
    with torch.no_grad():
        # The self layer on x + PE (--pos sinusoidal).
        m = torch_layer(self_sd)
        xs = xt + torch.from_numpy(sinusoidal(N, E))
        y, _ = m(xs, xs, xs, need_weights=False)
        save("y_sinusoidal.npy", y.numpy())

        # No biases.
        m = torch.nn.MultiheadAttention(E, H, batch_first=True, bias=False)
        write_safetensors("nobias.safetensors", {k: v.numpy() for k, v in m.state_dict().items()})
        y, _ = m(xt, xt, xt, need_weights=False)
        save("y_nobias.npy", y.numpy())

        # kdim = vdim = 6: keys = values from one input (--kv).
        m = torch.nn.MultiheadAttention(E, H, batch_first=True, kdim=6, vdim=6)
        torch.nn.init.normal_(m.in_proj_bias, std=0.1)
        torch.nn.init.normal_(m.out_proj.bias, std=0.1)
        write_safetensors("kv.safetensors", {k: v.numpy() for k, v in m.state_dict().items()})
        kv = torch.randn(2, NK, 6)
        save("kv.npy", kv.numpy())
        y, w = m(xt, kv, kv, need_weights=True, average_attn_weights=False)
        save("y_kv.npy", y.numpy())
        save("attn_kv.npy", w.numpy())

    rng = np.random.default_rng(11)
    b_in, wo, bo = s["in_proj_bias"], s["out_proj.weight"], s["out_proj.bias"]

    # --join mean: W_o [E, Dh].
    wo_mean = rng.normal(0, 0.5, (E, E // H)).astype(np.float32)
    write_safetensors("mean.safetensors", {"in_proj_weight": s["in_proj_weight"], "in_proj_bias": b_in,
                                           "out_proj.weight": wo_mean, "out_proj.bias": bo})
    save("y_mean.npy", ref_mha(x, x, x, wq, wk, wv, b_in, wo_mean, bo, H, H, join="mean"))

    # Grouped-query attention: H = 4 query heads share H_kv = 2 key/value heads of Dh = 2.
    g = {"q_proj_weight": rng.normal(0, 0.4, (8, E)), "k_proj_weight": rng.normal(0, 0.4, (4, E)),
         "v_proj_weight": rng.normal(0, 0.4, (4, E)), "in_proj_bias": rng.normal(0, 0.1, 16),
         "out_proj.weight": rng.normal(0, 0.4, (E, 8)), "out_proj.bias": rng.normal(0, 0.1, E)}
    g = {k: v.astype(np.float32) for k, v in g.items()}
    write_safetensors("gqa.safetensors", g)
    gargs = (g["q_proj_weight"], g["k_proj_weight"], g["v_proj_weight"], g["in_proj_bias"],
             g["out_proj.weight"], g["out_proj.bias"], 4, 2)
    save("y_gqa.npy", ref_mha(x, x, x, *gargs))
    save("y_gqa_causal.npy", ref_mha(x, x, x, *gargs, causal=True))

    # RoPE and ALiBi on the self layer.
    sargs = (wq, wk, wv, b_in, wo, bo, H, H)
    save("y_rope.npy", ref_mha(x, x, x, *sargs, pos="rope"))
    save("y_alibi.npy", ref_mha(x, x, x, *sargs, pos="alibi"))
    save("y_alibi_causal.npy", ref_mha(x, x, x, *sargs, pos="alibi", causal=True))

    # The transcription agrees with torch where both exist.
    for case, kw in (("plain", {}), ("causal", {"causal": True}), ("padded", {"lens": LENGTHS})):
        err = np.abs(ref_mha(x, x, x, *sargs, **kw) - s["y_" + case]).max()
        assert err < 1e-5, (case, err)
    err = np.abs(ref_mha(c["x"], c["xk"], c["xv"], c["q_proj_weight"], c["k_proj_weight"],
                         c["v_proj_weight"], c["in_proj_bias"], c["out_proj.weight"],
                         c["out_proj.bias"], H, H) - c["y_plain"]).max()
    assert err < 1e-5, ("cross", err)
    print("wrote the fixtures into", HERE, file=sys.stderr)


if __name__ == "__main__":
    main()
