"""qkv for Python: self-attention and the multi-head layer of the qkv C library,
through ctypes over its shared library (libqkv.so), with NumPy arrays in and out.

    import numpy as np, qkv
    q = np.random.randn(2, 5, 4, 8).astype(np.float32)     # [B, n, H, D]
    out = qkv.attention_forward(q, q, q, causal=True)       # [B, n, H, D]
    dq, dk, dv = qkv.attention_backward(q, q, q, np.ones_like(out), causal=True)

    layer = qkv.MultiheadAttention(embed_dim=16, heads=4, seed=1)
    y = layer.forward(x)                 # x [B, n, 16] -> y [B, n, 16]
    dx = layer.backward(dy)              # parameter gradients in layer.grads

Tensors follow the C API's layout (include/qkv.h): Q [B, n_q, H, D],
K [B, n_k, H_kv, D], V [B, n_k, H_kv, D_v], O [B, n_q, H, D_v]; [n, H, D] and
[n, D] (one head) are accepted too, and outputs have the rank of q. float32
and float64 are supported (all tensors of one call share q's dtype; others
are converted). Errors raise qkv.Error with the library's status text.

The library is found from $QKV_LIBRARY (a path to libqkv.so), then the build
folders of this source tree (build*/libqkv.so), then the system's library path.
"""
import ctypes
import ctypes.util
import glob
import os

import numpy as np

__all__ = ["Error", "version", "attention_forward", "attention_backward",
           "MultiheadAttention", "library_path"]

# ---------------------------------------------------------------------------
# Loading the library

def _find_library():
    env = os.environ.get("QKV_LIBRARY")
    if env:
        return env
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = sorted(glob.glob(os.path.join(root, "build*", "libqkv.so")), key=os.path.getmtime,
                   reverse=True)
    if found:
        return found[0]
    name = ctypes.util.find_library("qkv")
    if name:
        return name
    raise ImportError("qkv: libqkv.so not found: build it (cmake --build build) or set QKV_LIBRARY")

library_path = _find_library()
_lib = ctypes.CDLL(library_path)

# Enumerations (include/qkv.h; values are pinned).
F32, F64 = 0, 1
_SCORES = {"scaled_dot": 0, "scaled": 0, "dot": 1, "cosine": 2}
_NORMS = {"softmax": 0, "relu": 1, "sigmoid": 2}
_MASKS = {"none": 0, "causal": 1, "window": 2, "causal_window": 3}
_IMPLS = {"auto": 0, "reference": 1, "fast": 2}
_POS = {"none": 0, "rope": 1, "alibi": 2, "relative": 3}

_p = ctypes.c_void_p
_i64 = ctypes.c_int64


class _AttnDesc(ctypes.Structure):
    """qkv_attn_desc, field for field (checked against the library below)."""
    _fields_ = [
        ("dtype", ctypes.c_int), ("batch", _i64), ("n_q", _i64), ("n_k", _i64),
        ("heads", _i64), ("heads_kv", _i64), ("dim", _i64), ("dim_v", _i64),
        ("score", ctypes.c_int), ("scale", ctypes.c_double), ("temperature", ctypes.c_double),
        ("softcap", ctypes.c_double), ("additive_dim", _i64), ("additive_w1", _p),
        ("additive_w2", _p), ("additive_w", _p), ("norm", ctypes.c_int),
        ("relu_divide_by_count", ctypes.c_int), ("mask", ctypes.c_int),
        ("window_left", _i64), ("window_right", _i64), ("key_lengths", _p),
        ("num_seqs", _i64), ("seq_offsets_q", _p), ("seq_offsets_k", _p),
        ("bias_kind", ctypes.c_int), ("bias", _p), ("impl", ctypes.c_int),
        ("threads", ctypes.c_int), ("alibi_slopes", _p), ("rel_table", _p),
        ("rel_buckets", _i64), ("rel_max_distance", _i64), ("rel_bidirectional", ctypes.c_int),
        ("dropout", ctypes.c_double), ("dropout_seed", ctypes.c_uint64),
        ("check_finite", ctypes.c_int), ("rel2d_width", _i64),
    ]


class _AttnGrads(ctypes.Structure):
    _fields_ = [(n, _p) for n in ("dq", "dk", "dv", "dbias", "d_additive_w1", "d_additive_w2",
                                  "d_additive_w", "d_rel_table")]


