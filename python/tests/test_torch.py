"""Tests of qkv.torch.scaled_dot_product_attention against the explicit
math of torch's scaled dot-product attention, softmax(Q K^T scale + mask) V,
computed by torch in float64 (and against torch.nn.functional's own
scaled_dot_product_attention where the installed torch has it, 2.0 on):
forward within 1e-5 (float32) and 1e-12 (float64), gradients with
torch.autograd.gradcheck in float64 (query, key, value and float masks),
masks of every kind, is_causal with L != S (top-left, as torch), GQA,
dropout, half precision, and the errors.

Needs PyTorch (Debian: apt-get install python3-torch) and NumPy.
Run: python3 python/tests/test_torch.py   (or python3 -m pytest python/tests;
the library as python/qkv says: $QKV_LIBRARY or the newest build*/libqkv.so;
QKV_TEST_INSTALLED=1 tests the installed package instead)."""
import math
import unittest

import torch
import torch.nn.functional as F

from qkv_under_test import qkv  # noqa: E402  (the source tree's, or the installed one)
import qkv.torch as qt  # noqa: E402

sdpa = qt.scaled_dot_product_attention
TORCH_SDPA = getattr(F, "scaled_dot_product_attention", None)


def ref_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """torch's documented math, in the inputs' dtype: (out, weights)."""
    if enable_gqa:
        g = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(g, dim=-3)
        v = v.repeat_interleave(g, dim=-3)
    L, S = q.shape[-2], k.shape[-2]
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-2, -1) * sc
    if is_causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, -math.inf)
        else:
            s = s + attn_mask
    w = torch.softmax(s, dim=-1)
    return w @ v, w


