#!/usr/bin/env python3
"""The bf16 GEMM (kernels.bgemm) against the float32 GEMM (kernels.gemm) at a prefill's
shapes: GPT-2 small's four projections, M rows of tokens.

    python bench/bench_bgemm.py                     # M = 64, 128, 512; 2 threads
    python bench/bench_bgemm.py --rows 512 --rounds 9 --json bgemm.json

Both run the same task split (layout.stage_grid, as the block's projections) on the same
threads: bgemm.bgemm_rows over the packed bf16 panels, and a driver of gemm.gemm_block over
float32 panels of the same (bf16-valued) matrix.  Each is checked against float64 first
(its own rounding of A: bf16 for bgemm, none for fp32), to (K + 2) 2^-24 of sum |a w|.

The peaks are measured, not assumed: a loop of independent register-only multiply-adds
(panel vectors of fp32 FMAs; of pair dots, vdpbf16ps where the path has it) on every
thread.  The clock they imply is printed for Zen 4's rates (one zmm FMA and one zmm
vdpbf16ps per cycle and core: 32 and 64 FLOP/cycle).  Times are medians over rounds, rates
from the best round; nothing is asserted about speed.  The load average is printed beside
the results: on shared cores, timings are indicative only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numba
import numpy as np
from common import add_json, finish, int_list, machine_line, machine_record, positive_int
from numba import njit, prange

from tblock.formats import quantize_matrix
from tblock.kernels.bgemm import BF16_DOT, NR, bf16_packed_size, bgemm_rows, pack_bf16_panels, pair_dot, pair_load
from tblock.kernels.gemm import gemm_block, pack_b, packed_size
from tblock.kernels.layout import panels, stage_grid, task_tile
from tblock.kernels.records import Panels, Rows
from tblock.kernels.simd import panel_lanes, pbcast, pload, psplat, vadd, vfma, vhsum
from tblock.kernels.tiles import MC

SHAPES = ((768, 2304), (768, 768), (768, 3072), (3072, 768))     # (K, N): QKV, W_O, W_1, W_2


@njit(parallel=True, cache=False)
def fp32_rows(A, a, Bp, b, C, c, rows, nthr):
    """The float32 GEMM with bgemm_rows' task split."""
    a, b, c = Rows(a[0], a[1]), Panels(b[0], b[1], b[2], b[3]), Rows(c[0], c[1])
    npn = panels(b.n, panel_lanes(Bp))
    mc, groups, ntasks = stage_grid(rows, npn, MC, nthr, 1)
    for t in prange(ntasks):
        gemm_block(A, a, Bp, b, C, c, task_tile(t, groups, mc, rows, npn), False, -1)


@njit(parallel=True, cache=False)
def fma_peak(x, iters, out):
    """len(out) threads of 6 independent panel-vector FMA chains (24 zmm on avx512)."""
    for t in prange(out.size):
        b = pload(x, 0)
        a = pbcast(x, 1)
        c0 = c1 = c2 = c3 = c4 = c5 = psplat(x, 0.0)
        for _ in range(iters):
            c0 = vfma(a, b, c0)
            c1 = vfma(a, b, c1)
            c2 = vfma(a, b, c2)
            c3 = vfma(a, b, c3)
            c4 = vfma(a, b, c4)
            c5 = vfma(a, b, c5)
        out[t] = vhsum(vadd(vadd(vadd(c0, c1), vadd(c2, c3)), vadd(c4, c5)))


@njit(parallel=True, cache=False)
def dot_peak(x, p, iters, out):
    """As fma_peak, with pair dots (vdpbf16ps where the path has it)."""
    for t in prange(out.size):
        b = pair_load(p, 0)
        c0 = c1 = c2 = c3 = c4 = c5 = psplat(x, 0.0)
        for _ in range(iters):
            c0 = pair_dot(c0, b, p, 0)
            c1 = pair_dot(c1, b, p, 1)
            c2 = pair_dot(c2, b, p, 2)
            c3 = pair_dot(c3, b, p, 3)
            c4 = pair_dot(c4, b, p, 4)
            c5 = pair_dot(c5, b, p, 5)
        out[t] = vhsum(vadd(vadd(vadd(c0, c1), vadd(c2, c3)), vadd(c4, c5)))


