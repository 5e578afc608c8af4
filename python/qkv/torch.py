"""qkv's attention as a PyTorch function (CPU tensors, autograd included).

    import torch, qkv.torch
    q = torch.randn(2, 8, 128, 64, requires_grad=True)        # [B, H, L, E]
    out = qkv.torch.scaled_dot_product_attention(q, q, q, is_causal=True)
    out.sum().backward()                                       # qkv's backward

scaled_dot_product_attention takes torch.nn.functional's arguments and
semantics: query [..., H, L, E], key [..., H_kv, S, E], value
[..., H_kv, S, E_v] (2 or more dimensions; the leading ones must be equal),
output [..., H, L, E_v]; attn_mask boolean (True: the key takes part) or
float (added to the scores), broadcastable to [..., H, L, S]; is_causal
aligned top-left as torch's (query i sees keys j <= i, also when L != S);
scale (default 1/sqrt(E)); enable_gqa (H a multiple of H_kv, query head h
reads key/value head h // (H / H_kv)); dropout_p on the attention weights,
with qkv's counter-based mask seeded from torch's default generator (so
torch.manual_seed makes it reproducible; the backward regenerates it).
return_attn=True also returns the attention weights [..., H, L, S]
(before dropout; not differentiable).

float32, float64, bfloat16 and float16 (the half types are stored as such,
computed in float32; attn is returned in the query's dtype).
Gradients flow to query, key, value and a float attn_mask; once (no double
backward).

qkv's C layout is [B, n, H, D] and its descriptor has no strides. Two
torch layouts are read in place: a contiguous [B, H, n, D] (each (batch,
head) pair one of qkv's batches) and a view of contiguous [B, n, H, D]
memory (x.view(B, n, H, D).transpose(1, 2), as the models make their
heads), qkv's own: the output and the gradients then come in that layout
too. Other strides are copied once, into qkv's layout when the query is
not contiguous (the slices of a fused QKV projection), else into torch's. A padding mask (the same for every
head and query: each batch entry's keys visible up to a length, then False,
-inf or the mask dtype's lowest value, as Hugging Face's models pad) is
passed as qkv's key lengths: no bias is read and the padded keys' tiles are
skipped. Differences from torch: a query
row whose keys are all masked gives 0 (torch: NaN); no broadcasting
between the leading dimensions of query, key and value; scale=0 and empty
dimensions are refused (ValueError). Errors in the arguments raise
TypeError (tensor type, dtype, device) or ValueError (shapes, values)."""
import ctypes
import math

import torch

from . import (_AttnDesc, _AttnGrads, _backward, _desc_init, _forward, _MASKS, _ok)

__all__ = ["scaled_dot_product_attention"]

_QKV_DTYPES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 4, torch.float16: 5}
_BIAS_SHARED, _BIAS_PER_HEAD = 1, 2