class _MhaConfig(ctypes.Structure):
    _fields_ = [
        ("embed_dim", _i64), ("heads", _i64), ("heads_kv", _i64), ("head_dim", _i64),
        ("kdim", _i64), ("vdim", _i64), ("bias", ctypes.c_int), ("join", ctypes.c_int),
        ("pos", ctypes.c_int), ("rope_base", ctypes.c_double), ("rel_buckets", _i64),
        ("rel_max_distance", _i64), ("attn", _AttnDesc), ("add_bias_kv", ctypes.c_int),
    ]


def _sig(name, res, *args):
    f = getattr(_lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f

_status_string = _sig("qkv_status_string", ctypes.c_char_p, ctypes.c_int)
_version = _sig("qkv_version", ctypes.c_char_p)
_desc_init = _sig("qkv_attn_desc_init", None, _p)
_forward = _sig("qkv_attention_forward", ctypes.c_int, _p, _p, _p, _p, _p, _p, _p)
_backward = _sig("qkv_attention_backward", ctypes.c_int, _p, _p, _p, _p, _p, _p, _p, _p)
_mha_config_init = _sig("qkv_mha_config_init", None, _p, _i64, _i64)
_mha_create = _sig("qkv_mha_create", ctypes.c_int, _p, ctypes.c_uint64, _p)
_mha_free = _sig("qkv_mha_free", None, _p)
_mha_params = _sig("qkv_mha_params", ctypes.POINTER(ctypes.c_float), _p, _p)
_mha_grads = _sig("qkv_mha_grads", ctypes.POINTER(ctypes.c_float), _p, _p)
_mha_zero_grad = _sig("qkv_mha_zero_grad", None, _p)
_mha_forward = _sig("qkv_mha_forward", ctypes.c_int, _p, _i64, _i64, _i64, _p, _p, _p, _p, _p, _p)
_mha_backward = _sig("qkv_mha_backward", ctypes.c_int, _p, _p, _p, _p, _p, _p, _p, _p)


def _check_layout():
    """qkv_attn_desc_init zeroes exactly sizeof(qkv_attn_desc) bytes: if the
    mirrored structure's size differs, the header changed and this module
    must follow (a wrong layout would pass garbage to the library)."""
    n = 4096
    buf = (ctypes.c_ubyte * n)(*([0xAB] * n))
    _desc_init(ctypes.addressof(buf))
    end = max(i for i in range(n) if buf[i] != 0xAB) + 1
    # Round up to the structure's alignment: trailing padding is zeroed too.
    if end != ctypes.sizeof(_AttnDesc):
        raise ImportError("qkv: python/qkv does not match the library's qkv_attn_desc "
                          "(%d bytes, expected %d): update _AttnDesc" % (end, ctypes.sizeof(_AttnDesc)))

_check_layout()


class Error(RuntimeError):
    """A qkv call failed; .status is the qkv_status code."""

    def __init__(self, status, what):
        self.status = status
        super().__init__("%s: %s (status %d)" % (what, _status_string(status).decode(), status))


def _ok(status, what):
    if status != 0:
        raise Error(status, what)


def version():
    """The library's version, e.g. '0.1.0'."""
    return _version().decode()


def _ptr(a):
    return None if a is None else a.ctypes.data_as(_p)


def _as4(x, name, dtype):
    """x as a C-contiguous [B, n, H, D] array of dtype, and its original rank."""
    a = np.ascontiguousarray(x, dtype=dtype)
    if a.ndim == 2:
        return a[None, :, None, :], 2
    if a.ndim == 3:
        return a[None], 3
    if a.ndim == 4:
        return a, 4
    raise ValueError("qkv: %s must be [n, D], [n, H, D] or [B, n, H, D], not %s" % (name, a.shape))


def _back(a, rank):
    if rank == 2:
        return a[0, :, 0, :]
    if rank == 3:
        return a[0]
    return a


def _dtype_of(q):
    return np.float64 if np.asarray(q).dtype == np.float64 else np.float32


def _fill_desc(d, q4, k4, v4, dtype, score, norm, causal, window, scale, temperature, softcap,
               key_lengths, impl, threads, relu_divide_by_count, check_finite):
    B, nq, H, D = q4.shape
    Bk, nk, Hkv, Dk = k4.shape
    if (Bk, Dk) != (B, D) or v4.shape[:3] != (B, nk, Hkv):
        raise ValueError("qkv: shapes do not fit: q %s, k %s, v %s" % (q4.shape, k4.shape, v4.shape))
    _desc_init(ctypes.byref(d))
    d.dtype = F64 if dtype == np.float64 else F32
    d.batch, d.n_q, d.n_k, d.heads, d.heads_kv, d.dim, d.dim_v = B, nq, nk, H, Hkv, D, v4.shape[3]
    d.score = _SCORES[score]
    d.norm = _NORMS[norm]
    d.relu_divide_by_count = int(bool(relu_divide_by_count))
    if window is not None:
        left, right = window
        d.mask = _MASKS["causal_window" if causal else "window"]
        d.window_left, d.window_right = int(left), 0 if causal else int(right)
    else:
        d.mask = _MASKS["causal" if causal else "none"]
    if scale is not None:
        d.scale = float(scale)
    if temperature is not None:
        d.temperature = float(temperature)
    if softcap is not None:
        d.softcap = float(softcap)
    d.impl = _IMPLS[impl]
    d.threads = int(threads)
    d.check_finite = int(bool(check_finite))
    kl = None
    if key_lengths is not None:
        kl = np.ascontiguousarray(key_lengths, dtype=np.int64)
        if kl.shape != (B,):
            raise ValueError("qkv: key_lengths must have one entry per batch (%d)" % B)
        d.key_lengths = _ptr(kl)
    return kl  # keep alive during the call


def attention_forward(q, k, v, *, causal=False, window=None, score="scaled_dot", norm="softmax",
                      scale=None, temperature=None, softcap=None, key_lengths=None,
                      return_attn=False, return_lse=False, impl="auto", threads=0,
                      relu_divide_by_count=False, check_finite=False):
    """O = normalise(score(Q, K)) V (qkv_attention_forward).

    causal: keys j <= i + n_k - n_q (bottom-right aligned); window=(left, right):
    truncated attention (with causal=True, right is 0); score: 'scaled_dot',
    'dot', 'cosine'; norm: 'softmax', 'relu', 'sigmoid'; key_lengths [B]:
    padding. return_attn adds A' [B, H, n_q, n_k]; return_lse adds the
    log-sum-exp [B, H, n_q]. Returns out, or a tuple (out, attn?, lse?)."""
    dtype = _dtype_of(q)
    q4, rank = _as4(q, "q", dtype)
    k4, _ = _as4(k, "k", dtype)
    v4, _ = _as4(v, "v", dtype)
    d = _AttnDesc()
    keep = _fill_desc(d, q4, k4, v4, dtype, score, norm, causal, window, scale, temperature,
                      softcap, key_lengths, impl, threads, relu_divide_by_count, check_finite)
    B, nq, H, _ = q4.shape
    out = np.empty((B, nq, H, v4.shape[3]), dtype=dtype)
    attn = np.empty((B, H, nq, k4.shape[1]), dtype=dtype) if return_attn else None
    lse = np.empty((B, H, nq), dtype=dtype) if return_lse else None
    _ok(_forward(ctypes.byref(d), _ptr(q4), _ptr(k4), _ptr(v4), _ptr(out), _ptr(attn), _ptr(lse)),
        "qkv_attention_forward")
    del keep
    res = [_back(out, rank)]
    if return_attn:
        res.append(attn)
    if return_lse:
        res.append(lse)
    return res[0] if len(res) == 1 else tuple(res)


def attention_backward(q, k, v, dout, *, causal=False, window=None, score="scaled_dot",
                       norm="softmax", scale=None, temperature=None, softcap=None,
                       key_lengths=None, impl="auto", threads=0, relu_divide_by_count=False,
                       check_finite=False):
    """dL/dQ, dL/dK, dL/dV from dout = dL/dO (qkv_attention_backward), for the
    forward with the same arguments. Returns (dq, dk, dv) shaped as q, k, v."""
    dtype = _dtype_of(q)
    q4, rank = _as4(q, "q", dtype)
    k4, _ = _as4(k, "k", dtype)
    v4, _ = _as4(v, "v", dtype)
    do4, _ = _as4(dout, "dout", dtype)
    d = _AttnDesc()
    keep = _fill_desc(d, q4, k4, v4, dtype, score, norm, causal, window, scale, temperature,
                      softcap, key_lengths, impl, threads, relu_divide_by_count, check_finite)
    if do4.shape != (q4.shape[0], q4.shape[1], q4.shape[2], v4.shape[3]):
        raise ValueError("qkv: dout must be shaped as the output")
    dq, dk, dv = np.empty_like(q4), np.empty_like(k4), np.empty_like(v4)
    g = _AttnGrads(dq=_ptr(dq), dk=_ptr(dk), dv=_ptr(dv))
    _ok(_backward(ctypes.byref(d), _ptr(q4), _ptr(k4), _ptr(v4), None, None, _ptr(do4),
                  ctypes.byref(g)), "qkv_attention_backward")
    del keep
    return _back(dq, rank), _back(dk, rank), _back(dv, rank)


class MultiheadAttention:
    """The multi-head self-attention layer (qkv_mha_*), parameters laid out as
    torch.nn.MultiheadAttention's: y = concat_h(attention(x W_q^T + b_q, ...)) W_o^T + b_o.

    forward(x [B, n, E]) -> y; backward(dy) -> dx, accumulating the parameter
    gradients (grads); params / grads are NumPy views of the layer's memory
    (writing params changes the layer). state_dict() gives torch's names."""

    def __init__(self, embed_dim, heads, *, causal=False, bias=True, pos="none", seed=0,
                 impl="auto", threads=0, score="scaled_dot", norm="softmax"):
        cfg = _MhaConfig()
        _mha_config_init(ctypes.byref(cfg), int(embed_dim), int(heads))
        cfg.bias = int(bool(bias))
        cfg.pos = _POS[pos]
        cfg.attn.mask = _MASKS["causal" if causal else "none"]
        cfg.attn.impl = _IMPLS[impl]
        cfg.attn.threads = int(threads)
        cfg.attn.score = _SCORES[score]
        cfg.attn.norm = _NORMS[norm]
        h = _p()
        _ok(_mha_create(ctypes.byref(cfg), int(seed), ctypes.byref(h)), "qkv_mha_create")
        self._h = h
        self.embed_dim, self.heads, self.bias = int(embed_dim), int(heads), bool(bias)
        self._x = None
        n = _i64()
        self.params = np.ctypeslib.as_array(_mha_params(h, ctypes.byref(n)), shape=(n.value,))
        self.grads = np.ctypeslib.as_array(_mha_grads(h, ctypes.byref(n)), shape=(n.value,))

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            _mha_free(h)
            self._h = None

    def state_dict(self):
        """torch's names -> NumPy views: in_proj_weight [3E, E], in_proj_bias
        [3E], out_proj.weight [E, E], out_proj.bias [E] (biases when bias=True)."""
        E = self.embed_dim
        p, o = self.params, 0
        sd = {"in_proj_weight": p[o:o + 3 * E * E].reshape(3 * E, E)}
        o += 3 * E * E
        if self.bias:
            sd["in_proj_bias"] = p[o:o + 3 * E]
            o += 3 * E
        sd["out_proj.weight"] = p[o:o + E * E].reshape(E, E)
        o += E * E
        if self.bias:
            sd["out_proj.bias"] = p[o:o + E]
        return sd

    def zero_grad(self):
        _mha_zero_grad(self._h)

    def forward(self, x):
        """x [B, n, E] (or [n, E]) float32 -> y of the same shape."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        squeeze = x.ndim == 2
        if squeeze:
            x = x[None]
        if x.ndim != 3 or x.shape[2] != self.embed_dim:
            raise ValueError("qkv: x must be [B, n, %d], not %s" % (self.embed_dim, x.shape))
        B, n, _ = x.shape
        y = np.empty_like(x)
        _ok(_mha_forward(self._h, B, n, n, _ptr(x), None, None, None, _ptr(y), None),
            "qkv_mha_forward")
        self._x, self._squeeze = x, squeeze
        return y[0] if squeeze else y

    def backward(self, dy):
        """dy = dL/dy of the last forward -> dx; parameter gradients accumulate in grads."""
        if self._x is None:
            raise RuntimeError("qkv: backward before forward")
        dy = np.ascontiguousarray(dy, dtype=np.float32).reshape(self._x.shape)
        dx = np.empty_like(self._x)
        _ok(_mha_backward(self._h, _ptr(self._x), None, None, _ptr(dy), _ptr(dx), None, None),
            "qkv_mha_backward")
        return dx[0] if self._squeeze else dx
