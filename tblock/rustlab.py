"""The course's random generator, bit for bit: rustlab's ``seed(s); randn(r, c)``.

The lesson's numbers were drawn by rustlab (kreegerresearch/rustlab), whose script RNG
(``crates/rustlab-script/src/eval/rng.rs``) is rand 0.8.5's ``StdRng`` seeded with
``StdRng::seed_from_u64(s)``, and whose ``randn`` samples rand_distr 0.4.3's
``Normal::new(0.0, 1.0)`` once per entry, row after row. Three pieces, each written here
from those crates' sources (rand_core 0.6.4, rand_chacha 0.3.1, rand_distr 0.4.3):

    seed_key        seed_from_u64: a PCG32 run fills the 32-byte ChaCha key
    chacha_blocks   StdRng = ChaCha12 with a 64-bit block counter and a zero stream id;
                    its u64s are the keystream's u32 words taken in pairs, low word first
    Rng.randn       the ZIGNOR ziggurat (256 layers): one u64 per sample on the fast path,
                    extra u64s, in stream order, for the wedge and tail rejections

    >>> Rng(13).randn(4, 8)      # the lesson's H_in (seed(13); H_in = randn(T, d_model))
"""

from __future__ import annotations

import math
import struct
from decimal import Context, Decimal

import numpy as np

U64 = (1 << 64) - 1
U32 = (1 << 32) - 1

# ---------------------------------------------------------------------------------------
# seed_from_u64: PCG32 (rand_core 0.6.4, SeedableRng's provided method)
# ---------------------------------------------------------------------------------------

PCG_MUL = 6364136223846793005
PCG_INC = 11634580027462260723


def seed_key(seed: int) -> np.ndarray:
    """The eight u32 key words ``StdRng::seed_from_u64(seed)`` hands to ChaCha, (8,) uint32.

    Each word is one PCG32 output: advance the 64-bit LCG first (so a seed of low Hamming
    weight is moved away from), then xorshift-and-rotate its high bits; the 4 little-endian
    bytes of each output fill the key in order, so key word k is output k."""
    state, words = seed, []
    for _ in range(8):
        state = (state * PCG_MUL + PCG_INC) & U64
        xorshifted = (((state >> 18) ^ state) >> 27) & U32
        rot = state >> 59
        words.append(((xorshifted >> rot) | (xorshifted << (-rot & 31))) & U32)
    return np.array(words, dtype=np.uint32)


# ---------------------------------------------------------------------------------------
# ChaCha12 keystream (rand_chacha 0.3.1), many blocks at once
# ---------------------------------------------------------------------------------------

CHACHA_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)   # "expand 32-byte k"
CHACHA12_DOUBLE_ROUNDS = 6


def _rotl(x, n, tmp):
    # x <<<= n in place on uint32 words (NumPy has no rotate); tmp is scratch of x's shape
    np.right_shift(x, 32 - n, out=tmp)
    np.left_shift(x, n, out=x)
    np.bitwise_or(x, tmp, out=x)


def _quarter_round(a, b, c, d, tmp):
    # four lanes of the state at once: each of a, b, c, d is (4, n_blocks)
    a += b; d ^= a; _rotl(d, 16, tmp)
    c += d; b ^= c; _rotl(b, 12, tmp)
    a += b; d ^= a; _rotl(d, 8, tmp)
    c += d; b ^= c; _rotl(b, 7, tmp)


