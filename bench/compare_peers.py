#!/usr/bin/env python3
"""tblock (backend "numba", float32) against its peers on the CPU, the same block and weights.

    python bench/compare_peers.py                  # every size of issue #12 (tens of minutes)
    python bench/compare_peers.py --quick          # fewer repetitions, no peer memory
    python bench/compare_peers.py --points 768:12:4096 384:6:64 768:12:128:8   # d:heads:T[:B]
    python bench/compare_peers.py --peers torch,ort --threads 2 --json peers.json
    python bench/compare_peers.py --bf16           # tblock's bf16 block against OpenVINO's bf16
    make bench-peers                               # installs the peers into .venv first

    # the avx2 path on an AVX-512 machine, the peers capped as far as their variables go
    TBLOCK_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        python bench/compare_peers.py --quick --isolate --peers torch,ort,openvino

The peers (tblock.peers): PyTorch eager (nanoGPT's Block, scaled_dot_product_attention with
is_causal), torch.compile of that module, ONNX Runtime on a graph with the fused com.microsoft
Attention op, OpenVINO on the converted torch module.  The block is the lesson's: Pre-LN,
causal, tanh GELU, no biases, LayerNorm without affine.

Each implementation's output is checked against tblock's numpy oracle first; one that
disagrees by more than tblock.peers.TOLERANCE (relative) is reported as wrong and not timed.
Building, compiling and the first call are timed apart (the "setup" table) and left out of
the measurement.  The timing runs rounds of A B C D E (a pause, one uncounted call, then a
few timed samples each), so every implementation sees the same machine load, and reports
medians.  Also: the float32 FMA peak measured in the same run with tblock's own SIMD code,
tblock's GFLOP/s at d_model 768, T 4096 against it, every implementation's GFLOP/s against
it, GEMM rates, and peak memory in fresh processes.  Nothing is asserted: it is a
measurement.  A peer that is not installed is left out (without any, only tblock's column
is measured).

Each implementation's kernels are named by their vector ISA (tblock.peers: torch's caps,
OpenVINO's chosen primitives, ONNX Runtime's MLAS by CPUID).  With a forced path narrower
than the host's, a peer whose kernels are wider is marked, and tblock is also set against
the fastest peer held to its path: the variables above cap torch, but not ONNX Runtime,
and OpenVINO only in part (its MLAS GEMMs keep AVX-512).
"""

from __future__ import annotations

import argparse
import datetime
import time

import numpy as np
from common import add_json, add_threads, child_failure, finish, last_json, machine_line, machine_record, run_child

import tblock
from tblock import BlockConfig, peers, perf
from tblock.counting import matmul_flops
from tblock.perf.peak import fma_loop, fma_rate, fma_registers, measured_fma_peak, nominal_peak

# (d_model, n_heads, T, B): issue #12's sizes, then the lesson's toy block
POINTS = [(384, 6, 64, 1), (384, 6, 1024, 1), (384, 6, 4096, 1),
          (768, 12, 128, 1), (768, 12, 1024, 1), (768, 12, 4096, 1), (768, 12, 128, 8),
          (8, 2, 4, 1)]
BIG = (768, 12, 4096, 1)        # the point whose GFLOP/s is set against the FMA peak
PEER_ALIASES = {"torch": "torch", "eager": "torch", "compile": "compile", "torch.compile": "compile",
                "ort": "ort", "onnxruntime": "ort", "openvino": "openvino", "ov": "openvino"}


def causal_flops(d, h, T, B=1):
    """The block's matmul FLOPs, causal (tblock.counting.matmul_flops): 24 T d^2 for the
    projections and the FFN with d_ff = 4d, and 2 T (T + 1) d for scores and AV."""
    return B * matmul_flops(BlockConfig(d_model=d, n_heads=h), T)


# ---------------------------------------------------------------------------------------
# the machine

