#!/usr/bin/env python3
"""tblock (backend "numba") against a nanoGPT-style PyTorch CPU block, float32, batch 1.

    python bench/compare_torch.py            # the full table (several minutes)
    python bench/compare_torch.py --quick    # fewer repetitions
    python bench/compare_torch.py --points 768:12:4096 384:6:64

Both blocks compute the same function with the same weights (Pre-LN, causal, tanh GELU,
no biases, LayerNorm without affine): the script checks that first.  Timings alternate
blocks of tblock and torch calls in one process, so both see the same machine load, and
report medians (and the fastest call, for GFLOP/s next to the best-of peak rates).
Also: the toy block's time per tblock.forward call, the best float32 GEMM rates, the
FMA peak (measured and nominal), peak memory of both blocks in fresh subprocesses, and
T=32768.

Nothing here is asserted: it is a measurement, printed as a table.  torch is optional
(without it only tblock's side is measured).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np

import tblock
from tblock._numba_backend import warmup

try:
    import torch
    import torch.nn.functional as F
except ImportError:            # torch is optional
    torch = None

THREADS = 2
POINTS = [(768, 12, 128), (768, 12, 1024), (768, 12, 4096), (384, 6, 64), (384, 6, 1024), (384, 6, 4096)]


def causal_flops(d, T):
    """The brief's count for one causal block: 24 T d^2 (projections and FFN with
    d_ff = 4d) + 2 T^2 d (scores and AV over the lower triangle)."""
    return 24 * T * d * d + 2 * T * T * d


if torch is not None:
    class TorchBlock(torch.nn.Module):
        """nanoGPT's Block with bias=False and our weights (torch.nn.Linear stores W^T)."""

        def __init__(self, w, n_heads):
            super().__init__()
            d = w.w_q.shape[0]
            self.n_heads = n_heads
            self.ln1 = torch.nn.LayerNorm(d, elementwise_affine=False)
            self.c_attn = torch.nn.Linear(d, 3 * d, bias=False)
            self.c_proj = torch.nn.Linear(d, d, bias=False)
            self.ln2 = torch.nn.LayerNorm(d, elementwise_affine=False)
            self.c_fc = torch.nn.Linear(d, 4 * d, bias=False)
            self.mlp_proj = torch.nn.Linear(4 * d, d, bias=False)
            with torch.no_grad():
                self.c_attn.weight.copy_(torch.from_numpy(np.concatenate([w.w_q, w.w_k, w.w_v], axis=1).T.copy()))
                self.c_proj.weight.copy_(torch.from_numpy(w.w_o.T.copy()))
                self.c_fc.weight.copy_(torch.from_numpy(w.w_ff1.T.copy()))
                self.mlp_proj.weight.copy_(torch.from_numpy(w.w_ff2.T.copy()))

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln1(x)).split(C, dim=2)
            q = q.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
            k = k.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
            v = v.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.c_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln2(x)), approximate="tanh"))


def _timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


# After a parallel region, OpenMP worker threads (torch's, and Numba's "omp" layer) spin
# for a few milliseconds before they sleep; a call started meanwhile shares the cores
# with them.  So the two libraries run in alternating blocks of back-to-back calls, with
# a pause between blocks and the first call of each block not counted: each library is
# timed as it runs in a loop, and neither pays for the other's spinning threads.
PAUSE_S = 0.05


def side_by_side(fa, fb, min_reps, budget_s):
    """Alternate blocks of fa and fb calls, at least min_reps calls each; their medians
    and their fastest calls (the machine's quietest moment, comparable with the peak
    rates, which are best-of too)."""
    ta, tb = [], []
    per_block = 4
    fa(), fb()                                  # warm caches and allocators
    start = time.perf_counter()
    while len(ta) < min_reps or (time.perf_counter() - start < budget_s and len(ta) < 200):
        for f, out in ((fa, ta), (fb, tb)):
            time.sleep(PAUSE_S)
            f()                                 # wakes the thread pool; not counted
            out.extend(_timed(f) for _ in range(per_block))
    return np.median(ta), np.median(tb), len(ta), min(ta), min(tb)


