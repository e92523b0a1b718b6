"""Backend "c": the plain C99 reference in c_ref/, called through cffi (``tblock._cref``).

``components`` times the C entry points one by one through the same raw calls.

``forward_batch`` is the backend entry point (see tblock/api.py), ``forward_cached`` its KV-cache
path (tb_block_forward_cached). The ``*_raw`` functions
pass their arguments to the C entry points as they are, bad ones included, so tests can
reach the C argument checks; a C error status comes back as :class:`CRefError` (a
ValueError) naming the code and its message.

Raw calls take C-contiguous float64 arrays, or None for a NULL pointer; each array goes to
C with its true length (``a.size``) unless ``lens`` names a shorter one. ``cfg`` there is a
dict of tb_config fields (see :func:`config_fields`), or None for a NULL pointer, so
values a BlockConfig would refuse (norm=7, eps=0, ...) can be sent too.

Weights in a stored format (bf16, int8, int4: tblock.formats) reach C as their stored bytes:
tb_dequantize unpacks each matrix into float64 in C, with its own reading of the layouts, so a
packing bug on the Python side shows up against this backend instead of being shared by it.
"""

from __future__ import annotations

import importlib

import numpy as np

from ..api import TRACE_NAMES, BackendUnavailable

EXTENSION = "tblock._cref"
# the lesson's block with every flag on; the gated FFN adds GATED_NAMES
WEIGHT_NAMES = ("w_q", "w_k", "w_v", "w_o", "w_ff1", "w_ff2", "b_ff1", "b_ff2",
                "ln1_gamma", "ln1_beta", "ln2_gamma", "ln2_beta", "b_q", "b_k", "b_v", "b_o")
GATED_NAMES = ("w_gate", "b_gate")
ALL_WEIGHT_NAMES = WEIGHT_NAMES + GATED_NAMES
C_TRACE_NAMES = TRACE_NAMES + ("F_gate",)       # tb_trace's arrays; F_gate only with the gated FFN
CONFIG_FIELDS = ("d_model", "n_heads", "d_ff", "causal", "norm", "activation", "eps",
                 "has_ffn_bias", "has_ln_affine", "has_attn_bias", "dot", "kv",
                 "norm_type", "ffn", "positions", "rope_theta", "rope_scale", "n_kv_heads")
_NORMS = {"pre": "TB_NORM_PRE", "post": "TB_NORM_POST"}
_NORM_TYPES = {"layernorm": "TB_LAYERNORM", "rmsnorm": "TB_RMSNORM"}
_FFNS = {"mlp": "TB_FFN_MLP", "gated": "TB_FFN_GATED"}
_POSITIONS = {"none": "TB_POS_NONE", "rotary": "TB_POS_ROTARY"}
_ATTN_BIAS = {False: "TB_BIAS_NONE", True: "TB_BIAS_QKVO", "qkv": "TB_BIAS_QKV"}
_ACTIVATIONS = {"gelu_tanh": "TB_ACT_GELU_TANH", "gelu_erf": "TB_ACT_GELU_ERF", "relu": "TB_ACT_RELU",
                "silu": "TB_ACT_SILU"}
_DOTS = {"fp32": "TB_DOT_EXACT", "int8": "TB_DOT_Q8", "bf16": "TB_DOT_BF16"}
_KV = {"bf16": "TB_KV_BF16", "int8": "TB_KV_Q8"}      # a KV cache's format -> tb_kv (others: exact)
_FORMATS = {"bf16": "TB_FMT_BF16", "int8": "TB_FMT_Q8_0", "int4": "TB_FMT_Q4_0"}   # tblock.formats -> tb_format
MATRIX_NAMES = WEIGHT_NAMES[:6] + ("w_gate",)


class CRefError(ValueError):
    """A C entry point returned an error status: ``code``, its enum ``name`` and message."""

    def __init__(self, function: str, code: int, name: str, message: str):
        super().__init__(f"C reference {function}() failed with {name} ({code}): {message}")
        self.function, self.code, self.name = function, code, name


def _extension():
    try:
        return importlib.import_module(EXTENSION)
    except ImportError as e:
        raise BackendUnavailable(
            f"backend 'c' needs the C reference {EXTENSION}, which was not built in this "
            f"installation ({type(e).__name__}: {e}). Build it by reinstalling with a C compiler "
            "available: `pip install -e .` in the tblock checkout (or `pip install .`)."
        ) from None


