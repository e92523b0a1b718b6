"""The machine a measurement ran on, and the thread counts every library runs at."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import numpy as np

from .._runtime import usable_cores

PACKAGE = Path(__file__).resolve().parent.parent     # tblock/


def package_version(module):
    """``module.__version__``, or None when it does not import."""
    try:
        return __import__(module).__version__
    except Exception:
        return None


def cpu_info() -> dict:
    """CPU model and family of the first processor in /proc/cpuinfo (a VM's model name can
    be as short as 'AMD EPYC'; family and model tell the generation)."""
    keys = {"model name": "model", "vendor_id": "vendor", "cpu family": "family", "model": "model_id",
            "stepping": "stepping", "cpu MHz": "mhz"}
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break                       # the end of the first processor's block
                k, _, v = line.partition(":")
                if k.strip() in keys:
                    info[keys[k.strip()]] = v.strip()
    except OSError:
        pass
    info.setdefault("model", platform.processor() or platform.machine())
    return info


def cpu_model() -> str:
    return cpu_info()["model"]


def _cpu_count(cpu_list: str) -> int:
    """CPUs in a /sys CPU list such as "0-1,4"."""
    n = 0
    for part in cpu_list.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def cache_levels() -> list[dict]:
    """The data caches of the first CPU, smallest level first, from /sys: {"name": "L2",
    "bytes": one instance's size, "shared_by": CPUs sharing that instance}; [] where the
    system does not say."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (d / "type").read_text().strip() == "Instruction":
                continue
            size = (d / "size").read_text().strip()
            level = int((d / "level").read_text())
            out.append({"name": f"L{level}", "bytes": int(size.rstrip("KMG")) * units.get(size[-1], 1),
                        "shared_by": _cpu_count((d / "shared_cpu_list").read_text().strip())})
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda c: c["name"])


def blas_info() -> list:
    try:
        from threadpoolctl import threadpool_info
        return [{k: i.get(k) for k in ("user_api", "internal_api", "prefix", "version", "architecture",
                                      "threading_layer", "num_threads", "filepath")} for i in threadpool_info()]
    except ImportError:
        try:
            return [np.show_config(mode="dicts")["Build Dependencies"]["blas"]]
        except Exception as e:
            return [f"unknown ({e})"]


def git_commit() -> str | None:
    """The commit of the checkout this package runs from, or None: an installed copy that
    merely sits inside some repository (a venv in a project) is not that repository's code."""
    git = ["git", "-C", str(PACKAGE)]
    try:
        tracked = subprocess.run(git + ["ls-files", "--error-unmatch", "--", "__init__.py"],
                                 capture_output=True, text=True, timeout=5)
        if tracked.returncode != 0:
            return None
        r = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    """tblock's, its dependencies' and the installed peers' versions (None: not installed)."""
    from .. import __version__, peers
    return {"tblock": __version__, "numpy": np.__version__,
            **{m: package_version(m) for m in ("scipy", "numba", "cffi", "matplotlib", "threadpoolctl")},
            **peers.peer_versions()}


def vector_path() -> dict:
    """The vector path tblock's kernels are compiled for (tblock.kernels.isa.PATH)."""
    from ..kernels import isa, tiles
    p = isa.PATH
    return {"name": p.name, "vector_bytes": p.vector_bytes, "nv": tiles.NV, "kc": tiles.KC, "cpu": p.cpu,
            "forced": p.forced, "runnable": list(p.runnable)}


def machine_info() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(), "cores": os.cpu_count(), "usable_cores": usable_cores(),
        "platform": platform.platform(), "python": platform.python_version(),
        "versions": versions(),
        "git_commit": git_commit(),
        "blas": blas_info(),
        "loadavg_start": list(load) if load else None,
    }


def pin_threads(n: int, with_torch: bool):
    """Numba, the BLAS (and OpenMP) pools and torch all at ``n`` threads; returns the counts
    actually in force and a function that puts the previous ones back."""
    from .. import _runtime      # the numba backend's count, applied to each of its calls
    counts = {"requested": n}
    undo = []
    old = _runtime.get_num_threads()
    _runtime.set_num_threads(min(n, _runtime.pool_size()))
    counts["numba"] = _runtime.get_num_threads()
    undo.append(lambda: _runtime.set_num_threads(old))
    if with_torch:
        import torch        # before threadpoolctl, so it also limits torch's OpenMP pool
        old_t = torch.get_num_threads()
        torch.set_num_threads(n)
        counts["torch"] = torch.get_num_threads()
        undo.append(lambda: torch.set_num_threads(old_t))
    try:
        import scipy.linalg  # noqa: F401  (loads scipy's own OpenBLAS, which numba's np.dot calls)
    except ImportError:
        pass
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        counts["blas"] = "not pinned: threadpoolctl is not installed"
    else:
        undo.append(threadpool_limits(limits=n).restore_original_limits)
        # one entry per loaded library: numpy and scipy each bundle an OpenBLAS, and
        # torch and numba's OpenMP layer may each bring a libgomp
        counts["blas"] = {f"{i['prefix']} {i.get('version') or os.path.basename(i['filepath'])}":
                          i["num_threads"] for i in threadpool_info()}

    def restore():
        for f in reversed(undo):
            f()
    return counts, restore


@contextlib.contextmanager
def pinned_threads(n: int, with_torch: bool):
    """The body runs with every library at ``n`` threads (pin_threads); yields the counts."""
    counts, restore = pin_threads(n, with_torch)
    try:
        yield counts
    finally:
        restore()
