"""qkv for Python: self-attention, the multi-head layer and the BERT-family
sentence encoder of the qkv C library, through ctypes over its shared library
(libqkv.so), with NumPy arrays in and out.

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

The encoder (include/qkv/encoder.h, docs/ENCODER.md) reads a Hugging Face /
sentence-transformers model directory of a BertModel, e.g.
all-MiniLM-L6-v2:

    with qkv.Encoder("all-MiniLM-L6-v2") as enc:          # the model directory
        a, b = enc.encode(["Hello, I love you!", "Hi, I miss you."])
        print("%.4f" % (a @ b))      # 0.4960: the vectors have unit length
        enc.tokenize("Hello, I love you!", tokens=True)
        # ['[CLS]', 'hello', ',', 'i', 'love', 'you', '!', '[SEP]']
        enc.attentions("Hello, I love you!").shape    # (6, 12, 8, 8)
        enc.info["hidden"], enc.info["pooling"]       # (384, 'mean')

encode() pools as the model says (or pooling='mean' | 'cls' | 'max';
pooling='none' gives each text's token states); errors raise qkv.Error with
the library's sentence naming the file, field or text (Error.why).

PyTorch: qkv.torch.scaled_dot_product_attention is torch's function of that
name computed by qkv, with autograd (import qkv.torch; see its documentation).

The library is found from $QKV_LIBRARY (a path to libqkv.so), then the copy
inside the package (pip install . puts it there), then the build folders of
this source tree (build*/libqkv.so), then the system's library path.
"""
import ctypes
import ctypes.util
import glob
import os
import re
import threading

import numpy as np

__all__ = ["Error", "version", "attention_forward", "attention_backward",
           "MultiheadAttention", "Encoder", "library_path"]

# ---------------------------------------------------------------------------
# Loading the library