def peaks(nthr: int, iters: int = 4_000_000) -> tuple[float, float]:
    """Measured GFLOP/s of fma_peak and dot_peak on nthr threads (best of 9: other work
    on the cores only ever slows a round)."""
    x = np.full(2 * NR, 1e-30, np.float32)
    p = np.full(2 * NR, 0x00010001, np.uint32)            # tiny bf16 pairs: no overflow
    out = np.zeros(nthr, np.float32)
    fma_peak(x, 10, out)
    dot_peak(x, p, 10, out)
    res = []
    for fn, args, flop in ((fma_peak, (x,), 6 * NR * 2), (dot_peak, (x, p), 6 * NR * 4)):
        best = min(_time(lambda: fn(*args, iters, out)) for _ in range(9))
        res.append(nthr * iters * flop / best / 1e9)
    return res[0], res[1]


def _time(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def bound_check(name, C, Ar, Wd, K):
    """|C - Ar @ Wd| <= (K + 2) 2^-24 sum |a w| (tests/test_bgemm.py's bound, bias-free)."""
    ref = Ar.astype(np.float64) @ Wd
    scale = np.abs(Ar).astype(np.float64) @ np.abs(Wd)
    err = (np.abs(C - ref) / np.maximum(scale, 1e-300)).max()
    if not err <= (K + 2) * 2.0 ** -24:
        raise SystemExit(f"{name}: error {err:.2e} of sum |a w| exceeds the bound {(K + 2) * 2.0 ** -24:.2e}")


def to_bf16(A):
    """A rounded to bf16 as bgemm rounds it (nearest even; subnormals to 0), as float32."""
    u = A.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    r[(u & 0x7F800000) == 0] &= 0x80000000
    return r.view(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int_list, default=[64, 128, 512], help="M values (default 64,128,512)")
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--rounds", type=positive_int, default=7)
    add_json(ap)
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    record = machine_record({"tblock": args.threads})
    print(machine_line(record))
    fp_peak, bf_peak = peaks(args.threads)
    print(f"measured peak, {args.threads} threads: fp32 FMA {fp_peak:.0f} GFLOP/s, pair dot "
          f"({'vdpbf16ps' if BF16_DOT else 'widened FMAs'}) {bf_peak:.0f} GFLOP/s; at Zen 4's rates "
          f"the clock is {fp_peak / args.threads / 32:.2f} / {bf_peak / args.threads / 64:.2f} GHz")
    rng = np.random.default_rng(0)
    rows = []
    print("\n(ms: medians; GFLOP/s: best round; speed-up: of the medians; load: 1-minute average)")
    print("   M     K     N   fp32 ms  GFLOP/s   bf16 ms  GFLOP/s   speed-up  load")
    for K, N in SHAPES:
        W = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        q = quantize_matrix(W, "bf16")
        Wd = q.dequantize(np.float64)
        Bf = np.zeros(packed_size(K, N, NR), np.float32)
        pack_b(q.dequantize(np.float32), Bf)
        Bb = np.zeros(bf16_packed_size(K, N), np.uint32)
        pack_bf16_panels(q.data, Bb)
        for M in args.rows:
            A = rng.standard_normal((M, K)).astype(np.float32)
            Cf, Cb = np.empty((M, N), np.float32), np.empty((M, N), np.float32)
            none = np.zeros(0, np.float32)
            run_f = lambda: fp32_rows(A.reshape(-1), (0, K), Bf, (0, K * NR, K, N), Cf.reshape(-1), (0, N), M,
                                      args.threads)
            run_b = lambda: bgemm_rows(A.reshape(-1), (0, K), Bb, (0, -(-K // 2) * NR, K, N), Cb.reshape(-1),
                                       (0, N), M, False, none, args.threads)
            run_f()
            run_b()
            bound_check("fp32", Cf, A, Wd, K)
            bound_check("bf16", Cb, to_bf16(A), Wd, K)
            tf, tb = [], []
            for _ in range(args.rounds):
                tf.append(_time(run_f))
                tb.append(_time(run_b))
            flop = 2.0 * M * K * N
            load = os.getloadavg()[0]
            rows.append({"M": M, "K": K, "N": N, "fp32_s": statistics.median(tf), "bf16_s": statistics.median(tb),
                         "fp32_best_s": min(tf), "bf16_best_s": min(tb), "load1": load})
            print(f"{M:4} {K:5} {N:5}  {statistics.median(tf) * 1e3:8.2f}  {flop / min(tf) / 1e9:7.0f}  "
                  f"{statistics.median(tb) * 1e3:8.2f}  {flop / min(tb) / 1e9:7.0f}   "
                  f"{statistics.median(tf) / statistics.median(tb):7.2f}  {load:4.2f}")
    record.update(rounds=args.rounds, bf16_dot=BF16_DOT, peak_fp32_gflops=fp_peak, peak_bf16_gflops=bf_peak,
                  results=rows)
    finish(record, args.json)


if __name__ == "__main__":
    main()
