"""The machine's ceilings, measured: the FMA peak per dtype at tblock's vector width
(independent FMA chains on every thread, no memory traffic: the ceiling any kernel could
reach at the clock the cores really run), main memory's read and copy bandwidth (the
ceiling of a pass that streams more data than the caches hold, such as a decode step),
and the read bandwidth of each cache level (the ceiling of a call whose data a cache
keeps between calls)."""

from __future__ import annotations

import time

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


def fma_loop(threads, dtype="float32"):
    """fmas(n): threads x n x nacc vector FMAs of ``dtype``, no memory traffic; compiled on
    first use.  nacc is three quarters of the path's registers (24 on avx512, 12 on avx2):
    far more chains than FMA latency (4) x ports (2) needs, with x, y and spares left over."""
    key = (threads, np.dtype(dtype).name)
    if key not in _FMA:
        from numba import njit, prange

        from ..kernels import simd
        nacc = fma_registers() * 3 // 4
        ns = {"prange": prange,
              **{k: getattr(simd, k) for k in ("lanes", "vload", "vsplat", "vfma", "vadd", "vstore")}}
        exec(_fma_source(nacc), ns)
        fmas = njit(parallel=True)(ns["fmas"])
        L = simd.VECTOR_BYTES // np.dtype(dtype).itemsize
        a = np.full((2 + threads) * L, 1e-9, dtype)
        fmas(a, 10, threads)
        _FMA[key] = (lambda n: fmas(a, n, threads), nacc * L * 2)    # FLOPs per iteration per thread
    return _FMA[key]


def fma_rate(n, threads, dtype="float32"):
    """GFLOP/s of one run of the FMA loop (n iterations per thread), run as tblock's
    parallel calls are (parallel_call, on its thread count)."""
    from ..backends.numba.parallel import parallel_call
    loop, flops_per_iter = fma_loop(threads, dtype)
    return threads * n * flops_per_iter / seconds(parallel_call, loop, n) / 1e9


def measured_fma_peak(threads, runs, dtype="float32", n=20_000_000):
    """The FMA throughput of independent FMAs of ``dtype`` at tblock's vector width on every
    thread: the ceiling any kernel could reach, at the clock the cores really run at while
    doing that work.  Best of several runs of n iterations per thread."""
    return max(fma_rate(n, threads, dtype) for _ in range(runs))


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


# ----------------------------------------------------------------------------- memory bandwidth
# Decoding one token streams every weight once, so its floor is weight bytes / read
# bandwidth.  The kernels below stream a buffer far larger than the last-level cache with
# tblock's vector loads on every thread, each thread over one contiguous part of it.

_STREAM = {}


def _stream_kernels():
    """(read, copy), compiled on first use.  read: ``passes`` passes of 8 independent sums
    of vector loads per thread (one chain's add latency would hold a core to a few GB/s, as
    a plain float32 reduction loop that Numba does not vectorise does; several passes in one
    call let a buffer a cache holds be read from there, not from the call's start-up);
    copy: vector loads and stores."""
    if not _STREAM:
        from numba import njit, prange

        from ..kernels.simd import lanes, vadd, vhsum, vload, vsplat, vstore

        @njit(parallel=True)
        def read(a, out, nthreads, passes):
            L = lanes(a)
            step = 8 * L
            per = a.size // nthreads // step * step         # each thread's part, whole steps
            for t in prange(nthreads):
                c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = vsplat(a, 0.0)
                for _ in range(passes):
                    for i in range(t * per, (t + 1) * per, step):
                        c0 = vadd(c0, vload(a, i))
                        c1 = vadd(c1, vload(a, i + L))
                        c2 = vadd(c2, vload(a, i + 2 * L))
                        c3 = vadd(c3, vload(a, i + 3 * L))
                        c4 = vadd(c4, vload(a, i + 4 * L))
                        c5 = vadd(c5, vload(a, i + 5 * L))
                        c6 = vadd(c6, vload(a, i + 6 * L))
                        c7 = vadd(c7, vload(a, i + 7 * L))
                out[t] = vhsum(vadd(vadd(vadd(c0, c1), vadd(c2, c3)), vadd(vadd(c4, c5), vadd(c6, c7))))
            return nthreads * per * passes

        @njit(parallel=True)
        def copy(src, dst, nthreads):
            L = lanes(src)
            step = 4 * L
            per = src.size // nthreads // step * step
            for t in prange(nthreads):
                for i in range(t * per, (t + 1) * per, step):
                    vstore(dst, i, vload(src, i))
                    vstore(dst, i + L, vload(src, i + L))
                    vstore(dst, i + 2 * L, vload(src, i + 2 * L))
                    vstore(dst, i + 3 * L, vload(src, i + 3 * L))
            return nthreads * per

        _STREAM.update(read=read, copy=copy)
    return _STREAM["read"], _STREAM["copy"]