def chacha_blocks(key: np.ndarray, first_block: int, n_blocks: int,
                  double_rounds: int = CHACHA12_DOUBLE_ROUNDS) -> np.ndarray:
    """ChaCha keystream blocks ``first_block .. first_block + n_blocks - 1`` for ``key``
    (8 uint32) with stream id 0, as (n_blocks * 16,) uint32 words in output order.

    Words 12 and 13 of the state hold the 64-bit block counter (low, high), words 14 and 15
    the stream id, as rand_chacha lays them out. rand_chacha computes 4 blocks per refill;
    the words come out in the same order whatever the batch, so the batch here is free."""
    counter = np.arange(first_block, first_block + n_blocks, dtype=np.uint64)
    init = np.empty((16, n_blocks), dtype=np.uint32)        # (16 state words, n_blocks)
    init[0:4] = np.array(CHACHA_CONSTANTS, dtype=np.uint32)[:, None]
    init[4:12] = key[:, None]
    init[12] = (counter & np.uint64(U32)).astype(np.uint32)
    init[13] = (counter >> np.uint64(32)).astype(np.uint32)
    init[14:16] = 0
    x = init.copy()
    rows = x.reshape(4, 4, n_blocks)                        # (a, b, c, d rows, 4 lanes, n_blocks)
    tmp = np.empty((4, n_blocks), dtype=np.uint32)
    diag = [np.roll(np.arange(4), -r) for r in range(4)]    # row r's lane j pairs with column j + r
    with np.errstate(over="ignore"):                        # the additions wrap mod 2**32 by design
        for _ in range(double_rounds):
            _quarter_round(rows[0], rows[1], rows[2], rows[3], tmp)         # columns
            b, c, d = rows[1][diag[1]], rows[2][diag[2]], rows[3][diag[3]]  # diagonals as columns
            _quarter_round(rows[0], b, c, d, tmp)
            rows[1][diag[1]], rows[2][diag[2]], rows[3][diag[3]] = b, c, d
        x += init
    return x.T.reshape(-1)                                  # (n_blocks * 16,): block after block


# ---------------------------------------------------------------------------------------
# The ziggurat tables of rand_distr 0.4.3 (ZIG_NORM_R, ZIG_NORM_X, ZIG_NORM_F)
# ---------------------------------------------------------------------------------------

ZIG_LAYERS = 256
ZIG_NORM_R = 3.6541528853610088       # the base strip's edge R (Doornik's 256-layer dR)
ZIG_NORM_V = 0.00492867323399         # each layer's area V (Doornik's dV), as the crate's script


def _exact(f):
    # exp / log rounded once to the nearest double: the crate's table was made with a libm that
    # rounds them correctly (glibc's exp misses F[94] by one ulp), so 40 digits, then one rounding
    ctx = Context(prec=40)
    return lambda a: float(getattr(ctx, f)(Decimal(a)))


def ziggurat_tables() -> tuple[np.ndarray, np.ndarray]:
    """(X, F), each (257,): the layer edges x_i of the N(0, 1) ziggurat and f(x_i) = exp(-x_i^2/2).

    Doornik's recurrence: x_0 = V / f(R) (the base strip's equivalent width), x_1 = R,
    x_i = f^-1(V / x_{i-1} + f(x_{i-1})) up to x_255, and x_256 = 0. The crate ships the
    values printed with 18 decimals and read back, which rounds the small F entries again;
    the same round trip here gives the crate's 514 doubles exactly (tests check them)."""
    exp, log = _exact("exp"), _exact("ln")

    def f(x):                                               # the density, unnormalised
        return exp(-x * x / 2.0)

    def f_inv(y):
        return math.sqrt(-2.0 * log(y))

    def as_shipped(v):                                      # the crate's '%.18f' text, read back
        return float(f"{v:.18f}")

    x = [0.0] * (ZIG_LAYERS + 1)
    x[0], x[1] = ZIG_NORM_V / f(ZIG_NORM_R), ZIG_NORM_R
    for i in range(2, ZIG_LAYERS):
        x[i] = f_inv(ZIG_NORM_V / x[i - 1] + f(x[i - 1]))
    return (np.array([as_shipped(v) for v in x]), np.array([as_shipped(f(v)) for v in x]))


ZIG_X, ZIG_F = ziggurat_tables()

# ---------------------------------------------------------------------------------------
# u64 -> f64 conversions of rand 0.8.5, and the ziggurat's pieces
# ---------------------------------------------------------------------------------------

EXPONENT_1 = 1024 << 52               # biased exponent of 2**1: 52 fraction bits make [2, 4)
EXPONENT_0 = 1023 << 52               # biased exponent of 2**0: [1, 2)
OPEN01_SHIFT = 1.0 - 2.0 ** -53       # rand's 1.0 - f64::EPSILON / 2, exactly representable