def ensure_available() -> None:
    """Raise BackendUnavailable (with instructions) unless the C reference can be imported."""
    _extension()


def _check(function: str, code: int) -> None:
    if code != 0:
        ext = _extension()
        ffi, lib = ext.ffi, ext.lib
        raise CRefError(function, int(code), ffi.string(lib.tb_status_name(code)).decode(),
                        ffi.string(lib.tb_status_message(code)).decode())


def _choice(table: dict, name: str, value) -> str:
    """table[value]: the C enum of a BlockConfig option; ValueError naming an option this
    backend does not know, so no option is ever computed as some other one."""
    try:
        return table[value]
    except (KeyError, TypeError):
        raise ValueError(f"backend 'c' does not compute {name}={value!r} (only {tuple(table)})") from None


def config_fields(cfg, dot: str = "fp32", kv: str = "fp32") -> dict:
    """The tb_config fields of a tblock.BlockConfig, as a dict; ``dot``: how products with
    the weights are computed (tblock.formats), "fp32", "int8" or "bf16"; ``kv``: the format of the
    KV cache a cached call's keys and values go to."""
    lib = _extension().lib
    enum = lambda table, name: getattr(lib, _choice(table, name, getattr(cfg, name)))   # noqa: E731
    return dict(d_model=cfg.d_model, n_heads=cfg.n_heads, d_ff=cfg.d_ff, causal=int(cfg.causal),
                norm=enum(_NORMS, "norm"), activation=enum(_ACTIVATIONS, "activation"),
                eps=cfg.eps, has_ffn_bias=int(cfg.ffn_bias), has_ln_affine=int(cfg.ln_affine),
                has_attn_bias=enum(_ATTN_BIAS, "attn_bias"), dot=getattr(lib, _DOTS[dot]),
                kv=getattr(lib, _KV.get(kv, "TB_KV_EXACT")),
                norm_type=enum(_NORM_TYPES, "norm_type"), ffn=enum(_FFNS, "ffn"),
                positions=enum(_POSITIONS, "positions"), rope_theta=cfg.rope_theta,
                rope_scale=cfg.rope_scale, n_kv_heads=cfg.kv_heads)


class _Call:
    """Turns numpy arrays into (pointer, length) pairs for one C call and keeps them alive."""

    def __init__(self, lens):
        ext = _extension()
        self.ffi, self.lib = ext.ffi, ext.lib
        self.lens = dict(lens or {})
        self.keep = []

    def buf(self, name, a, writable=False):
        if a is None:
            ptr, n = self.ffi.NULL, 0
        else:
            if not (isinstance(a, np.ndarray) and a.dtype == np.float64 and a.flags.c_contiguous):
                raise TypeError(f"{name}: raw C calls take C-contiguous float64 arrays or None")
            if writable and not a.flags.writeable:
                raise ValueError(f"{name}: an output array must be writeable")
            ptr, n = self.ffi.from_buffer("double[]", a, require_writable=writable), a.size
            self.keep.append(ptr)
        return ptr, self._claimed(name, n)

    def _claimed(self, name, n):
        """The length C is told for array ``name`` of n elements: lens' claim, when given."""
        if name not in self.lens:
            return n
        claimed = self.lens.pop(name)
        if not 0 <= claimed <= n:   # a longer claim would let C run past the array
            raise ValueError(f"lens[{name!r}]={claimed} must be between 0 and the array's size {n}")
        return claimed

    def bytes(self, name, a):
        """A C-contiguous uint8 array (or None) as a (const uint8_t *, length) pair."""
        if a is None:
            ptr, n = self.ffi.NULL, 0
        else:
            if not (isinstance(a, np.ndarray) and a.dtype == np.uint8 and a.flags.c_contiguous):
                raise TypeError(f"{name}: raw C calls take C-contiguous uint8 arrays or None")
            ptr, n = self.ffi.from_buffer("uint8_t[]", a), a.size
            self.keep.append(ptr)
        return ptr, self._claimed(name, n)

    def config(self, cfg):
        if cfg is None:
            return self.ffi.NULL
        unknown = set(cfg) - set(CONFIG_FIELDS)
        if unknown:
            raise KeyError(f"unknown tb_config fields {sorted(unknown)}")
        c = self.ffi.new("tb_config *", cfg)
        self.keep.append(c)
        return c

    def weights(self, weights):
        """A tb_weights from a dict name -> array (missing names and None are NULL); None: NULL."""
        if weights is None:
            return self.ffi.NULL
        unknown = set(weights) - set(ALL_WEIGHT_NAMES)
        if unknown:
            raise KeyError(f"unknown weight names {sorted(unknown)}")
        w = self.ffi.new("tb_weights *")
        for name in ALL_WEIGHT_NAMES:
            ptr, n = self.buf(name, weights.get(name))
            setattr(w, name, ptr)
            setattr(w, name + "_len", n)
        self.keep.append(w)
        return w

    def flat(self, outputs: dict, inputs: dict) -> list:
        """(pointer, length) of each output array, then of each input, flattened in order."""
        pairs = [self.buf(n, a, writable=True) for n, a in outputs.items()]
        pairs += [self.buf(n, a) for n, a in inputs.items()]
        return [x for pair in pairs for x in pair]

    def finish(self):
        if self.lens:
            raise KeyError(f"lens names no argument of this call: {sorted(self.lens)}")


