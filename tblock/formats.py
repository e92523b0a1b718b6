"""Weight formats: how a weight matrix is stored, and its exact value.

A matrix W (d_in, d_out) in the lesson's row convention (X @ W) is stored transposed, one
row per output feature, as Hugging Face and GGUF files store it:

    fp32   float32 W, as given (the default; BlockWeights holds the array itself)
    bf16   uint16 (d_out, d_in): the top half of each float32, rounded to nearest even
    int8   uint8 (d_out, d_in // 32 * 34): GGUF's Q8_0 blocks of 32 inputs, each a float16
           scale d (2 bytes, little-endian) then 32 int8 q; the value is d * q
    int4   uint8 (d_out, d_in // 32 * 18): GGUF's Q4_0 blocks of 32 inputs, each a float16
           scale d then 16 bytes, byte j holding input j in its low nibble and input j + 16
           in its high one; the value is d * (nibble - 8)

The blocked formats need d_in a multiple of 32 and refuse anything else (padding would make
the stored bytes differ from a GGUF file's).  Every stored value is exactly a float32
(a float16 times an integer of at most 8 bits), so ``dequantize`` is exact in float32 and
float64 alike.  The rounding follows ggml's reference quantizers, so the bytes of a matrix
are those llama.cpp's converter writes for it.

A stored matrix also says how a product x @ W with it is computed, its ``dot``:

    fp32   the stored values times x's float32s (the default)
    int8   (int8 and int4 matrices) each row x first rounded to int8 in blocks of 32 inputs,
           as llama.cpp does, so that a kernel can sum integer products (VNNI's vpdpbusd):
           per block, amax = max |x_i|; d = amax / 127 and q_i = rint(x_i * (127 / amax)),
           in float32, rounding half to even; x_i becomes d * q_i (0 where amax is 0, or so
           small, below 127 / FLT_MAX ~ 3.7e-37, that 127 / amax overflows)
    bf16   (bf16 matrices) each x_i rounded to float32, then to the nearest bfloat16 (ties to
           even), so that a kernel can multiply bf16 pairs (AVX512_BF16's vdpbf16ps); as
           that instruction does, float32 subnormals count as zero, in x and in W

``round_inputs`` is that rounding, the oracle's own; the kernels and the C reference have
theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QBLOCK = 32                                  # inputs per block of the blocked formats
BLOCK_BYTES = {"int8": 2 + QBLOCK, "int4": 2 + QBLOCK // 2}
FORMATS = ("fp32", "bf16", "int8", "int4")   # what quantize takes; float64 weights are "fp64"
STORED = ("bf16", "int8", "int4")            # the formats a QuantizedMatrix holds
DOTS = {"bf16": ("fp32", "bf16"), "int8": ("fp32", "int8"), "int4": ("fp32", "int8")}   # by format


def check_format(fmt, name: str = "format") -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"{name} must be a str, one of {FORMATS}, got {type(fmt).__name__}")
    if fmt not in FORMATS:
        raise ValueError(f"{name} must be one of {FORMATS}, got {fmt!r}")
    return fmt


def check_dot(dot, fmt: str, name: str = "dot") -> str:
    """``dot`` if a product with ``fmt`` weights can be computed that way (DOTS), else an error."""
    allowed = DOTS.get(fmt, ("fp32",))
    if not isinstance(dot, str):
        raise TypeError(f"{name} must be a str, one of {allowed}, got {type(dot).__name__}")
    if dot not in allowed:
        raise ValueError(f"{name} must be one of {allowed} for {fmt} weights, got {dot!r}")
    return dot


@dataclass(frozen=True, eq=False)
class QuantizedMatrix:
    """A (d_in, d_out) weight matrix held in a stored format (bf16, int8, int4)."""
    format: str
    shape: tuple                 # (d_in, d_out): the matrix X is multiplied by
    data: np.ndarray             # the stored rows, one per output feature (module docstring)
    dot: str = "fp32"            # how x @ W is computed (module docstring)

    def __post_init__(self):
        check_format(self.format)
        if self.format not in STORED:
            raise ValueError(f"a QuantizedMatrix holds one of {STORED}, got {self.format!r}")
        check_dot(self.dot, self.format)
        shape = tuple(self.shape)
        if len(shape) != 2 or not all(isinstance(n, (int, np.integer)) and n >= 1 for n in shape):
            raise ValueError(f"shape must be (d_in, d_out) of positive ints, got {self.shape!r}")
        shape = (int(shape[0]), int(shape[1]))
        want = stored_shape(self.format, shape)
        dtype = np.uint16 if self.format == "bf16" else np.uint8
        data = self.data
        if not isinstance(data, np.ndarray) or data.dtype != dtype or data.shape != want:
            got = (f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__)
            raise ValueError(f"{self.format} data of a {shape} matrix must be {np.dtype(dtype)} {want}, got {got}")
        if self.format == "bf16":
            if ((data & 0x7F80) == 0x7F80).any():
                raise ValueError("bf16 data holds a value that is not finite (a NaN or an Inf)")
        else:
            scales = data.reshape(-1, BLOCK_BYTES[self.format])[:, :2].copy().view("<f2")
            if not np.isfinite(scales).all():
                raise ValueError(f"{self.format} data holds a scale that is not finite (a NaN or an Inf)")
        # a private read-only copy: what backends prepared from it can never go stale
        frozen = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=dtype).reshape(want)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "data", frozen)

    def __reduce__(self):
        return type(self), (self.format, self.shape, self.data, self.dot)

    @property
    def nbytes(self) -> int:
        """The stored bytes (what a GEMV over this matrix reads)."""
        return self.data.nbytes

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        """W (d_in, d_out) as ``dtype``: exact (every stored value is a float32)."""
        return dequantize(self.format, self.data, self.shape).astype(dtype, copy=False)


def stored_shape(fmt: str, shape: tuple) -> tuple:
    """The stored array's shape for a (d_in, d_out) matrix, or ValueError."""
    d_in, d_out = shape
    if fmt == "bf16":
        return (d_out, d_in)
    if d_in % QBLOCK:
        raise ValueError(f"{fmt} stores blocks of {QBLOCK} inputs: the matrix's input dimension must be "
                         f"a multiple of {QBLOCK}, got {d_in} (shape {shape})")
    return (d_out, d_in // QBLOCK * BLOCK_BYTES[fmt])


def quantize_matrix(W: np.ndarray, fmt: str, name: str = "W", dot: str = "fp32") -> QuantizedMatrix:
    """W (d_in, d_out), finite float32 or float64, in format ``fmt`` (one of STORED), its
    products computed as ``dot`` says.  float64 is first rounded to float32, as a converter
    writing float32 would."""
    check_format(fmt)
    if fmt not in STORED:
        raise ValueError(f"quantize_matrix takes one of {STORED}, got {fmt!r}")
    check_dot(dot, fmt)
    W = np.asarray(W)
    if W.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {W.shape}")
    stored_shape(fmt, W.shape)              # refuses a d_in the blocks do not divide
    X = np.ascontiguousarray(W.T, dtype=np.float32)     # (d_out, d_in): one row per output
    if fmt == "bf16":
        data = _to_bf16(X, name)
    elif fmt == "int8":
        data = _q8_0(X)
    else:
        data = _q4_0(X)
    return QuantizedMatrix(fmt, W.shape, data, dot)


def _to_bf16(X: np.ndarray, name: str) -> np.ndarray:
    u = X.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)    # round to nearest, ties to even
    if ((r & 0x7F80) == 0x7F80).any():
        raise ValueError(f"{name} holds a value too large for bf16 (it would round to an Inf)")
    return r