def memory_bandwidth(threads: int, nbytes: int = 1 << 30, runs: int = 10) -> dict:
    """Read and copy bandwidth of main memory in GB/s (1e9 bytes/s) on ``threads`` threads,
    run as tblock's parallel calls are (parallel_call).  read: one pass summing a float32
    buffer of ``nbytes`` (default 1 GiB, far past any L3); copy: its first half into its
    second, counting the bytes read plus the bytes written (STREAM's convention; the
    write-allocate reads are not counted).  Best and median of ``runs`` passes each,
    after one untimed pass that touches every page."""
    from ..backends.numba.parallel import parallel_call
    read, copy = _stream_kernels()
    a = np.ones(nbytes // 4, np.float32)            # written here: every page is touched now
    out = np.empty(threads, np.float32)
    half = a.size // 2
    src, dst = a[:half], a[half:2 * half]
    parallel_call(read, a, out, threads, 1)
    parallel_call(copy, src, dst, threads)
    reads, copies = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        n = parallel_call(read, a, out, threads, 1)
        reads.append(4 * n / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        n = parallel_call(copy, src, dst, threads)
        copies.append(2 * 4 * n / (time.perf_counter() - t0) / 1e9)
    return {"read_GBs": max(reads), "read_median_GBs": float(np.median(reads)), "copy_GBs": max(copies),
            "copy_median_GBs": float(np.median(copies)), "buffer_bytes": int(a.nbytes), "threads": threads,
            "runs": runs}


def read_pass(nbytes: int, threads: int):
    """A function that reads a float32 buffer of ``nbytes`` once on ``threads`` threads,
    as memory_bandwidth's read does: to time among other work in the same rounds, so that
    a memory-bound call and the floor it is held to see the same machine (a shared host's
    bandwidth swings by a third between moments)."""
    from ..backends.numba.parallel import parallel_call
    read, _ = _stream_kernels()
    a = np.ones(nbytes // 4, np.float32)            # written here: every page is touched now
    out = np.empty(threads, np.float32)

    def run():
        parallel_call(read, a, out, threads, 1)
    run()
    return run


def capacity(level: dict, threads: int) -> int:
    """Bytes of a cache level (tblock.perf.machine.cache_levels) that ``threads`` threads
    on as many cores hold together: one instance per core for a private level, one per
    ``shared_by`` cores for a shared one."""
    return level["bytes"] * -(-threads // level["shared_by"])


def cache_bandwidth(nbytes: int, threads: int, runs: int = 5, call_s: float = 0.02) -> dict:
    """Read bandwidth in GB/s over a float32 buffer of ``nbytes`` that stays in a cache:
    each thread sums its own part again and again in one call of about ``call_s`` seconds,
    so the cache's bandwidth is timed, not the pass that fills it, the call's start-up or
    a thread's wait for its core.  Best and median of ``runs`` calls."""
    from ..backends.numba.parallel import parallel_call
    read, _ = _stream_kernels()
    a = np.ones(max(nbytes // 4, 1), np.float32)
    out = np.empty(threads, np.float32)
    passes = max(1, (64 << 20) // a.nbytes)     # 64 MiB a call at least, then doubled
    while passes < 1 << 24:                     # until a call lasts call_s / 2
        t = min(seconds(parallel_call, read, a, out, threads, passes) for _ in range(3))
        if t >= call_s / 2:
            break
        passes *= 2
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        n = parallel_call(read, a, out, threads, passes)
        rates.append(4 * n / (time.perf_counter() - t0) / 1e9)
    return {"read_GBs": max(rates), "read_median_GBs": float(np.median(rates)), "buffer_bytes": int(a.nbytes),
            "passes": passes, "threads": threads, "runs": runs}


def read_bandwidths(threads: int, levels: list, runs: int = 5) -> list[dict]:
    """The read bandwidth of every cache level in ``levels`` and of main memory ("DRAM"), on
    ``threads`` threads, smallest level first.  A level's buffer is half of what the threads
    hold there together (capacity), so it stays in that level and not in a smaller one; main
    memory's is 8 times the largest cache, at least 256 MiB.  Each entry: name, capacity_bytes
    (None for DRAM), read_GBs (best), read_median_GBs, buffer_bytes."""
    out = []
    for lv in levels:
        cap = capacity(lv, threads)
        m = cache_bandwidth(cap // 2, threads, runs)
        out.append({"name": lv["name"], "capacity_bytes": cap, **m})
    dram = max([256 << 20] + [8 * e["capacity_bytes"] for e in out])
    m = memory_bandwidth(threads, nbytes=dram, runs=runs)
    out.append({"name": "DRAM", "capacity_bytes": None, "read_GBs": m["read_GBs"],
                "read_median_GBs": m["read_median_GBs"], "buffer_bytes": m["buffer_bytes"], "passes": 1,
                "threads": threads, "runs": runs})
    return out