def scratch_len(cfg: dict | None, T: int) -> int:
    """Doubles of scratch tb_block_forward needs for ``cfg`` (tb_config fields) and T tokens."""
    call = _Call(None)
    n = call.ffi.new("size_t *")
    _check("tb_scratch_len", call.lib.tb_scratch_len(call.config(cfg), T, n))
    return int(n[0])


def call_block_forward_raw(out, H, B: int, T: int, cfg: dict | None, weights: dict | None, scratch,
                           trace: dict | None = None, lens: dict | None = None,
                           scratch_struct: bool = True) -> None:
    """tb_block_forward(out, H, B, T, cfg, weights, scratch, trace) as given.

    ``weights``: dict of weight name -> array; ``trace``: dict of trace name -> array (a
    missing name is NULL), or None for no trace; ``scratch_struct=False`` passes a NULL
    tb_scratch pointer. ``lens`` may shorten the length sent with any array: keys "out",
    "H", "scratch", a weight name or a trace name."""
    call = _Call(lens)
    out_p, out_n = call.buf("out", out, writable=True)
    in_p, in_n = call.buf("H", H)
    c = call.config(cfg)
    w = call.weights(weights)
    sp, sn = call.buf("scratch", scratch, writable=True)
    s = call.ffi.new("tb_scratch *", {"data": sp, "len": sn}) if scratch_struct else call.ffi.NULL
    t = call.ffi.NULL
    if trace is not None:
        unknown = set(trace) - set(C_TRACE_NAMES)
        if unknown:
            raise KeyError(f"unknown trace names {sorted(unknown)}")
        t = call.ffi.new("tb_trace *")
        for name in C_TRACE_NAMES:
            ptr, n = call.buf(name, trace.get(name), writable=True)
            setattr(t, name, ptr)
            setattr(t, name + "_len", n)
    call.finish()
    _check("tb_block_forward", call.lib.tb_block_forward(out_p, out_n, in_p, in_n, B, T, c, w, s, t))


def scratch_len_cached(cfg: dict | None, T_new: int, past: int) -> int:
    """Doubles of scratch tb_block_forward_cached needs for T_new tokens after past cached ones."""
    call = _Call(None)
    n = call.ffi.new("size_t *")
    _check("tb_scratch_len_cached", call.lib.tb_scratch_len_cached(call.config(cfg), T_new, past, n))
    return int(n[0])


def call_block_forward_cached_raw(out, H, B: int, T_new: int, past: int, max_T: int, K_cache, V_cache,
                                  cfg: dict | None, weights: dict | None, scratch, lens: dict | None = None,
                                  scratch_struct: bool = True) -> None:
    """tb_block_forward_cached(out, H, B, T_new, past, max_T, K_cache, V_cache, cfg, weights,
    scratch) as given. The caches are (B, n_kv_heads, max_T, d_k) float64 arrays (or None); C
    writes the new tokens' keys and values (keys after rotary) into them in place. ``lens``
    keys: "out", "H", "K_cache", "V_cache", "scratch" or a weight name."""
    call = _Call(lens)
    out_p, out_n = call.buf("out", out, writable=True)
    in_p, in_n = call.buf("H", H)
    k_p, k_n = call.buf("K_cache", K_cache, writable=True)
    v_p, v_n = call.buf("V_cache", V_cache, writable=True)
    c = call.config(cfg)
    w = call.weights(weights)
    sp, sn = call.buf("scratch", scratch, writable=True)
    s = call.ffi.new("tb_scratch *", {"data": sp, "len": sn}) if scratch_struct else call.ffi.NULL
    call.finish()
    _check("tb_block_forward_cached", call.lib.tb_block_forward_cached(
        out_p, out_n, in_p, in_n, B, T_new, past, max_T, k_p, k_n, v_p, v_n, c, w, s))