def rand(*shape, dtype=torch.float64, grad=False, seed=None):
    g = torch.Generator().manual_seed(hash(shape) % 1000 if seed is None else seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(grad)


def qkv_of(B, H, L, S, E, Ev=None, Hk=None, dtype=torch.float64, grad=False):
    lead = (B,) if B else ()
    Hk = H if Hk is None else Hk
    return (rand(*lead, H, L, E, dtype=dtype, grad=grad, seed=1),
            rand(*lead, Hk, S, E, dtype=dtype, grad=grad, seed=2),
            rand(*lead, Hk, S, E if Ev is None else Ev, dtype=dtype, grad=grad, seed=3))


def check_half(tc, dtype, inside=False, return_attn=False):
    """Causal GQA attention stored in a half dtype (and laid out as the
    models' head views when inside) against the float64 math: the output
    within 4 tol, the weights (return_attn) within tol, the gradients within
    8 tol of their size (past 1), all in the dtype; tol 2e-2 for bfloat16,
    4e-3 for float16."""
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    q, k, v = qkv_of(2, 4, 33, 17, 16, Hk=2, dtype=dtype, grad=True)
    if inside:
        q, k, v = (heads_inside(t) for t in (q, k, v))
    res = sdpa(q, k, v, is_causal=True, enable_gqa=True, return_attn=return_attn)
    out, attn = res if return_attn else (res, None)
    tc.assertEqual(out.dtype, dtype)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, w = ref_sdpa(q64, k64, v64, is_causal=True, enable_gqa=True)
    tc.assertLessEqual((out.double() - ref).abs().max().item(), tol * 4)
    if return_attn:
        tc.assertEqual(attn.dtype, dtype)
        tc.assertLessEqual((attn.double() - w).abs().max().item(), tol)
    dout = rand(*out.shape, seed=8)
    out.backward(dout.to(dtype))
    ref.backward(dout)
    for a, b in ((q, q64), (k, k64), (v, v64)):
        tc.assertEqual(a.grad.dtype, dtype)
        err = (a.grad.double() - b.grad).abs().max().item()
        tc.assertLessEqual(err, tol * 8 * max(1.0, b.grad.abs().max().item()))


class Forward(unittest.TestCase):

    def check(self, q, k, v, tol=None, **kw):
        ref, w = ref_sdpa(q.double(), k.double(), v.double(), **{
            n: (x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
            for n, x in kw.items()})
        out = sdpa(q, k, v, **kw)
        self.assertEqual(out.shape, ref.shape)
        self.assertEqual(out.dtype, q.dtype)
        tol = tol if tol is not None else (1e-12 if q.dtype == torch.float64 else 1e-5)
        err = (out.double() - ref).abs().max().item()
        self.assertLessEqual(err, tol, "max |qkv - math| = %g for %s" % (err, kw))
        if TORCH_SDPA is not None and q.dtype in (torch.float32, torch.float64):
            try:
                theirs = TORCH_SDPA(q, k, v, **kw)
            except TypeError:   # scale (torch 2.1) or enable_gqa (2.5) unknown to this torch
                theirs = None
            except IndexError:  # a 1-D mask: it broadcasts, but torch 2.x's SDPA refuses it
                theirs = None
            if theirs is not None:
                self.assertLessEqual((out - theirs).abs().max().item(), tol)
        return out, w

    def test_sizes_and_dtypes(self):
        for dtype in (torch.float32, torch.float64):
            for B, H, L, S, E, Ev in ((1, 1, 1, 1, 1, 1), (2, 3, 7, 7, 8, 8), (1, 2, 65, 65, 16, 5),
                                      (3, 1, 7, 65, 1, 7), (2, 2, 65, 1, 7, 3)):
                with self.subTest(dtype=dtype, shape=(B, H, L, S, E, Ev)):
                    self.check(*qkv_of(B, H, L, S, E, Ev, dtype=dtype))

    def test_ranks(self):
        # [L, E], [N, L, E], [B, H, L, E] and two leading dimensions.
        self.check(rand(7, 5), rand(9, 5), rand(9, 3))
        self.check(rand(4, 7, 5), rand(4, 9, 5), rand(4, 9, 3))
        self.check(rand(2, 3, 4, 7, 5), rand(2, 3, 4, 9, 5), rand(2, 3, 4, 9, 3))

    def test_scale(self):
        self.check(*qkv_of(2, 2, 7, 9, 8), scale=0.3)
        self.check(*qkv_of(2, 2, 7, 9, 8), scale=-1.5)

    def test_causal_top_left(self):
        # torch's is_causal is tril(diagonal=0) on [L, S] whatever L and S.
        for L, S in ((7, 7), (5, 9), (9, 5), (65, 7), (1, 65), (65, 1)):
            for dtype in (torch.float32, torch.float64):
                with self.subTest(L=L, S=S, dtype=dtype):
                    self.check(*qkv_of(2, 3, L, S, 8, dtype=dtype), is_causal=True)

    def test_bool_masks(self):
        B, H, L, S = 2, 3, 7, 9
        q, k, v = qkv_of(B, H, L, S, 8)
        g = torch.Generator().manual_seed(5)
        full = torch.rand(B, H, L, S, generator=g) > 0.4
        full[..., 0] = True  # no row without keys (torch gives NaN there, qkv 0)
        padding = torch.ones(B, 1, 1, S, dtype=torch.bool)
        padding[0, ..., 6:] = False
        for m in (full, full[0, 0], full[:, :1], full[:1], full[0], padding,
                  torch.ones(S, dtype=torch.bool)):
            with self.subTest(mask=tuple(m.shape)):
                self.check(q, k, v, attn_mask=m)

    def test_float_masks(self):
        B, H, L, S = 2, 3, 7, 9
        for dtype in (torch.float32, torch.float64):
            q, k, v = qkv_of(B, H, L, S, 8, dtype=dtype)
            m = rand(B, H, L, S, dtype=dtype, seed=9)
            m[0, 1, 2, 3:5] = -math.inf   # -inf masks a key
            for mm in (m, m[:, :1], m[:1], m[0, 0], m[..., :1, :], m[0, 0, 0]):
                with self.subTest(dtype=dtype, mask=tuple(mm.shape)):
                    self.check(q, k, v, attn_mask=mm)

    def test_padding_masks(self):
        # A mask the same for every head and query, each batch entry's keys
        # visible up to a length: qkv's key lengths (no bias). Boolean,
        # -inf and the dtype's lowest value (Hugging Face's padding) alike.
        from qkv.torch import _Plan
        B, H, L, S = 3, 2, 7, 65
        lens = (65, 40, 1)
        for dtype in (torch.float32, torch.float64):
            q, k, v = qkv_of(B, H, L, S, 8, dtype=dtype)
            keep = torch.arange(S)[None, :] < torch.tensor(lens)[:, None]       # [B, S]
            low = torch.finfo(dtype).min
            masks = {"bool": keep[:, None, None, :],
                     "-inf": torch.zeros(B, 1, 1, S, dtype=dtype).masked_fill(~keep[:, None, None], -math.inf),
                     "lowest": torch.zeros(B, 1, 1, S, dtype=dtype).masked_fill(~keep[:, None, None], low),
                     "[B, 1, S]": keep[:, None, :].expand(B, 1, S)[:, None]}
            for name, m in masks.items():
                with self.subTest(dtype=dtype, mask=name):
                    p = _Plan(q, k, v, m, False, None, False, 0.0, 0, True)
                    self.assertIsNone(p.mask)
                    self.assertEqual(p.key_lengths.tolist(), [n for n in lens for _ in range(H)])
                    out, w = self.check(q, k, v, attn_mask=m)
                    _, attn = sdpa(q, k, v, attn_mask=m, return_attn=True)
                    self.assertLessEqual((attn - w).abs().max().item(), 1e-12 if dtype == torch.float64 else 1e-6)
                    self.assertEqual(attn[1, :, :, 40:].abs().max().item(), 0.0)
        # Not a padding mask, or not one qkv may treat so: a bias.
        q, k, v = qkv_of(2, 2, 3, 6, 4)
        low = torch.finfo(torch.float64).min
        f64 = {"dtype": torch.float64}
        others = {"a hole": torch.tensor([0, low, 0, 0, low, low], **f64),
                  "per query": torch.tensor([[0, 0, 0, low, low, low]] * 2 + [[0] * 6], **f64),
                  "per head": torch.zeros(1, 2, 1, 6, **f64).index_fill_(1, torch.tensor([1]), low),
                  "-1e4": torch.tensor([0, 0, 0, -1e4, -1e4, -1e4], **f64),
                  "all lowest": torch.zeros(2, 1, 1, 6, **f64).index_fill_(0, torch.tensor([1]), low)}
        for name, m in others.items():
            with self.subTest(mask=name):
                p = _Plan(q, k, v, m, False, None, False, 0.0, 0, False)
                self.assertIsNone(p.key_lengths)
                self.assertIsNotNone(p.mask)
                self.check(q, k, v, attn_mask=m)
        # A row whose keys are all at the lowest value is uniform, as in torch.
        out = sdpa(q, k, v, attn_mask=others["all lowest"])
        self.assertLessEqual((out[1] - v[1].mean(-2, keepdim=True)).abs().max().item(), 1e-12)
        # Every key visible: no mask at all; a float mask wanting a gradient stays a bias.
        self.assertIsNone(_Plan(q, k, v, torch.zeros(2, 1, 1, 6, **f64), False, None, False, 0.0, 0,
                                False).mask)
        m = masks["lowest"].detach().requires_grad_()
        p = _Plan(*qkv_of(B, H, L, S, 8), m, False, None, False, 0.0, 0, False)
        self.assertIsNone(p.key_lengths)

    def test_causal_and_mask(self):
        # qkv.torch's internal _sdpa (what qkv.hf calls) takes is_causal and
        # a mask together: a key is seen if both let it, in either layout,
        # with GQA (the causal mask then a bias in torch's layout) and L != S.
        from qkv.torch import _sdpa
        for inside in (False, True):
            for L, S in ((7, 7), (5, 9), (9, 5)):
                q, k, v = qkv_of(2, 4, L, S, 8, Hk=2)
                if inside:
                    q = heads_inside(q)
                m = torch.zeros(2, 1, 1, S, dtype=torch.float64)
                m[1, ..., S - 2:] = -math.inf
                both = (m == 0) & torch.ones(L, S, dtype=torch.bool).tril()
                ref, _ = ref_sdpa(q, k, v, attn_mask=both, enable_gqa=True)
                for mm in (m, m == 0):
                    with self.subTest(inside=inside, L=L, S=S, mask=mm.dtype):
                        out = _sdpa(q, k, v, mm, 0.0, True, None, True, False)
                        self.assertLessEqual((out - ref).abs().max().item(), 1e-12)

    def test_causal_window(self):
        # _sdpa's window (qkv.hf: a sliding window): query i sees keys
        # i - window .. i, with or without a padding mask, in either layout
        # (qkv's causal window, or a band bias in torch's layout with GQA):
        # output, weights, and gradients by gradcheck
        from qkv.torch import _sdpa
        n = 9
        for inside in (False, True):
            for Hk in (4, 2):
                for w in (0, 3, n + 2):
                    # (padded, window 0: the padded rows see no key, NaN in torch)
                    for padded in (False, True) if w else (False,):
                        q, k, v = qkv_of(2, 4, n, n, 8, Hk=Hk, grad=True)
                        if inside:
                            q = heads_inside(q)
                        m = torch.zeros(2, 1, 1, n, dtype=torch.float64)
                        m[1, ..., n - 2:] = -math.inf
                        band = torch.ones(n, n, dtype=torch.bool).tril().triu(-w)
                        keep = band & (m == 0) if padded else band
                        ref, rw = ref_sdpa(q, k, v, attn_mask=keep, enable_gqa=True)
                        mm = m if padded else None
                        with self.subTest(inside=inside, Hk=Hk, window=w, padded=padded):
                            out, got_w = _sdpa(q, k, v, mm, 0.0, True, None, True, True, window=w)
                            self.assertLessEqual((out - ref).abs().max().item(), 1e-12)
                            self.assertLessEqual((got_w - rw).abs().max().item(), 1e-12)
                            self.assertTrue(torch.autograd.gradcheck(
                                lambda a, b, c: _sdpa(a, b, c, mm, 0.0, True, None, True, False,
                                                      window=w), (q, k, v)))
        q, k, v = qkv_of(1, 2, 5, 7, 8)
        with self.assertRaisesRegex(ValueError, "causal window needs is_causal and L == S"):
            _sdpa(q, k, v, None, 0.0, True, None, False, False, window=2)
        q, k, v = qkv_of(1, 2, 5, 5, 8)
        for causal, w in ((False, 2), (True, -1)):
            with self.assertRaisesRegex(ValueError, "causal window needs"):
                _sdpa(q, k, v, None, 0.0, causal, None, False, False, window=w)

    def test_gqa(self):
        for H, Hk in ((6, 2), (6, 1), (4, 4)):
            for kw in ({}, {"is_causal": True}):
                for L, S in ((7, 7), (5, 9), (9, 5)):
                    with self.subTest(H=H, Hk=Hk, L=L, S=S, kw=kw):
                        self.check(*qkv_of(2, H, L, S, 8, Hk=Hk), enable_gqa=True, **kw)
        q, k, v = qkv_of(2, 6, 7, 9, 8, Hk=3)
        m = torch.rand(2, 6, 7, 9, generator=torch.Generator().manual_seed(3)) > 0.3
        m[..., 0] = True
        self.check(q, k, v, attn_mask=m, enable_gqa=True)
        self.check(q, k, v, attn_mask=m[:, :1], enable_gqa=True)

    def test_return_attn(self):
        q, k, v = qkv_of(2, 6, 7, 9, 8, Hk=2)
        m = rand(2, 1, 7, 9, seed=4)
        out, attn = sdpa(q, k, v, attn_mask=m, enable_gqa=True, return_attn=True)
        ref, w = ref_sdpa(q, k, v, attn_mask=m, enable_gqa=True)
        self.assertEqual(attn.shape, (2, 6, 7, 9))
        self.assertLessEqual((attn - w).abs().max().item(), 1e-12)
        self.assertLessEqual((out - ref).abs().max().item(), 1e-12)
        out, attn = sdpa(*qkv_of(1, 2, 5, 9, 4), is_causal=True, return_attn=True)
        self.assertTrue(torch.all(attn[..., 0, 1:] == 0))
        self.assertLessEqual((attn.sum(-1) - 1).abs().max().item(), 1e-12)

    def test_planned_once_per_shape(self):
        # Calls without a mask reuse a plan per shape and options: the same
        # shapes with other options, and the call with gradients (autograd)
        # against the one without (the forward alone), must not mix.
        q, k, v = qkv_of(2, 4, 7, 9, 8)
        for _ in range(2):
            for causal in (False, True):
                for scale in (None, 0.3):
                    ref, w = ref_sdpa(q, k, v, is_causal=causal, scale=scale)
                    out, attn = sdpa(q, k, v, is_causal=causal, scale=scale, return_attn=True)
                    self.assertLessEqual((out - ref).abs().max().item(), 1e-12)
                    self.assertLessEqual((attn - w).abs().max().item(), 1e-12)
                    self.assertLessEqual((sdpa(q, k, v, is_causal=causal, scale=scale) - ref)
                                         .abs().max().item(), 1e-12)
                    qg = q.detach().requires_grad_()
                    with_grad = sdpa(qg, k, v, is_causal=causal, scale=scale)
                    self.assertTrue(with_grad.requires_grad)
                    self.assertTrue(torch.equal(with_grad.detach(),
                                                sdpa(q, k, v, is_causal=causal, scale=scale)))
                    with torch.no_grad():
                        self.assertFalse(sdpa(qg, k, v, is_causal=causal, scale=scale).requires_grad)

    def test_non_contiguous(self):
        # Neither torch's layout nor qkv's [B, n, H, D] (HeadsInside): copied.
        q, k, v = (t[..., ::2] for t in (rand(2, 3, 7, 16), rand(2, 3, 9, 16), rand(2, 3, 9, 16)))
        self.assertFalse(q.is_contiguous())
        self.check(q, k, v, is_causal=True)

    def test_half(self):
        for dtype in (torch.bfloat16, torch.float16):
            check_half(self, dtype)


class Gradients(unittest.TestCase):

    def gradcheck(self, fn, *inputs):
        self.assertTrue(torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-8, rtol=1e-6))

    def test_plain_and_causal(self):
        for L, S in ((1, 1), (5, 5), (4, 7), (7, 4)):
            for causal in (False, True):
                with self.subTest(L=L, S=S, causal=causal):
                    self.gradcheck(lambda a, b, c: sdpa(a, b, c, is_causal=causal),
                                   *qkv_of(2, 2, L, S, 3, 2, grad=True))

    def test_gqa(self):
        for causal in (False, True):
            self.gradcheck(lambda a, b, c: sdpa(a, b, c, is_causal=causal, enable_gqa=True),
                           *qkv_of(2, 4, 5, 6, 3, 2, Hk=2, grad=True))

    def test_masks(self):
        q, k, v = qkv_of(2, 3, 4, 5, 3, grad=True)
        bm = torch.rand(2, 3, 4, 5, generator=torch.Generator().manual_seed(2)) > 0.3
        bm[..., 0] = True
        self.gradcheck(lambda a, b, c: sdpa(a, b, c, attn_mask=bm), q, k, v)
        self.gradcheck(lambda a, b, c: sdpa(a, b, c, attn_mask=bm[:, :1]), q, k, v)
        # Padding masks (qkv's key lengths), boolean and the lowest value.
        pad = torch.arange(5)[None, None, None, :] < torch.tensor([5, 2])[:, None, None, None]
        self.gradcheck(lambda a, b, c: sdpa(a, b, c, attn_mask=pad), q, k, v)
        low = torch.zeros(2, 1, 1, 5, dtype=torch.float64).masked_fill(~pad, torch.finfo(torch.float64).min)
        self.gradcheck(lambda a, b, c: sdpa(a, b, c, attn_mask=low), q, k, v)
        # Float masks: their gradient too, summed over what they broadcast.
        for shape in ((2, 3, 4, 5), (2, 1, 4, 5), (3, 4, 5), (4, 5), (2, 1, 1, 5), (5,)):
            m = rand(*shape, grad=True, seed=6)
            with self.subTest(mask=shape):
                self.gradcheck(lambda a, b, c, mm: sdpa(a, b, c, attn_mask=mm), q, k, v, m)
        q, k, v = qkv_of(2, 4, 4, 5, 3, Hk=2, grad=True)
        m = rand(2, 4, 4, 5, grad=True, seed=7)
        self.gradcheck(lambda a, b, c, mm: sdpa(a, b, c, attn_mask=mm, enable_gqa=True), q, k, v, m)

    def test_against_autograd_of_the_math(self):
        q, k, v = qkv_of(2, 6, 65, 7, 8, Hk=3, grad=True)
        m = rand(2, 1, 65, 7, grad=True, seed=11)
        out = sdpa(q, k, v, attn_mask=m, enable_gqa=True, scale=0.7)
        ref, _ = ref_sdpa(q, k, v, attn_mask=m, enable_gqa=True, scale=0.7)
        dout = rand(*out.shape, seed=12)
        got = torch.autograd.grad(out, (q, k, v, m), dout)
        want = torch.autograd.grad(ref, (q, k, v, m), dout)
        for a, b, name in zip(got, want, "qkvm"):
            self.assertLessEqual((a - b).abs().max().item(), 1e-12, name)

    def test_float32_backward(self):
        q, k, v = qkv_of(2, 3, 7, 65, 8, dtype=torch.float32, grad=True)
        out = sdpa(q, k, v, is_causal=True)
        dout = rand(*out.shape, seed=13)
        got = torch.autograd.grad(out, (q, k, v), dout.float())
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref, _ = ref_sdpa(q64, k64, v64, is_causal=True)
        want = torch.autograd.grad(ref, (q64, k64, v64), dout)
        for a, b in zip(got, want):
            self.assertLessEqual((a.double() - b).abs().max().item(), 1e-5)

    def test_attn_is_not_differentiable(self):
        q, k, v = qkv_of(1, 2, 3, 4, 3, grad=True)
        out, attn = sdpa(q, k, v, return_attn=True)
        self.assertFalse(attn.requires_grad)
        self.assertTrue(out.requires_grad)


class Dropout(unittest.TestCase):

    def test_reproducible_and_random(self):
        q, k, v = qkv_of(2, 2, 9, 11, 4)
        torch.manual_seed(1)
        a = sdpa(q, k, v, dropout_p=0.3)
        torch.manual_seed(1)
        b = sdpa(q, k, v, dropout_p=0.3)
        c = sdpa(q, k, v, dropout_p=0.3)
        self.assertTrue(torch.equal(a, b))
        self.assertFalse(torch.equal(a, c))
        self.assertFalse(torch.equal(a, sdpa(q, k, v)))

    def test_rate(self):
        # Uniform weights 1/S and V = I: out[i, j] = keep_ij / (S (1 - p)).
        S, p = 2048, 0.25
        q = torch.zeros(2, 2, 4, 8, dtype=torch.float64)
        k = rand(2, 2, S, 8)
        v = torch.eye(S, dtype=torch.float64).expand(2, 2, S, S).contiguous()
        # No mask: one qkv call; a (zero) mask per head: one call per pair.
        for m in (None, torch.zeros(1, 2, 1, S, dtype=torch.float64)):
            torch.manual_seed(3)
            out = sdpa(q, k, v, attn_mask=m, dropout_p=p)
            kept = out * S * (1 - p)
            self.assertTrue(torch.all((kept.abs() < 1e-9) | ((kept - 1).abs() < 1e-9)))
            rate = 1 - kept.mean().item()
            self.assertLess(abs(rate - p), 0.02,
                            "dropped %.4f of the weights, expected %.2f" % (rate, p))
            # Every (batch, head) pair draws its own mask.
            flat = kept.reshape(4, 4, S)
            for i in range(1, 4):
                self.assertFalse(torch.equal(flat[0], flat[i]), "pairs 0 and %d" % i)

    def test_gradients(self):
        q, k, v = qkv_of(2, 4, 5, 6, 3, Hk=2, grad=True)
        m = rand(2, 4, 5, 6, grad=True, seed=14)

        def fn(a, b, c, mm):
            torch.manual_seed(7)   # the same dropout mask on every evaluation
            return sdpa(a, b, c, attn_mask=mm, dropout_p=0.4, enable_gqa=True)
        self.assertTrue(torch.autograd.gradcheck(fn, (q, k, v, m), eps=1e-6, atol=1e-8, rtol=1e-6))


def heads_inside(t):
    """t [..., H, n, E] as a view of [..., n, H, E] memory, as the models make
    their heads (a leaf when t is one)."""
    return t.detach().transpose(-3, -2).contiguous().transpose(-3, -2).requires_grad_(t.requires_grad)


class HeadsInside(unittest.TestCase):
    """Query, key and value viewing [B, n, H, E] memory: qkv's own layout,
    read in place; the output and the gradients come in that layout too."""

    def test_forward(self):
        from qkv.torch import _Plan
        low = torch.finfo(torch.float64).min
        for B, H, Hk, L, S, E, Ev in ((2, 3, 3, 7, 9, 8, 8), (1, 2, 2, 65, 65, 16, 5),
                                      (2, 4, 2, 7, 5, 8, 8), (3, 6, 1, 9, 9, 4, 4)):
            q, k, v = (heads_inside(t) for t in qkv_of(B, H, L, S, E, Ev, Hk=Hk))
            g = torch.Generator().manual_seed(B * H + L)
            full = torch.rand(B, H, L, S, generator=g) > 0.4
            full[..., 0] = True
            pad = torch.arange(S)[None, None, None, :] < torch.tensor([S - 2 * b for b in range(B)])[:, None, None, None]
            masks = {"none": None, "bool": full, "float per batch": rand(B, 1, L, S, seed=3),
                     "float per head": rand(1, H, L, S, seed=4), "float shared": rand(L, S, seed=5),
                     "padding": pad, "padding lowest": torch.zeros(B, 1, 1, S, dtype=torch.float64).masked_fill(~pad, low)}
            for name, m in masks.items():
                for causal in ((False, True) if m is None else (False,)):
                    kw = {"attn_mask": m, "is_causal": causal, "enable_gqa": Hk != H, "scale": 0.4}
                    with self.subTest(shape=(B, H, Hk, L, S, E, Ev), mask=name, causal=causal):
                        self.assertTrue(_Plan(q, k, v, m, causal, 0.4, Hk != H, 0.0, 0, False).native)
                        ref, w = ref_sdpa(q, k, v, **kw)
                        out, attn = sdpa(q, k, v, return_attn=True, **kw)
                        self.assertEqual(out.shape, ref.shape)
                        self.assertTrue(out.transpose(1, 2).is_contiguous())
                        self.assertLessEqual((out - ref).abs().max().item(), 1e-12)
                        self.assertLessEqual((attn - w).abs().max().item(), 1e-12)
                        self.assertLessEqual((sdpa(q, k, v, **kw) - ref).abs().max().item(), 1e-12)
        # Only the query decides: key and value in torch's layout are brought to it.
        q, k, v = qkv_of(2, 3, 7, 9, 8)
        ref, _ = ref_sdpa(q, k, v)
        self.assertLessEqual((sdpa(heads_inside(q), k, heads_inside(v)) - ref).abs().max().item(), 1e-12)
        self.assertLessEqual((sdpa(q, heads_inside(k), v) - ref).abs().max().item(), 1e-12)

    def test_float32_and_half(self):
        q, k, v = (heads_inside(t) for t in qkv_of(2, 4, 65, 65, 16, dtype=torch.float32))
        ref, _ = ref_sdpa(q.double(), k.double(), v.double(), is_causal=True)
        self.assertLessEqual((sdpa(q, k, v, is_causal=True).double() - ref).abs().max().item(), 1e-5)
        for dtype in (torch.bfloat16, torch.float16):
            check_half(self, dtype, inside=True, return_attn=True)

    def test_gradients(self):
        def check(fn, *inputs):
            self.assertTrue(torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-8, rtol=1e-6))
        q, k, v = (heads_inside(t) for t in qkv_of(2, 4, 5, 6, 3, 2, Hk=2, grad=True))
        for causal in (False, True):
            check(lambda a, b, c: sdpa(a, b, c, is_causal=causal, enable_gqa=True), q, k, v)
        pad = torch.arange(6)[None, None, None, :] < torch.tensor([6, 3])[:, None, None, None]
        check(lambda a, b, c: sdpa(a, b, c, attn_mask=pad, enable_gqa=True), q, k, v)
        for shape in ((2, 1, 5, 6), (1, 4, 5, 6), (2, 4, 1, 6), (5, 6)):
            m = rand(*shape, grad=True, seed=8)
            with self.subTest(mask=shape):
                check(lambda a, b, c, mm: sdpa(a, b, c, attn_mask=mm, enable_gqa=True), q, k, v, m)

        def dropped(a, b, c):
            torch.manual_seed(7)
            return sdpa(a, b, c, dropout_p=0.4, enable_gqa=True)
        check(dropped, q, k, v)
        # The gradients come back in the inputs' layout.
        out = sdpa(q, k, v, enable_gqa=True)
        dq, dk = torch.autograd.grad(out.sum(), (q, k))
        self.assertTrue(dq.transpose(1, 2).is_contiguous() and dk.transpose(1, 2).is_contiguous())