def block_case(d, n_heads, T):
    """The compared block (causal Pre-LN, tanh GELU, no biases) with its weights and a
    (1, T, d) input, and a call of tblock's numba backend on them."""
    cfg = tblock.BlockConfig(d_model=d, n_heads=n_heads, causal=True, norm="pre", activation="gelu_tanh")
    w = tblock.init_weights(cfg, seed=0, dtype=np.float32)
    H = np.random.default_rng(1).standard_normal((1, T, d)).astype(np.float32)
    return w, H, lambda: tblock.forward(H, w, cfg, backend="numba")


def bench_point(d, n_heads, T, quick):
    w, H, ours = block_case(d, n_heads, T)
    row = {"d": d, "heads": n_heads, "T": T}
    if torch is None:
        ts = [_timed(ours) for _ in range(3 if quick else 7)]
        row.update(tblock_ms=np.median(ts) * 1e3, tblock_best_ms=min(ts) * 1e3)
        return row
    tb_mod = TorchBlock(w, n_heads).eval()
    x = torch.from_numpy(H)
    with torch.inference_mode():
        ref = tb_mod(x).numpy()
        got = ours()
        rel = float(np.abs(got - ref).max() / np.abs(ref).max())
        theirs = lambda: tb_mod(x)
        budget = (2.0 if quick else 8.0) * (1 + T / 1024)
        ta, tt, n, ba, bt = side_by_side(ours, theirs, 3 if quick else 7, budget)
    row.update(tblock_ms=ta * 1e3, torch_ms=tt * 1e3, ratio=ta / tt, reps=n, max_rel_diff=rel,
               tblock_best_ms=ba * 1e3, torch_best_ms=bt * 1e3)
    return row