def _f64(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def _open01(bits: int) -> float:
    # rand's Open01 f64: the top 52 bits as a fraction of [1, 2), minus 1 - 2**-53: in (0, 1)
    return _f64((bits >> 12) | EXPONENT_0) - OPEN01_SHIFT


def _tail(u: float, draw) -> float:
    """A sample beyond the base strip's edge R (Marsaglia's method), signed like u; ``draw()``
    gives the next u64. Each try reads x's u64, then y's."""
    x, y = 1.0, 0.0
    while -2.0 * y < x * x:
        x = math.log(_open01(draw())) / ZIG_NORM_R
        y = math.log(_open01(draw()))
    return x - ZIG_NORM_R if u < 0.0 else ZIG_NORM_R - x


class _OutOfBits(Exception):
    """A try needs u64s beyond the ones buffered for this batch."""


def _layer_and_point(bits):
    """Each u64 as the start of a ziggurat try: its layer i (the low 8 bits) and u in [-1, 1)
    (the high 52 bits as the fraction of a float in [2, 4), minus 3); rand_distr's ziggurat."""
    layer = (bits & np.uint64(0xFF)).astype(np.intp)
    u = ((bits >> np.uint64(12)) | np.uint64(EXPONENT_1)).view(np.float64) - 3.0
    return layer, u


def _wedge_accepts(layer, x, bits):
    """The wedge test of tries at ``layer`` with point ``x``, their uniform from ``bits`` (the
    next u64 of each): f(x_{i+1}) + U (f(x_i) - f(x_{i+1})) < exp(-x^2 / 2), U = rand's
    Standard f64 (the top 53 bits times 2**-53). Rust's exp is the C library's; NumPy's may
    differ from it by an ulp, so the near ties are decided again with math.exp."""
    uniform = (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    lhs = ZIG_F[layer + 1] + (ZIG_F[layer] - ZIG_F[layer + 1]) * uniform
    pdf = np.exp(-x * x / 2.0)
    for k in np.flatnonzero(np.abs(lhs - pdf) <= 4 * np.finfo(np.float64).eps * pdf):
        pdf[k] = math.exp(-x[k] * x[k] / 2.0)
    return lhs < pdf


# ---------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------

CHACHA_BATCH = 4096                   # blocks per ChaCha call: its 16 word rows stay in cache


class Rng:
    """rustlab's generator after ``seed(seed)``: ``Rng(13).randn(4, 8)`` is ``seed(13);
    randn(4, 8)``, and successive calls continue one stream, as successive randn calls do."""

    def __init__(self, seed: int):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be a non-negative integer (rustlab's seed(N)), got "
                            f"{type(seed).__name__} {seed!r}")
        if not 0 <= seed <= U64:
            raise ValueError(f"seed must be in [0, 2**64) (rustlab's seed(N) takes a u64), got {seed}")
        self.seed = int(seed)
        self._key = seed_key(self.seed)
        self._next_block = 0                                # ChaCha block counter of the next refill
        self._buf = np.empty(0, dtype=np.uint64)            # keystream u64s made, from _buf_start on
        self._buf_start = 0                                 # stream index of _buf[0]
        self._pos = 0                                       # next unused index into _buf

    # --- the u64 stream: rand_core's BlockRng::next_u64 over ChaCha12's u32 words ---

    def _ensure(self, n: int) -> None:
        # at least n unused u64s in _buf, made in whole 4-block refills as StdRng makes them
        have = len(self._buf) - self._pos
        if have >= n:
            return
        n_blocks = 4 * -(-(n - have) // 32)                 # 8 u64s per block, 4 blocks per refill
        words = np.concatenate([chacha_blocks(self._key, self._next_block + b, min(CHACHA_BATCH, n_blocks - b))
                                for b in range(0, n_blocks, CHACHA_BATCH)])
        self._next_block += n_blocks
        # a u64 is two consecutive u32 words, the low one first (randn reads only u64s, so
        # BlockRng never splits one across two refills): little-endian words as little-endian u64s
        fresh = words.astype("<u4").view("<u8").astype(np.uint64)
        self._buf_start += self._pos
        self._buf = np.concatenate([self._buf[self._pos:], fresh])
        self._pos = 0

    @property
    def u64s_drawn(self) -> int:
        """How many u64s the stream has handed out since the seed."""
        return self._buf_start + self._pos

    def next_u64(self) -> int:
        """The next u64 of the stream, as ``RngCore::next_u64``."""
        self._ensure(1)
        self._pos += 1
        return int(self._buf[self._pos - 1])

    def _uniform53(self) -> float:
        # rand's Standard f64: the top 53 bits times 2**-53, in [0, 1)
        return (self.next_u64() >> 11) * 2.0 ** -53

    # --- StandardNormal: rand_distr 0.4.3's ziggurat ---

    def normal(self) -> float:
        """One N(0, 1) sample (rustlab's ``randn()``), the ziggurat loop written out one try
        at a time; ``standard_normal`` is the same stream, vectorised."""
        while True:
            bits = self.next_u64()
            i = bits & 0xFF                                 # the low 8 bits pick the layer
            u = _f64((bits >> 12) | EXPONENT_1) - 3.0       # the high 52 the point, in [-1, 1)
            x = u * float(ZIG_X[i])
            if abs(x) < ZIG_X[i + 1]:
                return x                                    # inside the layer's rectangle
            if i == 0:
                return _tail(u, self.next_u64)               # the base strip's tail
            f1, f0 = float(ZIG_F[i + 1]), float(ZIG_F[i])
            if f1 + (f0 - f1) * self._uniform53() < math.exp(-x * x / 2.0):
                return x                                    # under the density in the wedge
            # rejected: the next try starts from a fresh u64

    def standard_normal(self, n: int) -> np.ndarray:
        """The next ``n`` N(0, 1) samples, (n,) float64, in stream order."""
        n = _count("n", n)
        parts, left = [], n
        need = n + n // 16 + 64                             # ~2% of tries miss, each reads >= 1 more u64
        while left > 0:
            self._ensure(need)
            got = self._normal_batch(left)
            parts.append(got)
            left -= len(got)
            # no sample: the first try's draws run past the buffer, so buffer more
            need = left + left // 16 + 64 if len(got) else 2 * (len(self._buf) - self._pos) + 64
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)

    def _normal_batch(self, want: int) -> np.ndarray:
        """Up to ``want`` samples from the buffered u64s, the stream left just after the last.

        Every u64 is scored as if a try started there (its fast-path result and, for a miss,
        its wedge test with the following u64). Only the misses need a walk in order: a try
        that misses reads the next u64 (the wedge) or a run of them (the tail), and those are
        then not tries; a rejected try's sample is the next try's."""
        bits = self._buf[self._pos:]                        # (m,) u64
        m = len(bits)
        layer, u = _layer_and_point(bits)
        value = u * ZIG_X[layer]                            # (m,) each try's x
        fast = np.abs(value) < ZIG_X[layer + 1]
        miss = np.flatnonzero(~fast[:-1])                   # tries whose wedge u64 is buffered
        accept = fast.copy()                                # does a try at this u64 give a sample
        accept[miss] = _wedge_accepts(layer[miss], value[miss], bits[miss + 1])
        is_try = np.ones(m, dtype=bool)
        ends = {}                                           # a tail try's position -> one past its draws
        busy, stop = 0, m                                   # busy: first u64 not read by an earlier try
        for s in np.flatnonzero(~fast).tolist():
            if s < busy:
                continue                                    # an extra draw of an earlier try
            if s + 1 >= m:
                stop = s                                    # its extra draws are not buffered yet
                break
            if layer[s] == 0:                               # the tail: a scalar loop, rare (~1 in 4000)
                try:
                    value[s], end = _tail_in(bits, s, float(u[s]))
                except _OutOfBits:
                    stop = s
                    break
                accept[s], ends[s] = True, end
                is_try[s + 1:end] = False
                busy = end
            else:
                is_try[s + 1] = False
                busy = s + 2
        taken = np.flatnonzero(accept[:stop] & is_try[:stop])[:want]
        if len(taken) == want and want > 0:
            q = int(taken[-1])                              # the last sample's try
            stop = q + 1 if fast[q] else ends.get(q, q + 2)
        self._pos += stop
        return value[taken]

    def randn(self, rows: int, cols: int) -> np.ndarray:
        """rustlab's ``randn(rows, cols)``: (rows, cols) float64 N(0, 1), filled row by row
        (``Array2::from_shape_vec((m, n), data)`` of the samples in draw order)."""
        rows, cols = _count("rows", rows), _count("cols", cols)
        return self.standard_normal(rows * cols).reshape(rows, cols)   # (rows * cols,) -> row-major


def _tail_in(bits, s, u):
    # the tail of the try at bits[s], drawing from bits[s + 1:]: (its sample, one past its draws)
    k = s + 1

    def draw():
        nonlocal k
        if k >= len(bits):
            raise _OutOfBits
        k += 1
        return int(bits[k - 1])
    return _tail(u, draw), k


def _count(name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a non-negative integer, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value}")
    return int(value)
