#!/usr/bin/env python3
"""A decode step's weight reads: one row times every matrix of a GPT-2-small stack, in each
stored format, against a plain read of the same bytes in the same rounds.

    python bench/bench_qgemv.py                 # 12 layers of d_model 768, the head, 2 threads
    python bench/bench_qgemv.py --layers 4 --vocab 0 --rounds 7 --json qgemv.json

Each round runs, per format, the 48 GEMVs of the stack (QKV, W_o, W_1, W_2 of 12 layers;
the matrices of all layers together are far past the last-level cache, so each pass streams
them from memory) and the tied head's (d_model x vocab; --vocab 0 leaves it out) with
kernels.qgemv, then tblock.perf.peak.read_pass over as many bytes; medians over rounds.
ratio = GEMV time / read time: 1.0 is the bytes floor.  int8 and int4 run twice: dot
"fp32" (the weights widened to float32) and dot "int8" (the row rounded to int8 blocks,
integer sums: kernels.qdot), and with dot "int8" once more on the rows regrouped 16 to a
group (kernels.qgroups, the layout a block holds where the CPU has VNNI).  The first
call's compilation is timed apart.  The results
are checked against float64 products of the dequantized matrices (of the rounded rows
for dot "int8") before any timing.  Nothing is asserted about speed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from common import add_json, finish, machine_line, machine_record, positive_int

from tblock.formats import quantize_matrix, round_inputs
from tblock.kernels.qgemv import gemv_rows_parallel, stored_view
from tblock.kernels.qgroups import gemv_groups_parallel, group_rows
from tblock.perf.peak import read_pass

# (name, format, dot, layout): layout "rows" as stored, "groups" in groups of 16 (kernels.qgroups)
VARIANTS = (("fp32", "fp32", "fp32", "rows"), ("bf16", "bf16", "fp32", "rows"), ("int8", "int8", "fp32", "rows"),
            ("int4", "int4", "fp32", "rows"), ("int8/dot8", "int8", "int8", "rows"), ("int4/dot8", "int4", "int8", "rows"),
            ("int8/groups", "int8", "int8", "groups"), ("int4/groups", "int4", "int8", "groups"))


def stack_shapes(d: int, layers: int, vocab: int) -> list[tuple[int, int]]:
    return [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] * layers + ([(d, vocab)] if vocab else [])


def stored(W: np.ndarray, fmt: str, dot: str, layout: str):
    if fmt == "fp32":
        return np.ascontiguousarray(W.T).reshape(-1)        # W^T rows, as the others store W
    m = quantize_matrix(W, fmt, dot=dot)
    return group_rows(m.data, fmt) if layout == "groups" else stored_view(m)


def gemv(layout: str, x, q, y, threads: int) -> None:
    """y = x @ the matrix q (a variant's stored form in ``layout``), on ``threads`` tasks."""
    none = np.zeros(0, np.float32)
    if layout == "groups":
        gemv_groups_parallel(x, q, y.size, none, y, False, threads)
    else:
        gemv_rows_parallel(x, q, none, y, False, threads)


def nbytes_of(view) -> int:
    return (view[0] if isinstance(view, tuple) else view).nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=positive_int, default=768)
    ap.add_argument("--layers", type=positive_int, default=12)
    ap.add_argument("--vocab", type=int, default=50257, help="the head's rows (0: no head)")
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--rounds", type=positive_int, default=11)
    add_json(ap)
    args = ap.parse_args()
    record = machine_record({"tblock": args.threads})
    print(machine_line(record))
    rng = np.random.default_rng(0)
    shapes = stack_shapes(args.d_model, args.layers, max(args.vocab, 0))
    Ws = [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]
    xs = [rng.standard_normal(s[0]).astype(np.float32) for s in shapes]
    ys = [np.empty(s[1], np.float32) for s in shapes]
    data, compile_s = {}, {}
    for name, fmt, dot, layout in VARIANTS:
        data[name] = [stored(W, fmt, dot, layout) for W in Ws]
        t0 = time.perf_counter()
        gemv(layout, xs[0], data[name][0], ys[0], args.threads)
        compile_s[name] = time.perf_counter() - t0
        # the check: the first layer's matrices and the head against float64 over the same
        # stored values (and the same rounded rows)
        for i in list(range(4)) + ([len(Ws) - 1] if args.vocab > 0 else []):
            W, x, y, q = Ws[i], xs[i], ys[i], data[name][i]
            Wd = W if fmt == "fp32" else quantize_matrix(W, fmt).dequantize(np.float64)
            gemv(layout, x, q, y, 1)
            xr = round_inputs(x[None].astype(np.float64), dot)[0] if dot != "fp32" else x.astype(np.float64)
            err = np.abs(y - xr @ Wd).max() / (np.abs(xr) @ np.abs(Wd)).max()
            if not err < 1e-6:
                raise SystemExit(f"{name}: relative error {err:.2e} against float64 (bound 1e-6)")
    names = [v[0] for v in VARIANTS]
    nbytes = {n: sum(nbytes_of(a) for a in data[n]) for n in names}
    reads = {n: read_pass(nbytes[n], args.threads) for n in names}
    times = {n: [] for n in names}
    floors = {n: [] for n in names}
    for _ in range(args.rounds):
        for n, _, _, layout in VARIANTS:
            t0 = time.perf_counter()
            for x, q, y in zip(xs, data[n], ys):
                gemv(layout, x, q, y, args.threads)
            times[n].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            reads[n]()
            floors[n].append(time.perf_counter() - t0)
    rows = []
    head = f", the head (d x {args.vocab})" if args.vocab > 0 else ""
    print(f"\n{args.layers} layers of d_model {args.d_model}{head}, {args.threads} threads, medians of {args.rounds} rounds")
    print("format        MB   GEMVs ms   read ms   ratio   GB/s   compile s")
    for n, fmt, dot, _ in VARIANTS:
        t, r = statistics.median(times[n]), statistics.median(floors[n])
        rows.append({"variant": n, "format": fmt, "dot": dot, "bytes": nbytes[n], "gemv_s": t, "read_s": r, "ratio": t / r,
                     "GBs": nbytes[n] / t / 1e9, "read_GBs": nbytes[n] / r / 1e9, "compile_s": compile_s[n]})
        print(f"{n:11} {nbytes[n] / 1e6:6.1f}   {t * 1e3:8.2f}  {r * 1e3:8.2f}  {t / r:6.2f}  "
              f"{nbytes[n] / t / 1e9:5.1f}   {compile_s[n]:6.2f}")
    record.update(d_model=args.d_model, layers=args.layers, vocab=args.vocab, rounds=args.rounds, results=rows)
    finish(record, args.json)


if __name__ == "__main__":
    main()