def layernorm_rows_raw(out, X, rows: int, cols: int, gamma=None, beta=None, eps: float = 1e-5,
                       lens: dict | None = None) -> None:
    """tb_layernorm_rows; lens keys: out, X, affine (the length sent with gamma and beta)."""
    lens = dict(lens or {})
    affine_len = lens.pop("affine", None)
    call = _Call(lens)
    out_p, out_n = call.buf("out", out, writable=True)
    x_p, x_n = call.buf("X", X)
    g_p, g_n = call.buf("gamma", gamma)
    b_p, _ = call.buf("beta", beta)
    call.finish()
    _check("tb_layernorm_rows", call.lib.tb_layernorm_rows(
        out_p, out_n, x_p, x_n, rows, cols, g_p, b_p, g_n if affine_len is None else affine_len, eps))


def rmsnorm_rows_raw(out, X, rows: int, cols: int, gamma=None, eps: float = 1e-5,
                     lens: dict | None = None) -> None:
    """tb_rmsnorm_rows; lens keys: out, X, gamma."""
    call = _Call(lens)
    out_p, out_n, x_p, x_n, g_p, g_n = call.flat(dict(out=out), dict(X=X, gamma=gamma))
    call.finish()
    _check("tb_rmsnorm_rows", call.lib.tb_rmsnorm_rows(out_p, out_n, x_p, x_n, rows, cols, g_p, g_n, eps))


def rotary_rows_raw(out, X, rows: int, cols: int, first: int, cfg: dict | None,
                    lens: dict | None = None) -> None:
    """tb_rotary_rows: out = X's heads turned for positions first .. first+rows-1; lens keys: out, X."""
    call = _Call(lens)
    flat, c = call.flat(dict(out=out), dict(X=X)), call.config(cfg)
    call.finish()
    _check("tb_rotary_rows", call.lib.tb_rotary_rows(*flat, rows, cols, first, c))


def masked_softmax_rows_raw(out, S, rows: int, cols: int, causal: int, lens: dict | None = None) -> None:
    """tb_masked_softmax_rows; lens keys: out, S."""
    call = _Call(lens)
    out_p, out_n = call.buf("out", out, writable=True)
    s_p, s_n = call.buf("S", S)
    call.finish()
    _check("tb_masked_softmax_rows", call.lib.tb_masked_softmax_rows(out_p, out_n, s_p, s_n, rows, cols, causal))


def attention_head_raw(out_concat, A_h, S, Q, K, V, T: int, head: int, cfg: dict | None,
                       lens: dict | None = None) -> None:
    """tb_attention_head; lens keys: out_concat, A_h, S, Q, K, V."""
    call = _Call(lens)
    flat = call.flat(dict(out_concat=out_concat, A_h=A_h, S=S), dict(Q=Q, K=K, V=V))
    c = call.config(cfg)
    call.finish()
    _check("tb_attention_head", call.lib.tb_attention_head(*flat, T, head, c))


def ffn_raw(F_out, F_pre, F_post, X, T: int, cfg: dict | None, weights: dict | None,
            lens: dict | None = None) -> None:
    """tb_ffn; lens keys: F_out, F_pre, F_post, X and the FFN weight names."""
    call = _Call(lens)
    flat = call.flat(dict(F_out=F_out, F_pre=F_pre, F_post=F_post), dict(X=X))
    c, w = call.config(cfg), call.weights(weights)
    call.finish()
    _check("tb_ffn", call.lib.tb_ffn(*flat, T, c, w))


def gated_ffn_raw(F_out, F_pre, F_gate, F_post, X, T: int, cfg: dict | None, weights: dict | None,
                  lens: dict | None = None) -> None:
    """tb_gated_ffn; lens keys: F_out, F_pre, F_gate, F_post, X and the FFN weight names."""
    call = _Call(lens)
    flat = call.flat(dict(F_out=F_out, F_pre=F_pre, F_gate=F_gate, F_post=F_post), dict(X=X))
    c, w = call.config(cfg), call.weights(weights)
    call.finish()
    _check("tb_gated_ffn", call.lib.tb_gated_ffn(*flat, T, c, w))