def pin_threads(n, names):
    """tblock, the BLAS pools and torch at n threads for the rest of the run (tblock.perf);
    ONNX Runtime and OpenVINO get n when their sessions are built. The counts in force."""
    counts, _ = perf.pin_threads(n, with_torch=bool({"torch", "compile", "openvino"} & set(names)))
    counts.update({name: n for name in ("ort", "openvino") if name in names})
    return counts


# ---------------------------------------------------------------------------------------
# timing: tblock.perf.interleaved, rounds of every implementation in turn

# one peer build and call in a child process (bench/child_peer.py): a peer that kills its
# process would end the run
def survives(name, d, h, T, B, threads) -> str:
    """'' when peer ``name`` builds and runs once at this size in a child process, else why not."""
    return child_failure(run_child("child_peer", "probe", name, d, h, T, B, threads))


# the bf16 run: its error against the float32 oracle is bf16's, not a bug's (tblock 3-5e-3,
# OpenVINO 3.3e-3 seen at d 384/768)
BF16_TOLERANCE = 3e-2


def build_all(names, w, cfg, H, threads, isolate=False, bf16=False):
    """tblock and each peer, built and checked against the oracle: {name: record}; a record
    with status "ok" carries the callable under "fn".  isolate: each peer is first run
    once in a child process (survives), and one that fails there is not run here.  bf16:
    tblock on bf16 weights with inputs rounded to bf16 (dot "bf16"), the peers in their bf16
    mode, all checked against the oracle on the float32 weights to BF16_TOLERANCE."""
    ref = tblock.forward(H, w, cfg, backend="numpy")           # float64 inside, (B, T, d)
    tolerance = BF16_TOLERANCE if bf16 else peers.TOLERANCE
    w_tblock = tblock.quantize(w, "bf16", dot="bf16") if bf16 else w
    out = {}
    B, T, d = H.shape
    for name in ["tblock"] + names:
        rec = out[name] = {}
        if isolate and name != "tblock":
            why = survives(name, d, cfg.n_heads, T, B, threads)
            if why:
                rec.update(status="crashed", reason=why)
                continue
        try:
            t = time.perf_counter()
            if name == "tblock":
                fn = lambda H=H: tblock.forward(H, w_tblock, cfg, backend="numba")
                path = perf.vector_path()
                rec["isa"] = path["name"]
                rec["isa_evidence"] = "TBLOCK_ISA" if path["forced"] else "detected"
            else:
                peer = peers.build(name, w, cfg, threads=threads, shape=H.shape, precision="bf16" if bf16 else "f32")
                fn = lambda H=H, peer=peer: peer(H)
                rec["isa"], rec["isa_evidence"] = peer.isa
            rec["build_s"] = time.perf_counter() - t
            t = time.perf_counter()
            y = fn()                            # compiles where the peer compiles lazily
            rec["first_call_s"] = time.perf_counter() - t
        except Exception as e:                  # one broken peer must not cost the others
            rec.update(status="error", reason=f"{type(e).__name__}: {e}"[:300])
            continue
        rec["max_rel_err"] = peers.max_rel_error(y, ref)
        rec["status"] = "ok" if rec["max_rel_err"] <= tolerance else "wrong"
        if rec["status"] == "ok":
            rec["fn"] = fn
    return out


def held_to(isa, path):
    """Whether kernels of vector ISA ``isa`` keep to tblock's ``path`` (are no wider)."""
    return peers.widest(isa, path) == path


