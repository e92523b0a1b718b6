"""The limits the report's timings are read against, measured in the report's own run: the
FMA peak per dtype of the vector path tblock runs (tblock.isa()), the read bandwidth of every
cache level and of main memory, and the BLAS's best GEMM, kept as a reference and labelled
with the kernel the BLAS chose."""

from __future__ import annotations

import os
import re

import numpy as np

from ..perf import blas_info, measure, vector_path
from ..perf.machine import cache_levels

DTYPES = ("float32", "float64")


def blas_gemm(sizes, repeats: int, with_torch: bool, label: dict | None = None) -> dict:
    """Best GFLOP/s of an n x n matmul through numpy's BLAS (and torch's, when timed), per
    dtype: a reference line, not a limit (a BLAS may run a narrower kernel than the FMA peak's).
    2 n^3 FLOPs per product. ``label``: library -> what runs its matmul (blas_kernel)."""
    label = label or {}
    out = {}
    rng = np.random.default_rng(0)
    for dtype in DTYPES:
        runs = []
        for n in sizes:
            a = rng.standard_normal((n, n)).astype(dtype)
            b = rng.standard_normal((n, n)).astype(dtype)
            m = measure(np.matmul, (a, b), repeats, 0.05)
            runs.append({"library": "numpy", "n": n, "gflops": 2 * n ** 3 / m["min_s"] / 1e9})
            if with_torch:
                import torch
                ta, tb = torch.from_numpy(a), torch.from_numpy(b)
                m = measure(torch.mm, (ta, tb), repeats, 0.05)
                runs.append({"library": "torch", "n": n, "gflops": 2 * n ** 3 / m["min_s"] / 1e9})
        best = max(runs, key=lambda r: r["gflops"])
        lib = best["library"]
        out[dtype] = {"gflops": best["gflops"], "runs": runs,
                      "source": f"{lib} matmul n={best['n']}" + (f": {label[lib]}" if label.get(lib) else "")}
    return out


def blas_kernel() -> dict:
    """What runs numpy's (and torch's) matmul: the BLAS, its version and, for OpenBLAS, the
    kernel it chose for this CPU (threadpoolctl's "architecture"), with a note when the
    environment chose it instead (OPENBLAS_CORETYPE)."""
    import numpy
    libs = [i for i in blas_info() if isinstance(i, dict) and i.get("user_api") == "blas"]
    own = os.path.dirname(os.path.dirname(numpy.__file__))
    # numpy's own wheel bundles its BLAS in numpy.libs; a system numpy links the system's
    mine = [i for i in libs if os.path.dirname(i.get("filepath") or "").startswith(os.path.join(own, "numpy"))]
    lib = (mine or libs or [{}])[0]
    name = {"openblas": "OpenBLAS", "mkl": "MKL", "blis": "BLIS"}.get(lib.get("internal_api"), lib.get("internal_api"))
    out = {"name": name or "unknown", "version": lib.get("version"), "kernel": lib.get("architecture"),
           "env": {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_VERBOSE", "MKL_ENABLE_INSTRUCTIONS")
                   if k in os.environ}, "note": None}
    if name == "OpenBLAS" and "OPENBLAS_CORETYPE" in os.environ:
        out["note"] = (f"OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} is set in this environment: OpenBLAS "
                       "runs the kernel named there, not the one it would choose for this CPU")
    out["label"] = {"numpy": " ".join(str(x) for x in (out["name"], out["version"]) if x)
                    + (f", {out['kernel']} kernel" if out["kernel"] else "")}
    try:
        import torch
    except ImportError:
        return out
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    out["label"]["torch"] = (f"torch's {blas.group(1).upper() if blas else 'BLAS'}, "
                             f"{torch.backends.cpu.get_cpu_capability()} dispatch")
    return out


def fma_peak(threads: int, dtype: str, runs: int) -> float:
    from ..perf import peak          # compiles its loop on first use
    return peak.measured_fma_peak(threads, runs, dtype)


def measure_limits(threads: int, gemm_sizes, with_torch: bool, runs: int = 3) -> dict:
    """Every limit, measured now on ``threads`` threads (see the module's docstring)."""
    from ..perf import peak
    p = vector_path()
    kernel = blas_kernel()
    out = {"isa": {"name": p["name"], "vector_bytes": p["vector_bytes"], "forced": p["forced"],
                   "registers": peak.fma_registers()},
           "threads": threads, "peak": {}, "bandwidth": [], "blas": kernel,
           "blas_gemm": blas_gemm(gemm_sizes, 3, with_torch, kernel["label"])}
    for dt in DTYPES:
        lanes = p["vector_bytes"] // np.dtype(dt).itemsize
        g = fma_peak(threads, dt, runs)
        out["peak"][dt] = {"gflops": g, "samples_gflops": [g], "lanes": lanes,
                           "accumulators": peak.fma_registers() * 3 // 4}
    for lv in peak.read_bandwidths(threads, cache_levels()):
        out["bandwidth"].append({**lv, "samples_GBs": [lv["read_GBs"]]})
    return out


def remeasure(limits: dict, runs: int = 3) -> None:
    """Measure the peaks and bandwidths again (between the backends' sweeps and at the end)
    and keep the best of every measurement so far: a limit is what the machine can do, and
    a moment when other processes held a core only hides it."""
    from ..perf import peak
    threads = limits["threads"]
    for dt, p in limits["peak"].items():
        p["samples_gflops"].append(fma_peak(threads, dt, runs))
        p["gflops"] = max(p["samples_gflops"])
    for lv in limits["bandwidth"]:
        if lv["name"] == "DRAM":
            m = peak.memory_bandwidth(threads, nbytes=lv["buffer_bytes"], runs=lv["runs"])
        else:
            m = peak.cache_bandwidth(lv["buffer_bytes"], threads, lv["runs"])
        lv["samples_GBs"].append(m["read_GBs"])
        lv["read_GBs"] = max(lv["samples_GBs"])
