"""The records kernel calls pass: a few named tuples in place of dozens of positional arguments.

Numba compiles a named tuple to a struct of its fields and passes a struct argument as
its fields, so a record costs what its fields cost as arguments, and ``rec.field`` is a
register.  A record is built where its fields are known and handed down unchanged; each
is built with the same field types everywhere (ints, bools, floats, and arrays of one
kind), so that a kernel is compiled once per dtype.  Records of arrays carry borrowed
views (options.borrowed), whose reference counts cost nothing.

Entry points called from Python take plain tuples in the same field order instead, and
build the records inside: Numba's dispatcher types a plain tuple in C but a named one in
Python, a per-call cost a small block would show.

The GEMM's operands (gemm):

    Rows(off, ld)            a row-major matrix in a flat array: (i, j) at off + i*ld + j
    Panels(off, ld, k, n)    a packed (k, n) matrix (gemm.pack_b's panels of NR columns):
                             row r of panel p at off + p*ld + r*NR
    Tile(i0, i1, p0, p1)     rows i0:i1 by the column panels p0:p1 of a GEMM's C
    Pairs(x, p, ld, r0)      a GEMM's A as float rows x (addressed by a Rows), and rows r0..
                             of them already rounded to bf16 pairs in p (uint32, ld apart:
                             bgemm.pack_pairs), for a product over bf16 pair panels; p
                             empty: not rounded, the product rounds x's rows itself

One head's attention (attention):

    Att(q0, q1, keys, dk, causal, scale, bk)   queries q0:q1 over keys 0:keys (causal:
                             query t sees keys <= t), head size dk, scores scaled by
                             scale, key tiles of bk
    KV(kt, v, ldv)           where a head's K^T panels (Kt[kt:]) and V rows (V[v:], ldv
                             apart) start
    FlashWork(Qt, S, O, mrow, lrow)   a query tile's scratch (attention.flash_rows)

A block's weights (wgemm): the flat float array of weight_layout, or

    Stored(f, q, map, dot)   matrices in a stored format (tblock.formats): f the float
                             vectors (weight_layout's first o_qkv elements), q the six
                             stored matrices one after another (its dtype says the
                             format), map (12,) intp: each matrix's offset in the float
                             layout, then in q; dot, an empty array whose dtype says how
                             products are computed: float32 (dot "fp32"), int8 (dot
                             "int8": inputs rounded to int8 blocks, kernels.qdot) or
                             uint16 (dot "bf16": q holds bf16 pair panels, uint32,
                             multiplied by kernels.bgemm)

A block call (stages, block):

    Dims(T, d, n_heads, dff, causal, pre_ln, act, eps, kv_heads, rms, gated,
         rope_theta, rope_scale)   the block's config and the call's sequence length T:
                             kv_heads K/V heads (query head h reads K/V head h // group),
                             rms RMSNorm for LayerNorm, gated the gated FFN ([gate | up]
                             panels, layout.ffn_cols), rope_theta > 0 rotary positions
                             with positions divided by rope_scale.  gated and rope_theta
                             are None for a block without that part (rms stays a
                             runtime bool; None where no norm runs): Dims is then of
                             another type, its build another, and that build compiles
                             none of the part's kernels (with_part)
    Grid(nthr, mc, groups)   threads, and how a GEMM stage splits (layout.stage_grid)
    Cache(K, V, past, max_T, seqs)   the keys and values attention reads: packed K^T
                             and V for max_T tokens a head, past of them there before
                             this call; their dtype says the cache's format (float: fp32;
                             uint16: bf16; int8: int8, its scales beside: kernels.kvstore).
                             seqs (2n,) intp: empty, or a ragged decode step's pairs
                             [slot, past] (call sequence b is the cache's sequence
                             seqs[2b] after its seqs[2b + 1] tokens; past their largest:
                             stages.seq_at)
    Scratch(plan, work, slot, dest, rope)   the stage plan, a work buffer (or empty), which
                             of its two output buffers to use, the output's place (or
                             empty), the rotary table of the call's rows (rotary.rope_table;
                             empty without rotary positions)
    Attend(...), Output(...) the buffers of the block's two halves (below)
"""

from __future__ import annotations

import functools
import inspect
from collections import namedtuple

from numba.core import types
from numba.extending import overload

Rows = namedtuple("Rows", "off ld")
Panels = namedtuple("Panels", "off ld k n")
Tile = namedtuple("Tile", "i0 i1 p0 p1")
Pairs = namedtuple("Pairs", "x p ld r0")

Stored = namedtuple("Stored", "f q map dot")

Att = namedtuple("Att", "q0 q1 keys dk causal scale bk")
KV = namedtuple("KV", "kt v ldv")
FlashWork = namedtuple("FlashWork", "Qt S O mrow lrow")

Dims = namedtuple("Dims", "T d n_heads dff causal pre_ln act eps kv_heads rms gated rope_theta rope_scale")
Grid = namedtuple("Grid", "nthr mc groups")
Cache = namedtuple("Cache", "K V past max_T seqs")
Scratch = namedtuple("Scratch", "plan work slot dest rope")

# The attention half (stages 1-2): X, the projection's input (H, or LN1 of it); ln, whether
# each projection task computes LN1 of its rows itself; q, Q rows of stride ldq (with K and
# V beside them when not packed); kt, vp, K^T and V packed per head when packed; srow,
# float64 scratch of the untiled attention; work, w_pos, the attention tasks' tiles; rope, the
# rotary table (Scratch's); xp, X's rows as bf16 pairs (wgemm.pair_rows; empty: none).
Attend = namedtuple("Attend", "X ln q ldq kt vp packed srow work w_pos rope xp")
# The output half (stages 3-4): q (ldq), the heads' outputs; out, the block's output; xn,
# the FFN's input and hid (ldh) its hidden layer when the FFN is split by columns; mf, rows
# per FFN task when it is not; gu, the gated FFN's [gate | up] panels of the split stages
# (rows, ffn_cols), empty otherwise; xnp, hidp, xn's and hid's rows as bf16 pairs
# (wgemm.pair_rows; empty: none).
Output = namedtuple("Output", "q ldq out xn hid ldh mf gu xnp hidp")


def present(rec, name) -> bool:
    """At typing time: whether field ``name`` of a record's Numba type is not None, a part
    the block has (Dims' gated, rope_theta)."""
    return not isinstance(rec.types[rec.fields.index(name)], types.NoneType)


def with_part(part, absent=None):
    """Decorator of a function of the block's parts whose argument ``dims`` is a Dims:
    compiled code calls it where dims' field ``part`` is not None, and ``absent`` (the
    same parameters; None: a function that does nothing) where it is None.  So the
    function's body, which calls the part's kernels, is never typed in the build of a
    block without the part, and that build compiles none of them."""
    def wrap(fn):
        names = list(inspect.signature(fn).parameters)
        at = names.index("dims")
        # Numba wants an implementation's parameters named as the function's
        skip = absent or eval(f"lambda {', '.join(names)}: None")

        @functools.wraps(fn)           # the signature Numba checks implementations against
        def choose(*args):
            return fn if present(args[at], part) else skip
        overload(fn, inline="always")(choose)
        return fn
    return wrap