def bench_point(d, h, T, B, names, quick, threads, isolate=False, bf16=False):
    cfg = tblock.BlockConfig(d_model=d, n_heads=h)
    w = tblock.init_weights(cfg, seed=0, dtype=np.float32)
    H = np.random.default_rng(1).standard_normal((B, T, d)).astype(np.float32)
    impls = build_all(names, w, cfg, H, threads, isolate, bf16)
    fns = {n: r.pop("fn") for n, r in impls.items() if "fn" in r}
    # seconds of rounds after the minimum: more for slow calls, whose medians need more samples
    budget = (1.0 if quick else 3.0) * len(fns) * (1 + B * T / 1024)
    times = perf.interleaved(fns, 3 if quick else 7, budget)
    flops = causal_flops(d, h, T, B)
    for name, ts in times.items():
        median = float(np.median(ts))
        impls[name].update(median_s=median, best_s=min(ts), reps=len(ts), gflops=flops / median / 1e9)
    row = {"d": d, "heads": h, "T": T, "B": B, "causal_flops": flops, "impls": impls}
    tb = impls["tblock"].get("median_s")
    timed = {n: r["median_s"] for n, r in impls.items() if n != "tblock" and "median_s" in r}
    if tb and timed:
        fastest = min(timed, key=timed.get)
        row.update(fastest_peer=fastest, ratio=tb / timed[fastest])
        # with a forced narrower path, also against the peers whose kernels kept to it
        path = impls["tblock"]["isa"]
        on_path = {n: t for n, t in timed.items() if held_to(impls[n]["isa"], path)}
        if on_path and len(on_path) < len(timed):
            fastest = min(on_path, key=on_path.get)
            row.update(fastest_peer_on_path=fastest, ratio_on_path=tb / on_path[fastest])
    if tb:
        row["tblock_gflops"] = impls["tblock"]["gflops"]
        row["tblock_best_gflops"] = row["causal_flops"] / impls["tblock"]["best_s"] / 1e9
    return row


# ---------------------------------------------------------------------------------------
# the machine's ceilings

def gemm_gflops(names):
    """Best float32 GEMM rate on the block's largest GEMM shape (d_model 768, T 4096, the
    FFN's up projection) through numpy's BLAS and torch (best of several runs)."""
    M, K, N = 4096, 768, 3072
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C = np.empty((M, N), np.float32)
    best = lambda f: min(perf.seconds(f) for _ in range(7))
    np.matmul(A, B, out=C)
    res = {"shape": [M, K, N], "numpy_matmul": 2 * M * N * K / best(lambda: np.matmul(A, B, out=C)) / 1e9}
    if {"torch", "compile", "openvino"} & set(names):
        import torch
        ta, tb, tc = torch.from_numpy(A), torch.from_numpy(B), torch.from_numpy(C)
        torch.mm(ta, tb, out=tc)
        res["torch_mm"] = 2 * M * N * K / best(lambda: torch.mm(ta, tb, out=tc)) / 1e9
    return res


def matched_efficiency(threads, pairs):
    """tblock's causal GFLOP/s at d_model 768, T 4096 as a share of the FMA peak measured
    around the same call.  This machine is a shared VM whose speed swings, so each block
    call sits between two short FMA bursts and is compared with their mean: when the cores
    themselves are shared the bursts slow down with the block and the share holds; when
    only the block slows (contention in the memory system, which a register-only loop never
    touches) the share drops."""
    d, h, T, B = BIG
    cfg = tblock.BlockConfig(d_model=d, n_heads=h)
    w = tblock.init_weights(cfg, seed=0, dtype=np.float32)
    H = np.random.default_rng(1).standard_normal((T, d)).astype(np.float32)
    f = lambda: tblock.forward(H, w, cfg, backend="numba")
    f()
    n, fl = 8_000_000, causal_flops(d, h, T)
    peaks, rates, shares = [fma_rate(n, threads)], [], []
    for _ in range(pairs):
        rates.append(fl / perf.seconds(f) / 1e9)
        peaks.append(fma_rate(n, threads))
        shares.append(rates[-1] / ((peaks[-2] + peaks[-1]) / 2))
    return {"pairs": pairs, "median_share": float(np.median(shares)), "best_share": max(shares),
            "worst_share": min(shares), "block_gflops": rates, "peak_gflops": peaks, "shares": shares}


# ---------------------------------------------------------------------------------------
# memory, each in a fresh process (bench/child_peer.py): peak RSS (VmHWM) of one forward
# above a baseline

def memory(name, T, threads, d=768, h=12):
    """Peak RSS of one forward (weights and input included) above the RSS after `import
    tblock` and the implementation's libraries; for tblock also above import + warmup().
    A peer's peak includes its compiler's (torch.compile, OpenVINO build on the first call)."""
    p = run_child("child_peer", "memory", name, d, h, T, threads)
    if p.returncode:
        return {"error": child_failure(p)}
    r = last_json(p)
    r["above_import_mib"] = r["peak_mib"] - r["base_import_mib"]
    r["above_warm_mib"] = r["peak_mib"] - r["base_warm_mib"]
    return r