class Errors(unittest.TestCase):

    def test_types(self):
        q, k, v = qkv_of(1, 2, 3, 4, 5)
        with self.assertRaisesRegex(TypeError, "torch.Tensor"):
            sdpa(q.numpy(), k, v)
        with self.assertRaisesRegex(TypeError, "CPU"):
            sdpa(torch.empty(1, 2, 3, 5, device="meta"), k, v)
        with self.assertRaisesRegex(TypeError, "dtype"):
            sdpa(q.long(), k.long(), v.long())
        with self.assertRaisesRegex(TypeError, "share a dtype"):
            sdpa(q, k.float(), v)
        with self.assertRaisesRegex(TypeError, "attn_mask must be bool or floating"):
            sdpa(q, k, v, attn_mask=torch.ones(3, 4, dtype=torch.int32))
        with self.assertRaisesRegex(TypeError, "CPU"):
            sdpa(q, k, v, attn_mask=torch.ones(3, 4, device="meta"))
        with self.assertRaisesRegex(TypeError, "dense"):
            sdpa(q, k, v, attn_mask=torch.ones(3, 4).to_sparse())

    def test_shapes(self):
        q, k, v = qkv_of(2, 2, 3, 4, 5)
        for args in ((q, k[..., :4], v), (q, k, v[..., :3, :]), (q, k[:1], v[:1]),
                     (q[0], k, v), (q[0, 0, 0], k[0, 0, 0], v[0, 0, 0]), (q, k[:, :1], v)):
            with self.subTest(shapes=[tuple(a.shape) for a in args]):
                with self.assertRaises(ValueError):
                    sdpa(*args)
        with self.assertRaisesRegex(ValueError, "enable_gqa"):
            sdpa(*qkv_of(1, 4, 3, 4, 5, Hk=2))
        with self.assertRaisesRegex(ValueError, "multiple"):
            sdpa(*qkv_of(1, 4, 3, 4, 5, Hk=3), enable_gqa=True)
        with self.assertRaisesRegex(ValueError, "empty"):
            sdpa(q[:, :, :0], k, v)
        for shape in ((3, 5), (2, 3, 2, 4), (4, 3), (3, 3, 4)):
            with self.subTest(mask=shape):
                with self.assertRaisesRegex(ValueError, "does not broadcast"):
                    sdpa(q, k, v, attn_mask=torch.ones(shape, dtype=torch.bool))

    def test_values(self):
        q, k, v = qkv_of(1, 2, 3, 4, 5)
        with self.assertRaisesRegex(ValueError, "dropout_p"):
            sdpa(q, k, v, dropout_p=1.0)
        with self.assertRaisesRegex(ValueError, "dropout_p"):
            sdpa(q, k, v, dropout_p=-0.1)
        with self.assertRaisesRegex(TypeError, "dropout_p"):
            sdpa(q, k, v, dropout_p="0.5x")
        self.assertTrue(torch.equal(sdpa(q, k, v, dropout_p=torch.tensor(0.0)), sdpa(q, k, v)))
        with self.assertRaisesRegex(ValueError, "scale"):
            sdpa(q, k, v, scale=0.0)
        with self.assertRaisesRegex(ValueError, "scale"):
            sdpa(q, k, v, scale=math.nan)
        with self.assertRaisesRegex(ValueError, "not both"):
            sdpa(q, k, v, attn_mask=torch.ones(3, 4, dtype=torch.bool), is_causal=True)

    def test_rows_without_keys(self):
        # qkv gives such a row 0 (torch's math gives NaN): documented.
        q, k, v = qkv_of(1, 1, 2, 3, 4, grad=True)
        m = torch.tensor([[True, False, True], [False, False, False]])
        out = sdpa(q, k, v, attn_mask=m)
        self.assertTrue(torch.all(out[0, 0, 1] == 0))
        ref, _ = ref_sdpa(q[..., :1, :], k, v, attn_mask=m[:1])   # the row with keys
        self.assertLessEqual((out[0, 0, 0] - ref[0, 0, 0]).abs().max().item(), 1e-12)
        # ... and no gradient: the other row's alone.
        got = torch.autograd.grad(out.sum(), (q, k, v))
        want = torch.autograd.grad(ref.sum(), (q, k, v))
        for a, b in zip(got, want):
            self.assertLessEqual((a - b).abs().max().item(), 1e-12)


if __name__ == "__main__":
    print("qkv %s (%s), torch %s" % (qkv.version(), qkv.library_path, torch.__version__))
    unittest.main()