def _check_tensor(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError("qkv.torch: %s must be a torch.Tensor, not %s" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise TypeError("qkv.torch: %s is on %s: qkv runs on CPU tensors (move it with .cpu())"
                        % (name, t.device))
    if t.layout != torch.strided:
        raise TypeError("qkv.torch: %s must be a dense (strided) tensor, not %s" % (name, t.layout))


def _heads_inside(t):
    """Whether a query t [..., H, n, E] goes through qkv's own layout,
    [..., n, H, E] memory: when it is not contiguous. A view of contiguous
    such memory (x.view(B, n, H, E).transpose(1, 2), as the models make their
    heads) is then read in place; other strides (the slices of a fused QKV
    projection, as GPT-2's) are copied into it, row by row, and the output in
    that layout is what the model's transpose(1, 2).reshape(B, n, H * E)
    wants without a copy."""
    return t.dim() >= 3 and not t.is_contiguous()


def _padding_lengths(x, dtype, S):
    """The visible keys of each row of a padding mask x [Bm, Sm] (Sm in {1,
    S}, values in the bias dtype, dtype the user's mask's) as int64 [Bm], or
    None when x is not one: each row 0 up to a length, masked after it.
    Masked means -inf (a boolean mask's False) or dtype's lowest value, as
    Hugging Face's models write it; the latter only while every row keeps a
    visible key, where its weight is exactly 0 in torch too (a row with all
    keys at the lowest value is uniform in torch, so it stays a bias)."""
    low = float(torch.finfo(dtype).min) if dtype.is_floating_point else -math.inf
    zero, neg = x == 0, (x == -math.inf) | (x <= low)
    lens = zero.sum(1)
    pos = torch.arange(x.shape[1])
    if not bool(((pos < lens[:, None]) == zero).all()) or not bool((zero | neg).all()):
        return None
    if x.shape[1] == 1:
        lens = lens * S
    if not bool((x == -math.inf).all(1)[lens == 0].all()):
        return None
    return lens.to(torch.int64)


def _only(attn_mask, keep):
    """attn_mask (None, boolean or additive) with the keys outside keep
    [L, S] masked too."""
    if attn_mask is None:
        return keep
    if attn_mask.dtype == torch.bool:
        return attn_mask & keep
    return attn_mask.masked_fill(~keep, -math.inf)


class _Plan:
    """How one call maps onto qkv. Query [*lead, H, L, E] (B the product of
    lead) contiguous as torch lays it out is seen as U = B * H_kv of qkv's
    batches, each of g * L queries (g = H / H_kv, the query heads sharing a
    key head, stacked), one head: a bias that is the same for every unit goes
    in one call; one varying over the batch, one call per batch entry; one
    varying over the heads, one call per unit. A query that is not
    contiguous (`native`, _heads_inside) goes through qkv's own layout,
    [*lead, L, H, E]: B batches of H heads (key and value are brought to it
    too), one call, or one per batch entry when the bias varies over the
    batch; output, gradients and their incoming gradient in that layout as
    well."""

    def __init__(self, q, k, v, attn_mask, is_causal, scale, enable_gqa, dropout_p, seed,
                 return_attn, window=None):
        for t, name in ((q, "query"), (k, "key"), (v, "value")):
            _check_tensor(t, name)
        if q.dtype not in _QKV_DTYPES:
            raise TypeError("qkv.torch: query has dtype %s: float32, float64, bfloat16 or "
                            "float16 expected" % q.dtype)
        if k.dtype != q.dtype or v.dtype != q.dtype:
            raise TypeError("qkv.torch: query, key and value must share a dtype, not %s, %s, %s"
                            % (q.dtype, k.dtype, v.dtype))
        if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
            raise ValueError("qkv.torch: query, key and value must have the same number (>= 2) "
                             "of dimensions [..., n, E], not shapes %s, %s, %s"
                             % (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        qs, ks, vs = tuple(q.shape), tuple(k.shape), tuple(v.shape)
        if q.dim() == 2:
            lead, H, Hk = (), 1, 1
        else:
            lead, H, Hk = qs[:-3], qs[-3], ks[-3]
        L, E, S, Ev = qs[-2], qs[-1], ks[-2], vs[-1]
        shape_msg = ("qkv.torch: shapes do not fit: query %s, key %s, value %s (expected "
                     "[..., H, L, E], [..., H_kv, S, E], [..., H_kv, S, E_v])" % (qs, ks, vs))
        if ks[:-3] != lead or vs[:-3] != lead or ks[-1] != E or vs[-2] != S or \
                (q.dim() > 2 and vs[-3] != Hk):
            raise ValueError(shape_msg)
        if Hk != H:
            if not enable_gqa:
                raise ValueError("qkv.torch: query has %d heads, key and value %d: pass "
                                 "enable_gqa=True for grouped-query attention" % (H, Hk))
            if H % Hk:
                raise ValueError("qkv.torch: enable_gqa: the query's %d heads are not a multiple "
                                 "of the key's %d" % (H, Hk))
        if min(qs + ks + vs) == 0:
            raise ValueError("qkv.torch: empty dimensions are not supported: query %s, key %s, "
                             "value %s" % (qs, ks, vs))
        if scale is not None:
            scale = float(scale)
            if scale == 0 or not math.isfinite(scale):
                raise ValueError("qkv.torch: scale must be finite and non-zero, not %r" % scale)
        if not 0.0 <= dropout_p < 1.0:
            raise ValueError("qkv.torch: dropout_p must be in [0, 1), not %r" % dropout_p)
        self.dtype = q.dtype
        self.lead, self.H, self.Hk, self.L, self.S, self.E, self.Ev = lead, H, Hk, L, S, E, Ev
        self.B = math.prod(lead) if lead else 1
        self.g = H // Hk
        self.native = _heads_inside(q)
        self.U = self.B if self.native else self.B * Hk
        self.scale, self.dropout_p, self.seed = scale, dropout_p, seed
        self.return_attn = bool(return_attn)
        self.native_mask = _MASKS["none"]
        self.window = (0, 0)
        self.bias_dtype = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
        self.mask = None          # [Bm, Hm, Lm, Sm] float bias (Bm in {1, B}, Hm in {1, H})
        self.mask_shape = None    # the user's float mask's shape (its gradient's)
        if window is not None and not (is_causal and L == S and int(window) >= 0):
            raise ValueError("qkv.torch: a causal window needs is_causal and L == S")
        if window is not None and (self.g == 1 or self.native):
            # query i sees keys i - window .. i: qkv's causal window
            self.native_mask = _MASKS["causal_window"]
            self.window = (int(window), 0)
        elif window is not None:
            attn_mask = _only(attn_mask, torch.ones(L, S, dtype=torch.bool).tril().triu(-int(window)))
        elif is_causal:
            if (self.g == 1 or self.native) and L == S:
                self.native_mask = _MASKS["causal"]
            elif (self.g == 1 or self.native) and L > S:
                # qkv aligns bottom-right (query i at key position i + S - L):
                # a window reaching L - S past it ends at key i, torch's top-left.
                self.native_mask = _MASKS["window"]
                self.window = (L + S, L - S)
            else:
                attn_mask = _only(attn_mask, torch.ones(L, S, dtype=torch.bool).tril())
        self.key_lengths = None   # [U] int64 when the mask is a padding mask
        if attn_mask is not None:
            self._set_mask(attn_mask)
            if not (attn_mask.requires_grad and torch.is_grad_enabled()):
                self._padding_to_lengths(attn_mask.dtype)
        # Calls: (first unit, units) ranges covering 0 .. U.
        if self.mask is None or (self.mask.shape[0] == 1 and (self.native or self.mask.shape[1] == 1)):
            chunk = self.U
        elif self.native:
            chunk = 1
        elif self.mask.shape[1] == 1:
            chunk = Hk
        else:
            chunk = 1
        self.calls = [(u0, chunk) for u0 in range(0, self.U, chunk)]
        self._descs = {}
        # Bytes per unit of each tensor: a call's pointers are the tensors'
        # addresses plus u0 times these.
        es, bs = q.element_size(), torch.empty((), dtype=self.bias_dtype).element_size()
        gl, sk = (H * L, Hk * S) if self.native else (self.g * L, S)
        self.ub_q, self.ub_k, self.ub_v, self.ub_o = gl * E * es, sk * E * es, sk * Ev * es, gl * Ev * es
        self.ub_attn, self.ub_lse, self.lse_rows = gl * S * bs, gl * bs, gl
        # Output shapes, unpacked into torch.empty (a tuple argument costs
        # half a microsecond more to parse).
        self.out_shape = {True: (L, Ev), False: lead + (H, L, Ev)}
        # Natively [*lead, L, H, E_v] memory seen as [*lead, H, L, E_v].
        self.out_stride = _strides(lead, H, L, Ev, self.native)
        self.attn_shape = {True: (L, S), False: lead + (H, L, S)}

    def _set_mask(self, m):
        _check_tensor(m, "attn_mask")
        full = self.lead + (self.H, self.L, self.S)
        try:
            ok = torch.broadcast_shapes(tuple(m.shape), full) == full
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError("qkv.torch: attn_mask of shape %s does not broadcast to %s"
                             % (tuple(m.shape), full))
        if m.dtype == torch.bool:
            bias = torch.zeros(m.shape, dtype=self.bias_dtype).masked_fill_(~m, -math.inf)
        elif m.dtype.is_floating_point:
            bias = m.detach().to(self.bias_dtype)
            self.mask_shape, self.mask_dtype = tuple(m.shape), m.dtype
        else:
            raise TypeError("qkv.torch: attn_mask must be bool or floating point, not %s" % m.dtype)
        shape = (1,) * (len(full) - bias.dim()) + tuple(bias.shape)
        bias = bias.reshape(shape)
        mlead, Hm = shape[:-3], shape[-3]
        if all(d == 1 for d in mlead):
            bias = bias.reshape(1, Hm, shape[-2], shape[-1])
        else:
            bias = bias.expand(*(self.lead + shape[-3:])).reshape(self.B, Hm, shape[-2], shape[-1])
        self.mask = bias

    def _padding_to_lengths(self, dtype):
        """A padding mask (_padding_lengths) becomes qkv's key_lengths: no
        bias is read and the masked keys' tiles are skipped."""
        m = self.mask
        if m.shape[1] != 1 or m.shape[2] != 1:
            return
        lens = _padding_lengths(m[:, 0, 0, :], dtype, self.S)
        if lens is None:
            return
        self.mask = self.mask_shape = None
        if bool((lens == self.S).all()):
            return
        lens = lens.expand(self.B)
        if not self.native:
            lens = lens.repeat_interleave(self.Hk)
        self.key_lengths = lens.contiguous()

    def call_bias(self, u0):
        """The qkv bias of the call starting at unit u0 (contiguous): [g * L,
        S], or natively [L, S] (shared by the heads) or [H, L, S]."""
        if self.mask is None:
            return None
        if self.native:
            m = self.mask[u0 if self.mask.shape[0] > 1 else 0]
            if m.shape[0] == 1:
                return m[0].expand(self.L, self.S).contiguous()
            return m.expand(self.H, self.L, self.S).contiguous()
        b, j = divmod(u0, self.Hk)
        m = self.mask[b if self.mask.shape[0] > 1 else 0]
        g = self.g
        m = m[j * g:(j + 1) * g] if m.shape[0] > 1 else m
        return m.expand(g, self.L, self.S).reshape(g * self.L, self.S).contiguous()

    def desc(self, ci, units, bias):
        if bias is None and self.dropout_p == 0:
            # The same descriptor serves every call of a cached plan (the
            # library only reads it).
            d = self._descs.get(ci)
            if d is None:
                d = self._descs[ci] = self._make_desc(ci, units, None)
            return d
        return self._make_desc(ci, units, bias)

    def _make_desc(self, ci, units, bias):
        d = _AttnDesc()
        _desc_init(ctypes.byref(d))
        d.dtype = _QKV_DTYPES[self.dtype]
        if self.native:
            d.batch, d.n_q, d.n_k, d.heads, d.heads_kv = units, self.L, self.S, self.H, self.Hk
        else:
            d.batch, d.n_q, d.n_k, d.heads, d.heads_kv = units, self.g * self.L, self.S, 1, 1
        d.dim, d.dim_v = self.E, self.Ev
        if self.scale is not None:
            d.scale = self.scale
        d.mask = self.native_mask
        d.window_left, d.window_right = self.window
        if bias is not None:
            d.bias_kind = _BIAS_PER_HEAD if bias.dim() == 3 else _BIAS_SHARED
            d.bias = bias.data_ptr()
        if self.key_lengths is not None:
            d.key_lengths = self.key_lengths.data_ptr()   # one call: the mask is gone
        if self.dropout_p > 0:
            d.dropout = self.dropout_p
            # qkv's dropout hashes (seed, batch, head, row, key) with the
            # batch counted within a call: each call gets its own seed.
            d.dropout_seed = (self.seed + ci * 0x9E3779B97F4A7C15) % (1 << 64)
        return d


def _strides(lead, H, n, E, heads_inside):
    """Strides of a [*lead, H, n, E] tensor laid out as [*lead, n, H, E]
    (heads_inside) or contiguously."""
    st = (E, H * E, 1) if heads_inside else (n * E, E, 1)
    size = H * n * E
    for d in reversed(lead):
        st = (size,) + st
        size *= d
    return st


def _lay(p, t):
    """t in the memory layout plan p reads: contiguous [*lead, n, H, E] when
    native (a no-op for a view of such memory), else contiguous."""
    return t.transpose(-3, -2).contiguous() if p.native else t.contiguous()


def _run_forward(p, q, k, v, rank2, want_lse):
    """qkv's forward of plan p on q, k, v laid out by _lay: (out, attn or
    None in the bias dtype, lse or None)."""
    if p.native:
        out = torch.empty_strided(p.out_shape[rank2], p.out_stride, dtype=p.dtype)
    else:
        out = torch.empty(*p.out_shape[rank2], dtype=p.dtype)
    lse = torch.empty(p.U, p.lse_rows, dtype=p.bias_dtype) if want_lse else None
    attn = torch.empty(*p.attn_shape[rank2], dtype=p.bias_dtype) if p.return_attn else None
    qp, kp, vp, op = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
    ap = None if attn is None else attn.data_ptr()
    lp = None if lse is None else lse.data_ptr()
    for ci, (u0, units) in enumerate(p.calls):
        bias = p.call_bias(u0)   # kept alive: d holds its address
        d = p.desc(ci, units, bias)
        status = _forward(ctypes.byref(d), qp + u0 * p.ub_q, kp + u0 * p.ub_k, vp + u0 * p.ub_v,
                          op + u0 * p.ub_o, None if ap is None else ap + u0 * p.ub_attn,
                          None if lp is None else lp + u0 * p.ub_lse)
        if status:
            _ok(status, "qkv_attention_forward")
    return out, attn, lse


class _Attention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, mask, plan, rank2):
        p = plan
        q, k, v = _lay(p, q), _lay(p, k), _lay(p, v)
        out, attn, lse = _run_forward(p, q, k, v, rank2, True)
        ctx.plan = p
        ctx.save_for_backward(q, k, v, out, lse)
        if attn is None:
            return out
        if attn.dtype != p.dtype:
            attn = attn.to(p.dtype)
        ctx.mark_non_differentiable(attn)
        return out, attn

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, *unused):
        p = ctx.plan
        q, k, v, out, lse = ctx.saved_tensors
        dout = _lay(p, dout.to(p.dtype))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        want_dmask = p.mask_shape is not None and ctx.needs_input_grad[3]
        dmask = torch.zeros(p.mask.shape, dtype=p.bias_dtype) if want_dmask else None
        qp, kp, vp, op, lp, gp = (t.data_ptr() for t in (q, k, v, out, lse, dout))
        dqp, dkp, dvp = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        for ci, (u0, units) in enumerate(p.calls):
            bias = p.call_bias(u0)
            d = p.desc(ci, units, bias)
            dbias = torch.empty_like(bias) if want_dmask else None
            g = _AttnGrads(dq=dqp + u0 * p.ub_q, dk=dkp + u0 * p.ub_k, dv=dvp + u0 * p.ub_v,
                           dbias=None if dbias is None else dbias.data_ptr())
            _ok(_backward(ctypes.byref(d), qp + u0 * p.ub_q, kp + u0 * p.ub_k, vp + u0 * p.ub_v,
                          op + u0 * p.ub_o, lp + u0 * p.ub_lse, gp + u0 * p.ub_o, ctypes.byref(g)),
                "qkv_attention_backward")
            if want_dmask:
                _add_dbias(p, dmask, u0, dbias.view(-1, p.L, p.S))
        if want_dmask:
            dmask = _mask_grad(p, dmask).to(p.mask_dtype)
        if p.native:
            dq, dk, dv = dq.transpose(-3, -2), dk.transpose(-3, -2), dv.transpose(-3, -2)
        return dq, dk, dv, dmask, None, None


def _add_dbias(p, dmask, u0, db):
    """Adds a call's bias gradient db [g, L, S] (natively [1 or H, L, S])
    into dmask [Bm, Hm, Lm, Sm]."""
    if p.native:
        target = dmask[u0 if dmask.shape[0] > 1 else 0]
        target += db.sum_to_size(target.shape)
        return
    b, j = divmod(u0, p.Hk)
    target = dmask[b if dmask.shape[0] > 1 else 0]
    if target.shape[0] > 1:
        target = target[j * p.g:(j + 1) * p.g]
    else:
        db = db.sum(0, keepdim=True)
    target += db.sum_to_size(target.shape)


def _mask_grad(p, dmask):
    """dmask [Bm, Hm, Lm, Sm] as the gradient of the user's mask (its shape)."""
    shape = p.mask_shape
    full_rank = len(p.lead) + 3
    padded = (1,) * (full_rank - len(shape)) + shape
    if dmask.shape[0] > 1:
        dmask = dmask.reshape(p.lead + tuple(dmask.shape[1:]))
    else:
        dmask = dmask.reshape((1,) * len(p.lead) + tuple(dmask.shape[1:]))
    return dmask.sum_to_size(padded).reshape(shape)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False,
                                 return_attn=False):
    """torch.nn.functional.scaled_dot_product_attention computed by qkv:
    softmax(query key^T * scale + mask) value, on CPU tensors, with qkv's
    backward under autograd. return_attn=True returns (out, attn). See the
    module's documentation for shapes, masks and the differences."""
    if is_causal and attn_mask is not None:
        raise ValueError("qkv.torch: pass attn_mask or is_causal, not both")
    return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_attn)


