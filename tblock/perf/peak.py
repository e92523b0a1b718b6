"""The float32 FMA peak at tblock's vector width: independent FMA chains on every thread,
no memory traffic, the ceiling any kernel could reach at the clock the cores really run."""

from __future__ import annotations

import numpy as np

from .timing import seconds


def fma_registers():
    """Vector registers of tblock's path: 32 zmm on avx512, 16 ymm / xmm otherwise."""
    from ..kernels import isa
    return 32 if isa.PATH.name == "avx512" else 16


def _fma_source(nacc):
    """A prange loop over threads, each running nacc independent FMA chains on vectors
    of tblock's path (tblock.kernels.simd), written out: Numba cannot unroll a tuple of
    vectors in a loop."""
    acc = [f"c{i}" for i in range(nacc)]
    lines = ["def fmas(a, n, nthreads):",
             "    for t in prange(nthreads):",
             "        L = lanes(a)",
             "        x = vload(a, 0)",
             "        y = vload(a, L)"]
    lines += [f"        {c} = vsplat(a, 0.0)" for c in acc]
    lines += ["        for _ in range(n):"] + [f"            {c} = vfma(x, y, {c})" for c in acc]
    lines += ["        s = c0"] + [f"        s = vadd(s, {c})" for c in acc[1:]]
    lines += ["        vstore(a, (2 + t) * L, s)"]
    return "\n".join(lines)


_FMA = {}


def fma_loop(threads):
    """fmas(n): threads x n x nacc vector FMAs, no memory traffic; compiled on first use.
    nacc is three quarters of the path's registers (24 on avx512, 12 on avx2): far more
    chains than FMA latency (4) x ports (2) needs, with x, y and spares left over."""
    if threads not in _FMA:
        from numba import njit, prange

        from ..kernels import simd
        nacc = fma_registers() * 3 // 4
        ns = {"prange": prange,
              **{k: getattr(simd, k) for k in ("lanes", "vload", "vsplat", "vfma", "vadd", "vstore")}}
        exec(_fma_source(nacc), ns)
        fmas = njit(parallel=True)(ns["fmas"])
        L = simd.VECTOR_BYTES // 4
        a = np.full((2 + threads) * L, 1e-9, np.float32)
        fmas(a, 10, threads)
        _FMA[threads] = (lambda n: fmas(a, n, threads), nacc * L * 2)    # FLOPs per iteration per thread
    return _FMA[threads]


def fma_rate(n, threads):
    """GFLOP/s of one run of the FMA loop (n iterations per thread), run as tblock's
    parallel calls are (parallel_call: its thread count, chunk size 1)."""
    from ..backends.numba import parallel_call
    loop, flops_per_iter = fma_loop(threads)
    return threads * n * flops_per_iter / seconds(parallel_call, loop, n) / 1e9


def measured_fma_peak(threads, runs):
    """The float32 FMA throughput of independent FMAs of tblock's vector width on every
    thread: the ceiling any kernel could reach, at the clock the cores really run at while
    doing that work.  Best of several runs."""
    return max(fma_rate(20_000_000, threads) for _ in range(runs))


def nominal_peak(threads):
    """(GFLOP/s, MHz): threads x MHz (/proc/cpuinfo) x 2 FMA ports x float32 lanes of
    tblock's path x 2; meaningful only with two FMA ports of that width, at the listed clock
    (a VM may list the base clock while the cores boost above it)."""
    from ..kernels import isa
    try:
        mhz = max(float(l.split(":")[1]) for l in open("/proc/cpuinfo") if l.startswith("cpu MHz"))
    except (OSError, ValueError):
        return None, None
    return threads * mhz * 1e6 * 2 * (isa.PATH.vector_bytes // 4) * 2 / 1e9, mhz
