"""Tests of the Python module against a NumPy reference (float64).

Run: python3 -m pytest python/tests   or   python3 python/tests/test_qkv.py
(the module is found from this file's place; the library as python/qkv says:
$QKV_LIBRARY or the newest build*/libqkv.so of the source tree)."""
import unittest

import numpy as np

from qkv_under_test import qkv  # noqa: E402  (the source tree's, or the installed one)


def ref_attention(q, k, v, causal=False, window=None, scale=None, key_lengths=None,
                  norm="softmax"):
    """q [B, nq, H, D], k [B, nk, Hkv, D], v [B, nk, Hkv, Dv] in float64:
    (out, P) with P [B, H, nq, nk] (masked weights 0)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, nq, H, D = q.shape
    nk, Hkv = k.shape[1], k.shape[2]
    g = H // Hkv
    kk = np.repeat(k, g, axis=2)
    vv = np.repeat(v, g, axis=2)
    sc = 1.0 / np.sqrt(D) if scale is None else scale
    s = np.einsum("bihd,bjhd->bhij", q, kk) * sc
    pos = np.arange(nq)[:, None] + nk - nq
    j = np.arange(nk)[None, :]
    vis = np.ones((nq, nk), dtype=bool)
    if causal:
        vis &= j <= pos
    if window is not None:
        vis &= j >= pos - window[0]
        if not causal:
            vis &= j <= pos + window[1]
    vis = np.broadcast_to(vis, (B, H, nq, nk)).copy()
    if key_lengths is not None:
        for b in range(B):
            vis[b, :, :, key_lengths[b]:] = False
    if norm == "softmax":
        s = np.where(vis, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.where(vis, np.exp(s - m), 0.0)
        tot = e.sum(axis=-1, keepdims=True)
        p = np.where(tot > 0, e / np.where(tot > 0, tot, 1.0), 0.0)
    elif norm == "sigmoid":
        p = np.where(vis, 1.0 / (1.0 + np.exp(-s)), 0.0)
    else:
        p = np.where(vis, np.maximum(s, 0.0), 0.0)
    out = np.einsum("bhij,bjhd->bihd", p, vv)
    return out, p


def ref_backward(q, k, v, dout, causal=False, scale=None):
    """Softmax attention gradients in float64 (H_kv = H)."""
    q, k, v, dout = (np.asarray(a, dtype=np.float64) for a in (q, k, v, dout))
    D = q.shape[3]
    sc = 1.0 / np.sqrt(D) if scale is None else scale
    _, p = ref_attention(q, k, v, causal=causal, scale=scale)
    dv = np.einsum("bhij,bihd->bjhd", p, dout)
    dp = np.einsum("bihd,bjhd->bhij", dout, v)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = np.einsum("bhij,bjhd->bihd", ds, k) * sc
    dk = np.einsum("bhij,bihd->bjhd", ds, q) * sc
    return dq, dk, dv


def ref_mha(x, sd, heads, causal=False):
    """torch.nn.MultiheadAttention's forward in float64 from a state dict."""
    x = np.asarray(x, dtype=np.float64)
    B, n, E = x.shape
    Dh = E // heads
    w = sd["in_proj_weight"].astype(np.float64)
    b = sd["in_proj_bias"].astype(np.float64)
    q = (x @ w[:E].T + b[:E]).reshape(B, n, heads, Dh)
    k = (x @ w[E:2 * E].T + b[E:2 * E]).reshape(B, n, heads, Dh)
    v = (x @ w[2 * E:].T + b[2 * E:]).reshape(B, n, heads, Dh)
    o, _ = ref_attention(q, k, v, causal=causal)
    return o.reshape(B, n, E) @ sd["out_proj.weight"].astype(np.float64).T + \
        sd["out_proj.bias"].astype(np.float64)