# ---------------------------------------------------------------------------------------
# output

def fmt_time(s):
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} µs"


def _cell(rec):
    if rec is None:
        return "-"
    if "median_s" in rec:
        return fmt_time(rec["median_s"])
    return rec["status"]            # wrong or error: the details follow the table


def table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def main_table(points, names):
    """Median times; a peer whose kernels use wider vectors than tblock's path is marked *,
    and a column compares tblock with the fastest peer held to its path, when one was."""
    path = points[0]["impls"]["tblock"].get("isa") if points else None
    on_path = any("ratio_on_path" in r for r in points)
    header = (["d_model", "T", "B", "tblock"] + [peers.LABELS[n] for n in names] + ["tblock / fastest peer"]
              + ([f"tblock / fastest on {path}"] if on_path else []))
    rows = []
    for r in points:
        ratio = f"{r['ratio']:.2f} ({peers.LABELS[r['fastest_peer']]})" if "ratio" in r else "-"
        cells = []
        for n in ["tblock"] + names:
            x = r["impls"].get(n)
            wider = x is not None and n != "tblock" and not held_to(x.get("isa", path), path)
            cells.append(_cell(x) + ("*" if wider else ""))
        extra = []
        if on_path:
            extra = [f"{r['ratio_on_path']:.2f} ({peers.LABELS[r['fastest_peer_on_path']]})"
                     if "ratio_on_path" in r else "-"]
        rows.append([r["d"], r["T"], r["B"]] + cells + [ratio] + extra)
    out = table(header, rows)
    if any(c.endswith("*") for row in rows for c in map(str, row)):
        out += f"\n* kernels wider than tblock's {path} path (see the ISA lines below)"
    return out


def isa_lines(points, names):
    """Each implementation's vector ISA as its library reports it (distinct reports only)."""
    lines = []
    for n in ["tblock"] + names:
        seen = {}
        for r in points:
            x = r["impls"].get(n, {})
            if "isa" in x:
                seen.setdefault((x["isa"], x["isa_evidence"]), []).append(f"{r['d']}/{r['T']}")
        for (isa, why), where in seen.items():
            at = "" if len(seen) == 1 else f" (at {', '.join(where)})"
            lines.append(f"  {peers.LABELS.get(n, n)}: {isa}{at}: {why}")
    return "\n".join(lines)


def rate_table(points, names, fma):
    """Causal GFLOP/s of every median call, and its share of the FMA peak measured in the
    run on tblock's path: a share above 100% is a peer running wider vectors than the path."""
    header = ["d_model", "T", "B"] + [peers.LABELS.get(n, n) for n in ["tblock"] + names]
    rows = []
    for r in points:
        cells = []
        for n in ["tblock"] + names:
            gf = r["impls"].get(n, {}).get("gflops")
            cells.append("-" if gf is None else f"{gf:.1f} ({100 * gf / fma:.0f}%)")
        rows.append([r["d"], r["T"], r["B"]] + cells)
    return table(header, rows)


def detail_table(points, names):
    """Per point and implementation: max relative error against the oracle, and setup
    time (build + first call: compilation lands there), neither part of the timings."""
    header = ["d_model", "T", "B"] + [f"{n} err / setup" for n in ["tblock"] + names] + ["samples"]
    rows = []
    for r in points:
        cells = []
        for n in ["tblock"] + names:
            x = r["impls"].get(n)
            if x is None:
                cells.append("-")
            elif "max_rel_err" not in x:
                cells.append(x["status"])
            else:
                cells.append(f"{x['max_rel_err']:.1e} / {x['build_s'] + x['first_call_s']:.2f} s")
        rows.append([r["d"], r["T"], r["B"]] + cells + [r["impls"]["tblock"].get("reps", "-")])
    return table(header, rows)