def _scales(amax: np.ndarray, divisor: float) -> tuple[np.ndarray, np.ndarray]:
    """(d, 1/d or 0) per block in float32, d as the block stores it."""
    d = (amax / np.float32(divisor)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    with np.errstate(over="ignore"):
        too_large = not np.isfinite(d.astype(np.float16)).all()
    if too_large:
        limit = 65504 * abs(divisor)
        raise ValueError(f"a block's scale does not fit float16: a weight's magnitude is above {limit:.3g}")
    return d, inv


def _q8_0(X: np.ndarray) -> np.ndarray:
    rows, d_in = X.shape
    x = X.reshape(rows, d_in // QBLOCK, QBLOCK)
    d, inv = _scales(np.abs(x).max(axis=2), 127.0)
    v = x * inv[..., None]
    # C's roundf (half away from zero); the + 0.5 in float64 is exact, where float32's would
    # round 0.5 - 2^-25 up to 1
    q = (np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5)).astype(np.int8)
    out = np.empty((rows, d_in // QBLOCK, BLOCK_BYTES["int8"]), np.uint8)
    out[..., :2] = d.astype("<f2")[..., None].view(np.uint8)
    out[..., 2:] = q.view(np.uint8)
    return out.reshape(rows, -1)


def _q4_0(X: np.ndarray) -> np.ndarray:
    rows, d_in = X.shape
    x = X.reshape(rows, d_in // QBLOCK, QBLOCK)
    # the signed value of largest magnitude (the first one on a tie) maps to -8
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=2)[..., None], axis=2)[..., 0]
    d, inv = _scales(peak, -8.0)
    q = np.minimum(15, np.trunc(x * inv[..., None] + np.float32(8.5))).astype(np.uint8)
    out = np.empty((rows, d_in // QBLOCK, BLOCK_BYTES["int4"]), np.uint8)
    out[..., :2] = d.astype("<f2")[..., None].view(np.uint8)
    out[..., 2:] = q[..., :QBLOCK // 2] | (q[..., QBLOCK // 2:] << 4)
    return out.reshape(rows, -1)


def dequantize(fmt: str, data: np.ndarray, shape: tuple) -> np.ndarray:
    """The float32 (d_in, d_out) matrix the stored ``data`` holds (exact)."""
    d_in, d_out = shape
    if fmt == "bf16":
        return (data.astype(np.uint32) << 16).view(np.float32).T
    blocks = data.reshape(d_out, d_in // QBLOCK, BLOCK_BYTES[fmt])
    d = blocks[..., :2].copy().view("<f2")[..., 0].astype(np.float32)        # (d_out, nblocks)
    if fmt == "int8":
        q = blocks[..., 2:].view(np.int8).astype(np.float32)
    else:
        packed = blocks[..., 2:]
        q = np.concatenate([packed & 0x0F, packed >> 4], axis=2).astype(np.float32) - 8
    return (q * d[..., None]).reshape(d_out, d_in).T



def round_inputs(X: np.ndarray, dot: str) -> np.ndarray:
    """The rows of X (..., d_in) as a product computed as ``dot`` takes them, in X's dtype:
    X itself for "fp32"; for "bf16", each value rounded to float32 and then to bf16; for
    "int8", each row rounded to float32 and then to int8 in blocks of 32 (module docstring),
    so that d * q is exact in float32 and float64."""
    if dot == "fp32":
        return X
    if dot == "bf16":
        x = flush_subnormals(np.asarray(X, np.float32))
        u = x.view(np.uint32)
        return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) & np.uint32(0xFFFF0000)).view(np.float32).astype(X.dtype)
    x = np.asarray(X, np.float32).reshape(*X.shape[:-1], X.shape[-1] // QBLOCK, QBLOCK)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", over="ignore"):
        scale = np.float32(127) / amax                      # inf where amax is 0 or below 127 / FLT_MAX
    keep = np.isfinite(scale)
    d = np.where(keep, amax / np.float32(127), np.float32(0)).astype(np.float32)
    q = np.rint(x * np.where(keep, scale, np.float32(0)))   # float32, ties to even
    return (q.astype(X.dtype) * d.astype(X.dtype)).reshape(X.shape)


def flush_subnormals(A: np.ndarray) -> np.ndarray:
    """A with its float32 subnormals (0 < |a| < 2**-126) as zeros of their sign: what dot
    "bf16" multiplies (vdpbf16ps reads subnormal operands as zero)."""
    tiny = np.finfo(np.float32).tiny
    return np.where(np.abs(A) < tiny, A * 0, A)