def status_codes() -> dict:
    """Every status code by its enum name, e.g. {"TB_OK": 0, "TB_ERR_NULL_ARG": 1, ...}."""
    ext = _extension()
    return {ext.ffi.string(ext.lib.tb_status_name(code)).decode(): code
            for code in range(ext.lib.TB_STATUS_COUNT)}


def format_code(fmt: str) -> int:
    """The tb_format of a stored format of tblock.formats ("bf16", "int8", "int4")."""
    if fmt not in _FORMATS:
        raise ValueError(f"the C reference reads the stored formats {tuple(_FORMATS)}, got {fmt!r}")
    return getattr(_extension().lib, _FORMATS[fmt])


def dequantize_raw(out, data, fmt: int, d_in: int, d_out: int, lens: dict | None = None) -> None:
    """tb_dequantize(out, data, fmt, d_in, d_out) as given: out a float64 array, data a uint8
    array (either may be None for NULL), fmt a tb_format code; lens keys: "out", "data"."""
    call = _Call(lens)
    out_p, out_n = call.buf("out", out, writable=True)
    data_p, data_n = call.bytes("data", data)
    call.finish()
    _check("tb_dequantize", call.lib.tb_dequantize(out_p, out_n, data_p, data_n, fmt, d_in, d_out))


def stored_bytes(matrix) -> np.ndarray:
    """A QuantizedMatrix's stored rows as the bytes a file holds: uint8, little-endian."""
    data = matrix.data
    if data.dtype != np.uint8:          # bf16's uint16 words, in the byte order C reads
        data = np.ascontiguousarray(data, dtype="<u2").view(np.uint8)
    return np.ascontiguousarray(data).reshape(-1)


def dequantize(matrix) -> np.ndarray:
    """W (d_in, d_out) float64 of a QuantizedMatrix, unpacked from its stored bytes in C."""
    d_in, d_out = matrix.shape
    out = np.full((d_in, d_out), np.nan)    # NaN-filled: a value C never wrote cannot pass
    dequantize_raw(out, stored_bytes(matrix), format_code(matrix.format), d_in, d_out)
    return out


def _float64_weights(weights) -> dict:
    """Every weight present, as a C-contiguous float64 array."""
    w = {}
    for name in ALL_WEIGHT_NAMES:
        value = getattr(weights, name)
        if value is None:
            continue
        if weights.quantized and name in MATRIX_NAMES:
            w[name] = dequantize(value)     # the stored bytes, unpacked by C itself
        else:
            w[name] = np.ascontiguousarray(value, dtype=np.float64)
    return w


def trace_shapes(B: int, T: int, cfg) -> dict:
    """Shape of each trace array for a batch of B sequences of T tokens (F_gate: gated only)."""
    d, f = cfg.d_model, cfg.d_ff
    shapes = {name: (B, T, d) for name in TRACE_NAMES}
    shapes.update(K=(B, T, cfg.d_kv), V=(B, T, cfg.d_kv), A=(B, cfg.n_heads, T, T), F_pre=(B, T, f),
                  F_post=(B, T, f))
    if cfg.ffn == "gated":
        shapes.update(F_gate=(B, T, f))
    return shapes


# tblock.api checks H for NaN/Inf before calling forward_batch
CHECKS_FINITE = False


def forward_batch(H: np.ndarray, weights, cfg, trace: bool):
    """Backend entry point: H (B, T, d_model) float32/float64; returns float64 H_out and,
    if asked, the trace dict with a leading batch axis."""
    B, T, _ = H.shape
    H64 = np.ascontiguousarray(H, dtype=np.float64)
    w = weights.prepared(("c_ref", "float64"), _float64_weights)
    fields = config_fields(cfg, weights.dot)
    # NaN-filled, so a value C never wrote could not pass for a result
    scratch = np.full(scratch_len(fields, T), np.nan)
    out = np.full(H.shape, np.nan)
    tr = {name: np.full(shape, np.nan) for name, shape in trace_shapes(B, T, cfg).items()} if trace else None
    call_block_forward_raw(out, H64, B, T, fields, w, scratch, tr)
    return out, tr