class TestAttention(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(1234)

    def rand(self, *shape, dtype=np.float32):
        return self.rng.standard_normal(shape).astype(dtype)

    def test_version(self):
        self.assertRegex(qkv.version(), r"^\d+\.\d+\.\d+$")

    def test_forward_matches_numpy(self):
        for dtype, tol in ((np.float64, 1e-12), (np.float32, 2e-5)):
            for causal in (False, True):
                for impl in ("auto", "reference"):
                    q, k, v = (self.rand(2, 7, 3, 8, dtype=dtype) for _ in range(3))
                    out, attn, lse = qkv.attention_forward(q, k, v, causal=causal, impl=impl,
                                                           return_attn=True, return_lse=True)
                    self.assertEqual(out.dtype, dtype)
                    ro, rp = ref_attention(q, k, v, causal=causal)
                    np.testing.assert_allclose(out, ro, atol=tol, rtol=0)
                    np.testing.assert_allclose(attn, rp, atol=tol, rtol=0)
                    self.assertEqual(lse.shape, (2, 3, 7))

    def test_shapes_gqa_window_lengths(self):
        q = self.rand(2, 9, 4, 5)
        k = self.rand(2, 11, 2, 5)
        v = self.rand(2, 11, 2, 3)
        out = qkv.attention_forward(q, k, v, window=(2, 1), key_lengths=[11, 6])
        ro, _ = ref_attention(q, k, v, window=(2, 1), key_lengths=[11, 6])
        self.assertEqual(out.shape, (2, 9, 4, 3))
        np.testing.assert_allclose(out, ro, atol=2e-5, rtol=0)
        # one head [n, D] and [n, H, D]
        x = self.rand(6, 4)
        o2 = qkv.attention_forward(x, x, x, causal=True)
        self.assertEqual(o2.shape, (6, 4))
        ro2, _ = ref_attention(x[None, :, None], x[None, :, None], x[None, :, None], causal=True)
        np.testing.assert_allclose(o2, ro2[0, :, 0], atol=2e-5, rtol=0)
        o3 = qkv.attention_forward(q[0], k[0], v[0], scale=0.5)
        ro3, _ = ref_attention(q[:1], k[:1], v[:1], scale=0.5)
        np.testing.assert_allclose(o3, ro3[0], atol=2e-5, rtol=0)

    def test_other_normalisers(self):
        q, k, v = (self.rand(1, 6, 2, 4, dtype=np.float64) for _ in range(3))
        for norm in ("sigmoid", "relu"):
            out = qkv.attention_forward(q, k, v, norm=norm, causal=True)
            ro, _ = ref_attention(q, k, v, norm=norm, causal=True)
            np.testing.assert_allclose(out, ro, atol=1e-12, rtol=0)

    def test_backward_matches_numpy(self):
        for dtype, tol in ((np.float64, 1e-11), (np.float32, 1e-4)):
            for causal in (False, True):
                q, k, v, do = (self.rand(2, 8, 2, 6, dtype=dtype) for _ in range(4))
                dq, dk, dv = qkv.attention_backward(q, k, v, do, causal=causal)
                rq, rk, rv = ref_backward(q, k, v, do, causal=causal)
                for got, want in ((dq, rq), (dk, rk), (dv, rv)):
                    self.assertEqual(got.dtype, dtype)
                    np.testing.assert_allclose(got, want, atol=tol, rtol=0)

    def test_errors(self):
        q = self.rand(1, 4, 3, 8)
        k = self.rand(1, 4, 2, 8)  # 3 heads cannot share 2 key/value heads
        with self.assertRaises(qkv.Error) as cm:
            qkv.attention_forward(q, k, k)
        self.assertEqual(cm.exception.status, 4)  # QKV_ERR_HEADS
        bad = self.rand(1, 4, 1, 8)
        bad[0, 1, 0, 2] = np.nan
        with self.assertRaises(qkv.Error) as cm:
            qkv.attention_forward(bad, bad, bad, check_finite=True)
        self.assertEqual(cm.exception.status, 17)  # QKV_ERR_NOT_FINITE
        out = qkv.attention_forward(bad, bad, bad)  # propagates when not checked
        self.assertTrue(np.isnan(out).any())
        with self.assertRaises(ValueError):
            qkv.attention_forward(np.zeros(3, np.float32), q, q)


class TestMultihead(unittest.TestCase):
    def test_forward_matches_numpy(self):
        rng = np.random.default_rng(7)
        for causal in (False, True):
            layer = qkv.MultiheadAttention(16, 4, causal=causal, seed=3)
            sd = layer.state_dict()
            sd["in_proj_bias"][:] = rng.standard_normal(48).astype(np.float32) * 0.1
            sd["out_proj.bias"][:] = rng.standard_normal(16).astype(np.float32) * 0.1
            x = rng.standard_normal((2, 5, 16)).astype(np.float32)
            y = layer.forward(x)
            np.testing.assert_allclose(y, ref_mha(x, sd, 4, causal=causal), atol=1e-5, rtol=0)

    def test_backward_by_finite_differences(self):
        rng = np.random.default_rng(8)
        layer = qkv.MultiheadAttention(8, 2, seed=5)
        sd = {k: v.copy() for k, v in layer.state_dict().items()}
        x = rng.standard_normal((1, 4, 8)).astype(np.float32)
        dy = rng.standard_normal((1, 4, 8)).astype(np.float32)
        layer.zero_grad()
        layer.forward(x)
        dx = layer.backward(dy)
        self.assertEqual(dx.shape, x.shape)
        loss = lambda xx: float((ref_mha(xx, sd, 2) * dy).sum())  # noqa: E731
        h = 1e-6
        x64 = x.astype(np.float64)
        for idx in [(0, 0, 0), (0, 1, 3), (0, 3, 7), (0, 2, 5)]:
            xp, xm = x64.copy(), x64.copy()
            xp[idx] += h
            xm[idx] -= h
            fd = (loss(xp) - loss(xm)) / (2 * h)
            self.assertAlmostEqual(float(dx[idx]), fd, delta=1e-4 * (1 + abs(fd)))
        # parameter gradient of the output bias: sum of dy over positions
        g = layer.grads
        E = 8
        db_out = g[3 * E * E + 3 * E + E * E:3 * E * E + 3 * E + E * E + E]
        np.testing.assert_allclose(db_out, dy.sum(axis=(0, 1)), atol=1e-5, rtol=0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