def toy_us(quick):
    cfg = tblock.BlockConfig(d_model=8, n_heads=2)
    w = tblock.init_weights(cfg, seed=0)
    H = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    f = lambda: tblock.forward(H, w, cfg, backend="numba")
    f()
    n = 2000 if quick else 10000
    per = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(n):
            f()
        per.append((time.perf_counter() - t) / n)
    # median of the batches, and the best batch (timeit's convention: slower batches
    # are other processes' doing, not the code's)
    out = {"tblock_us": float(np.median(per)) * 1e6, "tblock_best_us": float(min(per)) * 1e6}
    if torch is not None:
        tb_mod = TorchBlock(w, 2).eval()
        x = torch.from_numpy(H[None])
        with torch.inference_mode():
            tb_mod(x)
            per = []
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(n // 10):
                    tb_mod(x)
                per.append((time.perf_counter() - t) / (n // 10))
        out["torch_us"] = float(np.median(per)) * 1e6
        out["torch_best_us"] = float(min(per)) * 1e6
    return out


def best_gemm_gflops():
    """The best float32 GEMM rate this machine gives us: numpy's BLAS, torch's and our
    own kernel on the block's largest GEMM shape (best of several runs)."""
    from threadpoolctl import threadpool_info
    M, K, N = 4096, 768, 3072
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C = np.empty((M, N), np.float32)
    res = {}
    best = lambda f, n=7: min(_timed(f) for _ in range(n))
    np.matmul(A, B, out=C)
    res["numpy_matmul"] = 2 * M * N * K / best(lambda: np.matmul(A, B, out=C)) / 1e9
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    res["numpy_blas"] = ", ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})" for i in blas)
    if torch is not None:
        ta, tbm, tc = torch.from_numpy(A), torch.from_numpy(B), torch.from_numpy(C)
        torch.mm(ta, tbm, out=tc)
        res["torch_mm"] = 2 * M * N * K / best(lambda: torch.mm(ta, tbm, out=tc)) / 1e9
    res["tblock_gemm"] = _our_gemm_gflops(A, B)
    return res


def _our_gemm_gflops(A, B):
    import numba
    from numba import njit, prange
    from tblock.kernels.block import KC
    from tblock.kernels.gemm import gemm_block, pack_b, packed_size, panel_width

    @njit(parallel=True)
    def run(A, Bp, K, N, C, M):
        for t in prange((M + 95) // 96):
            gemm_block(A, 0, K, t * 96, min(M, t * 96 + 96), Bp, 0, K, N, 0, (N + 63) // 64, C, 0, N, False, KC)
    M, K = A.shape
    N = B.shape[1]
    Bp = np.empty(packed_size(K, N, panel_width(np.float32)), np.float32)
    pack_b(B, Bp)
    C = np.empty(M * N, np.float32)
    old = numba.set_parallel_chunksize(1)
    f = lambda: run(A.reshape(-1), Bp, K, N, C, M)
    f()
    t = min(_timed(f) for _ in range(7))
    numba.set_parallel_chunksize(old)
    return 2 * M * N * K / t / 1e9


_FMA_LOOP = None


def _fma_loop():
    """A compiled loop of independent 512-bit FMAs on every thread (no memory traffic),
    built on first use: fmas(a, n) does THREADS * n * 12 vector FMAs."""
    global _FMA_LOOP
    if _FMA_LOOP is None:
        from numba import njit, prange
        from tblock.kernels.simd import vadd, vfma, vload, vsplat, vstore

        @njit(parallel=True)
        def fmas(a, n):
            for t in prange(THREADS):
                x = vload(a, 0)
                y = vload(a, 16)
                # 12 independent chains: more than FMA latency (4) x ports (2), so nothing waits
                c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = c9 = c10 = c11 = vsplat(a, 0.0)
                for _ in range(n):
                    c0 = vfma(x, y, c0); c1 = vfma(x, y, c1); c2 = vfma(x, y, c2); c3 = vfma(x, y, c3)
                    c4 = vfma(x, y, c4); c5 = vfma(x, y, c5); c6 = vfma(x, y, c6); c7 = vfma(x, y, c7)
                    c8 = vfma(x, y, c8); c9 = vfma(x, y, c9); c10 = vfma(x, y, c10); c11 = vfma(x, y, c11)
                s = vadd(vadd(vadd(c0, c1), vadd(c2, c3)), vadd(vadd(c4, c5), vadd(c6, c7)))
                vstore(a, 32 + 16 * t, vadd(s, vadd(vadd(c8, c9), vadd(c10, c11))))

        a = np.full(32 + 16 * THREADS, 1e-9, np.float32)
        fmas(a, 10)
        _FMA_LOOP = lambda n: fmas(a, n)
    return _FMA_LOOP


def fma_rate(n):
    """GFLOP/s of one run of the FMA loop (n iterations per thread), chunk size 1."""
    import numba
    loop = _fma_loop()
    old = numba.set_parallel_chunksize(1)
    try:
        return THREADS * n * 12 * 16 * 2 / _timed(lambda: loop(n)) / 1e9
    finally:
        numba.set_parallel_chunksize(old)


def measured_fma_peak():
    """float32 FMA throughput of this machine as a loop of independent 512-bit FMAs on
    every thread measures it (no memory traffic): the ceiling any kernel could reach,
    at the clock the cores really run while doing AVX-512 work.  Best of five."""
    return max(fma_rate(20_000_000) for _ in range(5))


def matched_efficiency(d, n_heads, T, pairs):
    """The block's causal GFLOP/s as a share of the FMA peak measured around the same
    call.  This machine is a shared VM whose speed swings: a peak measured once and a
    block timed a minute later can be from different machines.  So each block call sits
    between two short FMA bursts (~40 ms each when quiet) and is compared with their
    mean.  That tells two kinds of slow spell apart: when the cores themselves are
    shared, the bursts slow down with the block and the share holds; when only the block
    slows (contention in the memory system, which a register-only FMA loop never
    touches: the block streams its weights from the L3 the tenants share), the share
    drops.  Both kinds were seen."""
    f = block_case(d, n_heads, T)[2]
    f()
    n = 8_000_000
    fl = causal_flops(d, T)
    peaks, rates, shares = [fma_rate(n)], [], []
    for _ in range(pairs):
        rates.append(fl / _timed(f) / 1e9)
        peaks.append(fma_rate(n))
        shares.append(rates[-1] / ((peaks[-2] + peaks[-1]) / 2))
    return {"pairs": pairs, "median_share": float(np.median(shares)), "best_share": float(max(shares)),
            "worst_share": float(min(shares)), "block_gflops": rates, "peak_gflops": peaks, "shares": shares}


def nominal_peak():
    """Cores x MHz (from /proc/cpuinfo) x 2 FMA units x 16 float32 lanes x 2 FLOPs;
    only meaningful with AVX-512 and two FMA ports, and at the listed clock."""
    try:
        mhz = max(float(l.split(":")[1]) for l in open("/proc/cpuinfo") if l.startswith("cpu MHz"))
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags"))
    except (OSError, StopIteration, ValueError):
        return None
    lanes = 16 if "avx512f" in flags else 8
    return os.cpu_count() * mhz * 1e6 * 2 * lanes * 2 / 1e9


_MEM_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    import numpy as np
    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    import tblock
    base_import = hwm()
    tblock.warmup()            # loads the compiled kernels (Numba and LLVM take memory too)
    base_warm = hwm()
    d, T = int(sys.argv[1]), int(sys.argv[2])
    cfg = tblock.BlockConfig(d_model=d, n_heads=12)
    w = tblock.init_weights(cfg, seed=0, dtype=np.float32)
    H = np.random.default_rng(0).standard_normal((T, d)).astype(np.float32)
    t = time.perf_counter()
    out = tblock.forward(H, w, cfg, backend="numba")
    dt = time.perf_counter() - t
    print(json.dumps({"base_import_mib": base_import, "base_warm_mib": base_warm, "peak_mib": hwm(),
                      "seconds": dt, "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "finite": bool(np.isfinite(out).all())}))
""")


# The same measurement for the PyTorch block: its baseline is the RSS after `import torch`
# (which already holds torch's kernels and thread pools, ~200 MiB here).  The child does
# not import tblock (which would load Numba into it): it gets TorchBlock's
# source and draws the weights with numpy, the same way init_weights does.
_TORCH_MEM_CHILD = """
import json, sys, types
import numpy as np
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
import torch
import torch.nn.functional as F
base_import = hwm()
torch.set_num_threads(int(sys.argv[3]))
d, T = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
def normal(shape, scale):
    return (rng.standard_normal(shape) * scale).astype(np.float32)
w = types.SimpleNamespace(
    w_q=normal((d, d), d ** -0.5), w_k=normal((d, d), d ** -0.5), w_v=normal((d, d), d ** -0.5),
    w_o=normal((d, d), d ** -0.5), w_ff1=normal((d, 4 * d), (2 / d) ** 0.5),
    w_ff2=normal((4 * d, d), (2 / (4 * d)) ** 0.5))
%s
block = TorchBlock(w, 12).eval()
del w
x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, T, d)).astype(np.float32))
with torch.inference_mode():
    y = block(x)
print(json.dumps({"base_import_mib": base_import, "peak_mib": hwm(),
                  "finite": bool(torch.isfinite(y).all())}))
"""


def torch_memory(T):
    """Peak RSS of the PyTorch block's forward in a fresh process, above `import torch`
    (the weights and the input included, as for tblock)."""
    import inspect
    child = _TORCH_MEM_CHILD % textwrap.dedent(inspect.getsource(TorchBlock))
    p = subprocess.run([sys.executable, "-c", child, "768", str(T), str(THREADS)],
                       capture_output=True, text=True)
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1:]}
    r = json.loads(p.stdout)
    r["above_import_mib"] = r["peak_mib"] - r["base_import_mib"]
    return r


def memory(T):
    """Peak RSS (VmHWM) of one forward in a fresh process, above the RSS after
    `import tblock` and above the RSS after import + warmup()."""
    p = subprocess.run([sys.executable, "-c", _MEM_CHILD, "768", str(T)], capture_output=True, text=True)
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1:]}
    r = json.loads(p.stdout)
    r["above_import_mib"] = r["peak_mib"] - r["base_import_mib"]
    r["above_warm_mib"] = r["peak_mib"] - r["base_warm_mib"]
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--points", nargs="*", help="d:heads:T, default: the six of the brief")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    import numba
    numba.set_num_threads(THREADS)
    if torch is not None:
        torch.set_num_threads(THREADS)
    warmup()
    points = [tuple(int(x) for x in p.split(":")) for p in args.points] if args.points else POINTS
    results = {"threads": THREADS, "points": []}
    print(f"float32, batch 1, {THREADS} threads, causal Pre-LN, tanh GELU, no biases; medians of "
          f"alternating calls; torch {torch.__version__ if torch else 'not installed'}")
    print(f"{'d':>4} {'heads':>5} {'T':>5} {'tblock ms':>10} {'torch ms':>10} {'ratio':>6} {'reps':>5} "
          f"{'GFLOP/s':>8} {'best':>6} {'max rel diff':>12}")
    for d, h, T in points:
        r = bench_point(d, h, T, args.quick)
        r["gflops"] = causal_flops(d, T) / (r["tblock_ms"] / 1e3) / 1e9
        r["best_gflops"] = causal_flops(d, T) / (r["tblock_best_ms"] / 1e3) / 1e9
        results["points"].append(r)
        print(f"{d:>4} {h:>5} {T:>5} {r['tblock_ms']:>10.3f} {r.get('torch_ms', float('nan')):>10.3f} "
              f"{r.get('ratio', float('nan')):>6.2f} {r.get('reps', 0):>5} {r['gflops']:>8.1f} {r['best_gflops']:>6.1f} "
              f"{r.get('max_rel_diff', float('nan')):>12.1e}", flush=True)
    toy = toy_us(args.quick)
    results["toy"] = toy
    print(f"\ntoy d_model=8, 2 heads, T=4: {toy['tblock_us']:.2f} us per tblock.forward call, median of "
          f"7 batches (best batch {toy['tblock_best_us']:.2f})"
          + (f"; torch module call: {toy['torch_us']:.1f} us (best {toy['torch_best_us']:.1f})"
             if "torch_us" in toy else ""))
    g = best_gemm_gflops()
    results["gemm"] = g
    peak = nominal_peak()
    results["nominal_peak_gflops"] = peak
    best = max(v for k, v in g.items() if isinstance(v, float))
    print(f"best float32 GEMM 4096x768x3072, {THREADS} threads: "
          + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in g.items() if isinstance(v, float))
          + f"  [numpy BLAS: {g['numpy_blas']}]")
    if peak:
        print(f"nominal FMA peak (cpuinfo MHz x cores x 2 FMA x 16 lanes x 2): {peak:.1f} GFLOP/s")
    fma = measured_fma_peak()
    results["measured_fma_peak_gflops"] = fma
    print(f"measured FMA peak ({THREADS} threads of independent 512-bit FMAs): {fma:.1f} GFLOP/s")
    big = [r for r in results["points"] if r["d"] == 768 and r["T"] == 4096]
    if big:
        for what, gf in (("median call", big[0]["gflops"]), ("fastest call", big[0]["best_gflops"])):
            print(f"d_model=768, T=4096 causal, {what}: {gf:.1f} GFLOP/s = {100 * gf / best:.0f}% of the best "
                  f"measured GEMM, {100 * gf / fma:.0f}% of the measured FMA peak"
                  + (f", {100 * gf / peak:.0f}% of the nominal peak" if peak else ""))
        m = matched_efficiency(768, 12, 4096, 3 if args.quick else 9)
        results["matched_efficiency_768_4096"] = m
        print(f"d_model=768, T=4096 causal, each call against the FMA peak measured around it "
              f"({m['pairs']} calls): median {100 * m['median_share']:.0f}%, range "
              f"{100 * m['worst_share']:.0f}-{100 * m['best_share']:.0f}% (block "
              f"{np.median(m['block_gflops']):.0f} GFLOP/s, peak {np.median(m['peak_gflops']):.0f} GFLOP/s, medians)")
    if not args.no_memory:
        for T in (4096, 32768):
            m = memory(T)
            results[f"memory_T{T}"] = m
            if "error" in m:
                print(f"memory d_model=768 T={T}: failed: {m['error']}")
            else:
                print(f"memory d_model=768 T={T}: peak RSS {m['peak_mib']:.0f} MiB; above the RSS after "
                      f"`import tblock` ({m['base_import_mib']:.0f} MiB): {m['above_import_mib']:.0f} MiB, above "
                      f"the RSS after import + warmup() ({m['base_warm_mib']:.0f} MiB): {m['above_warm_mib']:.0f} MiB "
                      f"(weights and input included); forward took {m['seconds']:.2f} s, finite={m['finite']}")
        if torch is not None:
            m = torch_memory(4096)
            results["torch_memory_T4096"] = m
            if "error" in m:
                print(f"torch memory d_model=768 T=4096: failed: {m['error']}")
            else:
                print(f"torch memory d_model=768 T=4096: peak RSS {m['peak_mib']:.0f} MiB; above the RSS after "
                      f"`import torch` ({m['base_import_mib']:.0f} MiB): {m['above_import_mib']:.0f} MiB")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return results


if __name__ == "__main__":
    main()