def forward_cached(H: np.ndarray, weights, cfg, cache):
    """The KV-cache entry point: H (B, T_new, d_model) holds the tokens after the cache's first
    cache.length; returns their float64 H_out, having written their K and V into the cache
    past cache.length (tblock.api then moves cache.length).

    C computes in double only, and takes the cache as rows, (B, n_kv_heads, keys, d_k): it gets
    a float64 copy of the rows it reads, past + T_new, the past ones from the cache's packed
    layout (KVCache.head_rows) and the new ones for it to fill, and the new rows are stored
    back in the cache's layout and dtype. So the new tokens attend to their own keys
    unrounded in a float cache, and to the earlier ones as the cache stores them; in a bf16
    or int8 cache, C rounds the new rows itself (tb_config.kv) before attending to them, and
    the cache rounds the exact rows C hands back when it stores them."""
    B, T_new, _ = H.shape
    past = cache.length
    H64 = np.ascontiguousarray(H, dtype=np.float64)
    w = weights.prepared(("c_ref", "float64"), _float64_weights)
    fields = config_fields(cfg, weights.dot, getattr(cache, "format", "fp32"))
    # NaN-filled, so a value C never wrote could not pass for a result
    K = np.full((B, cfg.kv_heads, past + T_new, cfg.d_k), np.nan)    # (B, kv heads, keys, d_k) float64
    V = np.full_like(K, np.nan)
    for b in range(B):
        K[b, :, :past], V[b, :, :past] = cache.head_rows(b, past)
    scratch = np.full(scratch_len_cached(fields, T_new, past), np.nan)
    out = np.full(H.shape, np.nan)
    call_block_forward_cached_raw(out, H64, B, T_new, past, past + T_new, K, V, fields, w, scratch)
    for b in range(B):
        cache.store(b, past, K[b, :, past:], V[b, :, past:])
    return out


def components(cfg, weights, dtype):
    """The C reference's own entry points: outputs are allocated once per shape, so a timed
    call is the cast to float64 (C computes in double only, as forward_batch does) plus the C work."""
    from .components import ComponentSet, block_fn

    cs = ComponentSet("c", cfg, dtype, np.dtype(np.float64))
    cs.missing["attention"] = ("the C reference exposes no projection (matmul) entry point, only "
                               "tb_attention_head (the core) and the whole block")
    fields = config_fields(cfg, weights.dot)
    w64 = weights.prepared(("c_ref", "float64"), _float64_weights)
    d, f = cfg.d_model, cfg.d_ff
    buffers = {}

    def bufs(key, *shapes):
        # per-shape outputs, made on the warm-up call, never inside a timed one
        if key not in buffers:
            buffers[key] = [np.empty(s) for s in shapes]
        return buffers[key]

    def f64(a):
        return np.ascontiguousarray(a, dtype=np.float64)

    def layernorm(X):
        # the block's norm, LayerNorm or RMSNorm (the component keeps the lesson's name)
        [out] = bufs(("ln", X.shape[0]), (X.shape[0], d))
        if cfg.norm_type == "rmsnorm":
            rmsnorm_rows_raw(out, f64(X), X.shape[0], d, w64.get("ln1_gamma"), cfg.eps)
        else:
            layernorm_rows_raw(out, f64(X), X.shape[0], d, w64.get("ln1_gamma"), w64.get("ln1_beta"), cfg.eps)
        return out

    def softmax(S):
        S = f64(S)
        [out] = bufs(("sm",) + S.shape, S.shape)
        for h in range(S.shape[0]):         # the C function masks by row index: one head per call
            masked_softmax_rows_raw(out[h], S[h], S.shape[1], S.shape[2], int(cfg.causal))
        return out

    def attention_core(Q, K, V):
        Q, K, V = f64(Q), f64(K), f64(V)
        T = Q.shape[0]
        out, A, S = bufs(("core", T), (T, d), (T, T), (T, T))
        for h in range(cfg.n_heads):
            attention_head_raw(out, A, S, Q, K, V, T, h, fields)
        return out

    def ffn(X):
        T = X.shape[0]
        out, pre, post, gate = bufs(("ffn", T), (T, d), (T, f), (T, f), (T, f))
        if cfg.ffn == "gated":
            gated_ffn_raw(out, pre, gate, post, f64(X), T, fields, w64)
        else:
            ffn_raw(out, pre, post, f64(X), T, fields, w64)
        return out

    cs.fns.update(layernorm=layernorm, softmax=softmax, attention_core=attention_core, ffn=ffn,
                  block=block_fn("c", cfg, weights))
    cs.notes.append("the C reference computes in float64 (inputs are cast inside each timed call) and "
                    "fills the full T x T score square, masked entries included")
    return cs
