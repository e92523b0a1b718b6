#!/usr/bin/env python3
"""A decode step's weight reads: one row times every matrix of a GPT-2-small stack, in each
stored format, against a plain read of the same bytes in the same rounds.

    python bench/bench_qgemv.py                 # 12 layers of d_model 768, 2 threads
    python bench/bench_qgemv.py --layers 4 --rounds 7 --json qgemv.json

Each round runs, per format, the 48 GEMVs of the stack (QKV, W_o, W_1, W_2 of 12 layers;
the matrices of all layers together are far past the last-level cache, so each pass streams
them from memory) with kernels.qgemv, then tblock.perf.peak.read_pass over as many bytes;
medians over rounds.  ratio = GEMV time / read time: 1.0 is the bytes floor.  The first
call's compilation is timed apart.  The results are checked against float64 products of the
dequantized matrices before any timing.  Nothing is asserted about speed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from common import add_json, finish, machine_line, machine_record, positive_int

from tblock.formats import quantize_matrix
from tblock.kernels.qgemv import gemv_rows_parallel, gemv_rows_serial, stored_view
from tblock.perf.peak import read_pass

FORMATS = ("fp32", "bf16", "int8", "int4")


def stack_shapes(d: int, layers: int) -> list[tuple[int, int]]:
    return [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] * layers


def stored(W: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "fp32":
        return np.ascontiguousarray(W.T).reshape(-1)        # W^T rows, as the others store W
    return stored_view(quantize_matrix(W, fmt))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=positive_int, default=768)
    ap.add_argument("--layers", type=positive_int, default=12)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--rounds", type=positive_int, default=11)
    add_json(ap)
    args = ap.parse_args()
    record = machine_record({"tblock": args.threads})
    print(machine_line(record))
    rng = np.random.default_rng(0)
    shapes = stack_shapes(args.d_model, args.layers)
    Ws = [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]
    xs = [rng.standard_normal(s[0]).astype(np.float32) for s in shapes]
    ys = [np.empty(s[1], np.float32) for s in shapes]
    none = np.zeros(0, np.float32)
    data, compile_s = {}, {}
    for fmt in FORMATS:
        data[fmt] = [stored(W, fmt) for W in Ws]
        t0 = time.perf_counter()
        gemv_rows_parallel(xs[0], data[fmt][0], none, ys[0], False, args.threads)
        compile_s[fmt] = time.perf_counter() - t0
        # the check: every matrix of the first layer against float64 over the same stored values
        for W, x, y, q in zip(Ws[:4], xs, ys, data[fmt][:4]):
            Wd = W if fmt == "fp32" else quantize_matrix(W, fmt).dequantize(np.float64)
            gemv_rows_serial(x, q, none, y, False, 1)
            ref = x.astype(np.float64) @ Wd
            err = np.abs(y - ref).max() / (np.abs(x) @ np.abs(Wd)).max()
            if not err < 1e-6:
                raise SystemExit(f"{fmt}: relative error {err:.2e} against float64 (bound 1e-6)")
    nbytes = {f: sum(a.nbytes for a in data[f]) for f in FORMATS}
    reads = {f: read_pass(nbytes[f], args.threads) for f in FORMATS}
    times = {f: [] for f in FORMATS}
    floors = {f: [] for f in FORMATS}
    for _ in range(args.rounds):
        for fmt in FORMATS:
            t0 = time.perf_counter()
            for x, q, y in zip(xs, data[fmt], ys):
                gemv_rows_parallel(x, q, none, y, False, args.threads)
            times[fmt].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            reads[fmt]()
            floors[fmt].append(time.perf_counter() - t0)
    rows = []
    print(f"\n{args.layers} layers of d_model {args.d_model}, {args.threads} threads, medians of {args.rounds} rounds")
    print("format   MB   GEMVs ms   read ms   ratio   GB/s   compile s")
    for fmt in FORMATS:
        t, r = statistics.median(times[fmt]), statistics.median(floors[fmt])
        rows.append({"format": fmt, "bytes": nbytes[fmt], "gemv_s": t, "read_s": r, "ratio": t / r,
                     "GBs": nbytes[fmt] / t / 1e9, "compile_s": compile_s[fmt]})
        print(f"{fmt:6} {nbytes[fmt] / 1e6:5.1f}   {t * 1e3:8.2f}  {r * 1e3:8.2f}  {t / r:6.2f}  "
              f"{nbytes[fmt] / t / 1e9:5.1f}   {compile_s[fmt]:6.2f}")
    record.update(d_model=args.d_model, layers=args.layers, rounds=args.rounds, results=rows)
    finish(record, args.json)


if __name__ == "__main__":
    main()