def _find_library():
    env = os.environ.get("QKV_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    # An installed package (pip install .) carries its own copy.
    own = os.path.join(here, "libqkv.so")
    if os.path.isfile(own):
        return own
    root = os.path.dirname(os.path.dirname(here))
    found = sorted(glob.glob(os.path.join(root, "build*", "libqkv.so")), key=os.path.getmtime,
                   reverse=True)
    if found:
        return found[0]
    name = ctypes.util.find_library("qkv")
    if name:
        return name
    raise ImportError("qkv: libqkv.so not found: install the package (pip install . at the "
                      "repository root), build it (cmake --build build) or set QKV_LIBRARY")

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


def _check_layout(cname, structure, zero):
    """zero(address) makes the library zero exactly sizeof(cname) bytes (its
    init function, or a getter given NULL): if the mirrored structure's size
    differs, the header changed and this module must follow (a wrong layout
    would pass garbage to the library)."""
    n = 4096
    buf = (ctypes.c_ubyte * n)(*([0xAB] * n))
    zero(ctypes.addressof(buf))
    end = max(i for i in range(n) if buf[i] != 0xAB) + 1
    # Round up to the structure's alignment: trailing padding is zeroed too.
    if end != ctypes.sizeof(structure):
        raise ImportError("qkv: python/qkv does not match the library's %s (%d bytes, expected "
                          "%d): update %s" % (cname, end, ctypes.sizeof(structure),
                                              structure.__name__))

_check_layout("qkv_attn_desc", _AttnDesc, _desc_init)


class Error(RuntimeError):
    """A qkv call failed; .status is the qkv_status code, .why the library's
    own sentence about it (naming the file, field or text) or None."""

    def __init__(self, status, what, why=None):
        self.status = status
        self.why = why
        if why:
            super().__init__("%s: %s (status %d)" % (what, why, status))
        else:
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


# ---------------------------------------------------------------------------
# The BERT-family encoder (include/qkv/encoder.h) and its tokenizer (qkv/text.h)

_POOLINGS = {"mean": 0, "cls": 1, "max": 2}
_POOLING_NAMES = {v: k for k, v in _POOLINGS.items()}
_ACTS = {0: "gelu", 1: "gelu_new", 2: "relu"}
_ERR_BAD_SIZE = 2
_WHY_LEN = 512


class _EncoderOptions(ctypes.Structure):
    _fields_ = [("threads", ctypes.c_int), ("max_length", _i64), ("precision", ctypes.c_int)]


class _EncoderInfo(ctypes.Structure):
    _fields_ = [
        ("hidden", _i64), ("layers", _i64), ("heads", _i64), ("intermediate", _i64),
        ("vocab_size", _i64), ("max_positions", _i64), ("type_vocab_size", _i64),
        ("max_length", _i64), ("pooling", ctypes.c_int), ("normalize", ctypes.c_int),
        ("layer_norm_eps", ctypes.c_double), ("hidden_act", ctypes.c_int),
        ("precision", ctypes.c_int),
    ]


_c_size_t_p = ctypes.POINTER(ctypes.c_size_t)
_enc_load = _sig("qkv_encoder_load", ctypes.c_int, ctypes.c_char_p, _p, _p, _p, ctypes.c_size_t)
_enc_free = _sig("qkv_encoder_free", None, _p)
_enc_get_info = _sig("qkv_encoder_get_info", None, _p, _p)
_enc_tokenizer = _sig("qkv_encoder_tokenizer", _p, _p)
_enc_embed = _sig("qkv_encoder_embed", ctypes.c_int, _p, _p, _p, _i64, ctypes.c_int, ctypes.c_int,
                  _p, _p, ctypes.c_size_t)
_enc_token_states = _sig("qkv_encoder_token_states", ctypes.c_int, _p, _p, _p, _i64, _p, _i64, _p,
                         _p, _p, ctypes.c_size_t)
_enc_attention = _sig("qkv_encoder_attention", ctypes.c_int, _p, _p, ctypes.c_size_t, _i64, _p,
                      _i64, _p, _p, ctypes.c_size_t)
_tok_encode = _sig("qkv_tokenizer_encode", ctypes.c_int, _p, _p, ctypes.c_size_t, _p,
                   ctypes.c_size_t, _i64, _p, _p, _i64, _p, _p, ctypes.c_size_t)
_tok_token = _sig("qkv_tokenizer_token", _p, _p, ctypes.c_int32, _c_size_t_p)

_check_layout("qkv_encoder_info", _EncoderInfo, lambda a: _enc_get_info(None, a))


def _text_bytes(t):
    """A text as the bytes the library reads: str is encoded as UTF-8 (lone
    surrogates pass through, so that the library refuses them with its own
    message, as it refuses invalid UTF-8 bytes); bytes-like objects as they are."""
    if isinstance(t, str):
        return t.encode("utf-8", "surrogatepass")
    if isinstance(t, (bytes, bytearray, memoryview)):
        return bytes(t)
    raise TypeError("qkv: a text must be str or bytes, not %s" % type(t).__name__)


def _is_one_text(x):
    return isinstance(x, (str, bytes, bytearray, memoryview))


class _Texts:
    """The C arrays (const char *texts[], size_t lens[]) of a list of texts,
    keeping the bytes alive while a call uses them."""

    def __init__(self, texts):
        self.data = [_text_bytes(t) for t in texts]
        n = len(self.data)
        self.ptrs = (ctypes.c_char_p * n)(*self.data)
        self.lens = (ctypes.c_size_t * n)(*[len(b) for b in self.data])
        self.count = n


_PRECISIONS = {"fp32": 0, "bf16": 1, "int8": 2}  # qkv_encoder_precision


class Encoder:
    """A pretrained BERT-family encoder (qkv_encoder_*) read from a Hugging
    Face / sentence-transformers model directory (config.json,
    model.safetensors, vocab.txt and, optionally, modules.json,
    1_Pooling/config.json, sentence_bert_config.json; see docs/ENCODER.md).

    threads: worker threads of every call (0: $QKV_NUM_THREADS or the cores);
    max_length: truncation in tokens, [CLS] and [SEP] included (0: from the
    model); precision: 'fp32' (default), 'bf16' (the projections with bf16
    weights and activations, float sums) or 'int8' (int8 weights per output
    channel and activations per row); docs/ENCODER.md.
    Texts are str (encoded as UTF-8) or bytes (UTF-8); invalid UTF-8
    is refused, never replaced. Failures raise qkv.Error with the library's
    sentence (the file and field, or the text's index). One encoder runs one
    call at a time (calls from several Python threads take turns). Use it as
    a context manager, or close() it, to free it at once."""

    def __init__(self, model_dir, threads=0, max_length=0, precision="fp32"):
        self._h = None
        self._lock = threading.Lock()
        path = os.fsencode(model_dir)
        if precision not in _PRECISIONS:
            raise ValueError("precision must be one of %s, not %r" % (", ".join(_PRECISIONS), precision))
        opt = _EncoderOptions(int(threads), int(max_length), _PRECISIONS[precision])
        h = _p()
        why = ctypes.create_string_buffer(_WHY_LEN)
        status = _enc_load(path, ctypes.byref(opt), ctypes.byref(h), why, _WHY_LEN)
        if status != 0:
            raise Error(status, "qkv_encoder_load", why.value.decode("utf-8", "replace"))
        self._h = h
        info = _EncoderInfo()
        _enc_get_info(h, ctypes.byref(info))
        self._tok = _enc_tokenizer(h)
        self._info = {
            "model_dir": os.fsdecode(model_dir),
            "hidden": info.hidden, "layers": info.layers, "heads": info.heads,
            "intermediate": info.intermediate, "vocab_size": info.vocab_size,
            "max_positions": info.max_positions, "type_vocab_size": info.type_vocab_size,
            "max_length": info.max_length,
            "pooling": _POOLING_NAMES.get(info.pooling, info.pooling),
            "normalize": bool(info.normalize), "layer_norm_eps": info.layer_norm_eps,
            "hidden_act": _ACTS.get(info.hidden_act, info.hidden_act),
            "precision": {v: k for k, v in _PRECISIONS.items()}.get(info.precision, info.precision),
        }

    # -- lifetime ---------------------------------------------------------

    def close(self):
        """Free the encoder (its weights' mapping, tokenizer and workspace).
        Further calls raise ValueError; closing twice is harmless."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            h, self._h = self._h, None
            if h:
                _enc_free(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        # getattr: __init__ may have failed before _h existed; at interpreter
        # exit the module's globals may already be gone.
        h = getattr(self, "_h", None)
        if h and _enc_free is not None:
            self._h = None
            _enc_free(h)

    def __repr__(self):
        if not self._h:
            return "<qkv.Encoder (closed)>"
        i = self._info
        return "<qkv.Encoder %r: hidden %d, %d layers, %d heads, max_length %d>" % (
            i["model_dir"], i["hidden"], i["layers"], i["heads"], i["max_length"])

    def _handle(self):
        if not self._h:
            raise ValueError("qkv: the encoder is closed")
        return self._h

    @property
    def info(self):
        """A dict: model_dir, hidden, layers, heads, intermediate, vocab_size,
        max_positions, type_vocab_size, max_length (the truncation in
        effect), pooling ('mean' | 'cls' | 'max': the model's), normalize
        (bool: the model's), layer_norm_eps, hidden_act ('gelu' | 'gelu_new'
        | 'relu'), precision ('fp32' | 'bf16' | 'int8')."""
        return dict(self._info)

    @property
    def hidden(self):
        return self._info["hidden"]

    # -- sentence vectors and token states -------------------------------

    def encode(self, texts, pooling=None, normalize=None, batch_size=32):
        """Sentence vectors of a list of texts: float32 [len(texts), hidden]
        (a single text gives [hidden]).

        pooling: None (the model's), 'mean' (over every token, [CLS] and
        [SEP] included), 'cls', 'max', or 'none': the last layer's token
        states instead, a list of float32 [n_i, hidden] arrays (n_i the
        i-th text's token count; see token_states for the packed form).
        normalize: None (the model's), True (L2-normalised, x / max(|x|,
        1e-12)) or False; not allowed with pooling='none'. batch_size texts
        go to the library per call (the results do not depend on it)."""
        one = _is_one_text(texts)
        items = [texts] if one else list(texts)
        b = int(batch_size)
        if b < 1:
            raise ValueError("qkv: batch_size must be >= 1, not %d" % b)
        if pooling == "none":
            if normalize:
                raise ValueError("qkv: normalize applies to pooled vectors, not to pooling='none'")
            states, off = self.token_states(items, batch_size=b)
            res = [states[off[i]:off[i + 1]] for i in range(len(items))]
            return res[0] if one else res
        if pooling is None:
            pool = -1
        elif pooling in _POOLINGS:
            pool = _POOLINGS[pooling]
        else:
            raise ValueError("qkv: pooling must be None, 'mean', 'cls', 'max' or 'none', not %r"
                             % (pooling,))
        norm = -1 if normalize is None else int(bool(normalize))
        out = np.empty((len(items), self.hidden), dtype=np.float32)
        why = ctypes.create_string_buffer(_WHY_LEN)
        with self._lock:
            h = self._handle()
            for s0 in range(0, len(items), b):
                t = _Texts(items[s0:s0 + b])
                status = _enc_embed(h, t.ptrs, t.lens, t.count, pool, norm, _ptr(out[s0:]), why,
                                    _WHY_LEN)
                if status != 0:
                    raise Error(status, "qkv_encoder_embed", _batch_why(why, s0))
        return out[0] if one else out

    def token_states(self, texts, batch_size=32):
        """The last layer's token states of a list of texts, packed end to
        end: (states float32 [tokens, hidden], offsets int64 [len(texts) + 1]);
        text i's rows are states[offsets[i]:offsets[i + 1]]."""
        items = [texts] if _is_one_text(texts) else list(texts)
        b = int(batch_size)
        if b < 1:
            raise ValueError("qkv: batch_size must be >= 1, not %d" % b)
        parts, offsets, base = [], [0], 0
        why = ctypes.create_string_buffer(_WHY_LEN)
        with self._lock:
            h = self._handle()
            for s0 in range(0, len(items), b):
                t = _Texts(items[s0:s0 + b])
                tokens = _i64(-1)
                # Capacity 0 to learn the token count (or the error of the texts).
                status = _enc_token_states(h, t.ptrs, t.lens, t.count, None, 0, None,
                                           ctypes.byref(tokens), why, _WHY_LEN)
                if status != 0 and not (status == _ERR_BAD_SIZE and tokens.value > 0):
                    raise Error(status, "qkv_encoder_token_states", _batch_why(why, s0))
                x = np.empty((tokens.value, self.hidden), dtype=np.float32)
                off = np.empty(t.count + 1, dtype=np.int64)
                status = _enc_token_states(h, t.ptrs, t.lens, t.count, _ptr(x), tokens.value,
                                           _ptr(off), ctypes.byref(tokens), why, _WHY_LEN)
                if status != 0:
                    raise Error(status, "qkv_encoder_token_states", _batch_why(why, s0))
                parts.append(x)
                offsets.extend((off[1:] + base).tolist())
                base += int(off[-1])
        states = np.concatenate(parts) if parts else np.empty((0, self.hidden), np.float32)
        return states, np.asarray(offsets, dtype=np.int64)

    # -- attention maps ---------------------------------------------------

    def attentions(self, text, layer=None):
        """The attention maps of one text: float32 [layers, heads, n, n] for
        every layer (layer None), or [heads, n, n] for layer `layer`
        (0-based); n is the text's token count and row i says how token i
        weighs the tokens j (each row sums to 1). Each layer asked for runs
        the forward up to it once."""
        data = _text_bytes(text)
        layers = range(self._info["layers"]) if layer is None else [int(layer)]
        maps = []
        why = ctypes.create_string_buffer(_WHY_LEN)
        with self._lock:
            h = self._handle()
            for l in layers:
                n = _i64(-1)
                status = _enc_attention(h, data, len(data), l, None, 0, ctypes.byref(n), why,
                                        _WHY_LEN)
                if status != 0 and not (status == _ERR_BAD_SIZE and n.value > 0):
                    raise Error(status, "qkv_encoder_attention", _batch_why(why, 0))
                a = np.empty((self._info["heads"], n.value, n.value), dtype=np.float32)
                status = _enc_attention(h, data, len(data), l, _ptr(a), a.size, ctypes.byref(n),
                                        why, _WHY_LEN)
                if status != 0:
                    raise Error(status, "qkv_encoder_attention", _batch_why(why, 0))
                maps.append(a)
        return maps[0] if layer is not None else np.stack(maps)

    # -- the tokenizer ----------------------------------------------------

    def tokenize(self, texts, tokens=False):
        """The token ids of a text as the encoder reads them ([CLS] ... [SEP],
        truncated to info['max_length']): a list of int, or with tokens=True
        the word pieces (str, continuations with their '##'). A list of texts
        gives a list of lists."""
        one = _is_one_text(texts)
        items = [texts] if one else list(texts)
        res = []
        why = ctypes.create_string_buffer(_WHY_LEN)
        with self._lock:
            self._handle()
            tok, max_len = self._tok, self._info["max_length"]
            for i, t in enumerate(items):
                data = _text_bytes(t)
                count = _i64(-1)
                status = _tok_encode(tok, data, len(data), None, 0, max_len, None, None, 0,
                                     ctypes.byref(count), why, _WHY_LEN)
                if status != 0 and not (status == _ERR_BAD_SIZE and count.value > 0):
                    raise Error(status, "qkv_tokenizer_encode", _text_why(why, None if one else i))
                ids = (ctypes.c_int32 * max(count.value, 1))()
                status = _tok_encode(tok, data, len(data), None, 0, max_len, ids, None, count.value,
                                     ctypes.byref(count), why, _WHY_LEN)
                if status != 0:
                    raise Error(status, "qkv_tokenizer_encode", _text_why(why, None if one else i))
                row = list(ids[:count.value])
                if tokens:
                    row = [self._piece(tok, j) for j in row]
                res.append(row)
        return res[0] if one else res

    @staticmethod
    def _piece(tok, i):
        size = ctypes.c_size_t(0)
        p = _tok_token(tok, i, ctypes.byref(size))
        if not p:
            raise ValueError("qkv: id %d is not in the vocab" % i)
        return ctypes.string_at(p, size.value).decode("utf-8")


def _text_why(why, i):
    """The tokenizer's sentence about text i of a list (None: a single text):
    its leading "text" gets the index."""
    text = why.value.decode("utf-8", "replace")
    if i is not None and text.startswith("text:"):
        text = "text %d:%s" % (i, text[5:])
    return text


def _batch_why(why, s0):
    """The library's sentence (why, a buffer) for a batch that starts at text
    s0 of the list: its leading "text k" (counted in the batch) becomes the
    list's index."""
    text = why.value.decode("utf-8", "replace")
    m = re.match(r"text (\d+)", text)
    if m and s0:
        text = "text %d%s" % (int(m.group(1)) + s0, text[m.end():])
    return text