def parse_point(text):
    """d:heads:T or d:heads:T:B."""
    parts = text.split(":")
    if len(parts) not in (3, 4) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a point is d_model:heads:T[:B] with positive integers, got {text!r}")
    d, h, T, *B = map(int, parts)
    if d % h:
        raise argparse.ArgumentTypeError(f"{text}: d_model {d} is not divisible by {h} heads")
    return d, h, T, B[0] if B else 1


def parse_peers(text):
    names = []
    for x in filter(None, (s.strip().lower() for s in text.split(","))):
        if x not in PEER_ALIASES:
            raise argparse.ArgumentTypeError(f"unknown peer {x!r}; choose from torch, compile, ort, openvino")
        names.append(PEER_ALIASES[x])
    return list(dict.fromkeys(names))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions; no peer memory, no T=32768")
    ap.add_argument("--points", nargs="+", type=parse_point, metavar="D:HEADS:T[:B]",
                    help="sizes to compare (default: issue #12's seven and the toy block 8:2:4)")
    ap.add_argument("--peers", type=parse_peers, default=None,
                    help="comma-separated, from torch,compile,ort,openvino (default: all that are installed)")
    add_threads(ap, perf.usable_cores())
    ap.add_argument("--bf16", action="store_true",
                    help="bf16 arithmetic: tblock on bf16 weights with bf16-rounded inputs (dot bf16) against "
                         "the peers' bf16 modes (OpenVINO's precision hint; the others have none and are "
                         "reported so); default peers then openvino")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurements")
    ap.add_argument("--isolate", action="store_true",
                    help="run each peer once in a child process before each size, leaving out one that crashes "
                         "there (OpenVINO under ONEDNN_MAX_CPU_ISA=AVX2 at the toy size)")
    add_json(ap)
    args = ap.parse_args(argv)
    if args.peers is None:
        args.peers = [n for n in peers.PEERS if n in peers.PRECISIONS or not args.bf16]

    # the order of imports matters: torch before Numba's pool starts, the others after
    # (tblock.peers.import_early says why), so every library runs as it does on its own
    peers.import_early(args.peers)
    from tblock import _runtime
    tblock.set_num_threads(min(args.threads, _runtime.pool_size()))
    t = time.perf_counter()
    tblock.warmup()
    warmup_s = time.perf_counter() - t
    fma_loop(args.threads)                  # starts Numba's pool
    status = {n: peers.peer_status(n) for n in args.peers}
    names = [n for n in args.peers if status[n][0]]
    threads = pin_threads(args.threads, names)
    import numba
    threads["numba_threading_layer"] = numba.threading_layer()
    results = machine_record(threads)
    results.update(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        peers=names, not_run={n: why for n, (ok, why) in status.items() if not ok},
        tolerance=BF16_TOLERANCE if args.bf16 else peers.TOLERANCE, bf16=args.bf16, quick=args.quick, isolate=args.isolate, tblock_warmup_s=warmup_s, points=[])
    v, p = results["versions"], results["isa"]
    print(machine_line(results))
    print(f"tblock path {p['name']}: {p['vector_bytes']}-byte vectors, {p['nv']}-vector micro-tile rows, KC {p['kc']}; "
          f"{args.threads} threads ({', '.join(f'{k} {x}' for k, x in threads.items() if k not in ('requested', 'blas'))})")
    print(f"tblock.warmup() {warmup_s:.1f} s (compiles, or loads Numba's cache)")
    print("versions: " + ", ".join(f"{k} {x or 'not installed'}" for k, x in v.items()))
    for n, why in results["not_run"].items():
        print(f"not run: {peers.LABELS[n]}: {why}")
    precision = "bf16 (weights, and the inputs of their products)" if args.bf16 else "float32"
    print(f"{precision}, causal Pre-LN, tanh GELU, no biases; median time per call of interleaved rounds"
          f"{' (quick)' if args.quick else ''}\n", flush=True)

    for d, h, T, B in args.points or POINTS:
        results["points"].append(bench_point(d, h, T, B, names, args.quick, args.threads, args.isolate, args.bf16))
        r = results["points"][-1]
        print(f"  d_model {d} T {T} B {B}: " + ", ".join(
            f"{n} {_cell(x)}" for n, x in r["impls"].items()), flush=True)
    print()
    print(main_table(results["points"], names))
    print("\nvector ISA of each implementation's kernels:")
    print(isa_lines(results["points"], names))
    print("\nmax relative error against the numpy oracle / setup (build + first call, not timed):")
    print(detail_table(results["points"], names))
    for r in results["points"]:
        for n, x in r["impls"].items():
            if x["status"] != "ok":
                why = x.get("reason") or f"max relative error {x['max_rel_err']:.2e} > {results['tolerance']:g}"
                print(f"{n} at d_model {r['d']} T {r['T']} B {r['B']}: {x['status']}: {why}")

    print()
    g = results["gemm"] = gemm_gflops(names)
    print(f"best float32 GEMM {'x'.join(map(str, g['shape']))}: "
          + ", ".join(f"{k} {x:.1f} GFLOP/s" for k, x in g.items() if k != "shape"))
    nominal, mhz = nominal_peak(args.threads)
    results["nominal_peak_gflops"], results["cpuinfo_mhz"] = nominal, mhz
    fma = results["measured_fma_peak_gflops"] = measured_fma_peak(args.threads, 3 if args.quick else 5)
    nacc, lanes = fma_registers() * 3 // 4, p["vector_bytes"] // 4
    results["fma_loop"] = {"accumulators": nacc, "lanes": lanes, "path": p["name"]}
    print(f"measured FMA peak ({args.threads} threads x {nacc} independent {lanes}-lane float32 FMA chains, "
          f"path {p['name']}): {fma:.1f} GFLOP/s"
          + (f"; nominal at the cpuinfo clock ({mhz:.0f} MHz x threads x 2 FMA ports x {lanes} lanes x 2): "
             f"{nominal:.1f}" if nominal else ""))
    print(f"\ncausal GFLOP/s of the median call (share of the measured FMA peak on the {p['name']} path):")
    print(rate_table(results["points"], names, fma))
    big = [r for r in results["points"] if (r["d"], r["heads"], r["T"], r["B"]) == BIG and "tblock_gflops" in r]
    if big:
        r = big[0]
        for what, gf in (("median call", r["tblock_gflops"]), ("fastest call", r["tblock_best_gflops"])):
            print(f"d_model 768, T 4096, tblock, {what}: {gf:.1f} GFLOP/s (causal FLOPs) = {100 * gf / fma:.0f}% "
                  "of the measured FMA peak" + (f", {100 * gf / nominal:.0f}% of nominal" if nominal else ""))
        m = results["matched_efficiency"] = matched_efficiency(args.threads, 3 if args.quick else 9)
        print(f"d_model 768, T 4096, each tblock call against the FMA peak measured around it ({m['pairs']} calls): "
              f"median {100 * m['median_share']:.0f}%, range {100 * m['worst_share']:.0f}-{100 * m['best_share']:.0f}%")

    if not args.no_memory:
        runs = [("tblock", 4096)] + ([] if args.quick else [("tblock", 32768)] + [(n, 4096) for n in names])
        results["memory"] = {}
        for name, T in runs:
            m = results["memory"][f"{name}_T{T}"] = memory(name, T, args.threads)
            what = f"memory d_model 768 T {T}, {name}"
            if "error" in m:
                print(f"{what}: failed: {m['error']}")
                continue
            print(f"{what}: peak RSS {m['peak_mib']:.0f} MiB, {m['above_import_mib']:.0f} MiB above `import tblock`"
                  + (f" ({m['base_import_mib']:.0f} MiB), {m['above_warm_mib']:.0f} above import + warmup()"
                     if name == "tblock" else f" and its libraries ({m['base_import_mib']:.0f} MiB)")
                  + f"; weights and input included; the call took {m['seconds']:.2f} s")
    finish(results, args.json)
    return results


if __name__ == "__main__":
    main()