def _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_attn,
          window=None):
    """scaled_dot_product_attention, where a mask and is_causal may come
    together (qkv.hf: GPT-2's causal mask with its padding): the key is seen
    if both let it. window (with is_causal, L == S): query i sees only keys
    i - window .. i (qkv.hf: the sliding window of Mistral's kin)."""
    try:
        dropout_p = float(dropout_p)
    except (TypeError, ValueError):
        raise TypeError("qkv.torch: dropout_p must be a number, not %r" % (dropout_p,)) from None
    seed = int(torch.randint(0, 2 ** 62, (), dtype=torch.int64)) if dropout_p > 0 else 0
    plan = None
    if attn_mask is None and dropout_p == 0:
        # A call without a mask or dropout is planned once per shape: the
        # plan (and its descriptors) depends only on what the key holds.
        ckey = _plan_key(query, key, value, is_causal, scale, enable_gqa, return_attn, window)
        plan = _plans.get(ckey)
        if plan is None:
            plan = _Plan(query, key, value, None, is_causal, scale, enable_gqa, 0.0, 0, return_attn,
                         window)
            if len(_plans) >= 64:
                _plans.clear()
            _plans[ckey] = plan
    if plan is None:
        plan = _Plan(query, key, value, attn_mask, is_causal, scale, enable_gqa, dropout_p, seed,
                     return_attn, window)
    rank2 = query.dim() == 2
    mask_in = attn_mask if plan.mask_shape is not None else None
    if not torch.is_grad_enabled() or not (query.requires_grad or key.requires_grad or
                                           value.requires_grad or
                                           (mask_in is not None and mask_in.requires_grad)):
        # No gradient wanted: the forward alone, without autograd's record
        # or the log-sum-exp.
        out, attn, _ = _run_forward(plan, _lay(plan, query), _lay(plan, key), _lay(plan, value),
                                    rank2, False)
        if attn is None:
            return out
        return out, (attn if attn.dtype == plan.dtype else attn.to(plan.dtype))
    return _Attention.apply(query, key, value, mask_in, plan, rank2)


_plans = {}


def _plan_key(q, k, v, is_causal, scale, enable_gqa, return_attn, window):
    """What a plan without a mask depends on; None when an argument is not a
    CPU tensor (then _Plan reports it)."""
    for t in (q, k, v):
        if not isinstance(t, torch.Tensor) or not t.is_cpu or t.layout != torch.strided:
            return None
    return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, bool(is_causal), scale,
            bool(enable_gqa), bool(return_attn), _heads_inside(q), window)
