"""``tblock report``: where the time of one block goes, and where attention overtakes the FFN.

The report measures the machine's GEMM ceilings, then sweeps the sequence length T for one
block config and times every component (tblock.backends) of every backend separately,
next to the FLOPs tblock.flops gives for it. It writes a folder (report.md, report.json,
PNG plots) and prints a summary. The FLOP model says scores + AV (4 T^2 d_model for the full
square, about half that causal) catch up with the FFN's 4 T d_model d_ff at T = d_ff
(4 d_model), or about 8 d_model causal; the report puts the measured crossover next to it.

``tblock report --compare A.json B.json`` prints two saved reports side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import io
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import api, peers
from .backends import REFERENCES, components
from .backends.components import COMPONENTS, component_flops, sublayer_crossover_T
from .config import BlockConfig
from .counting import crossover_T, param_count
from .weights import init_weights
from .worked_example import LESSON_PRINTED, load_worked_example

SCHEMA = "tblock-report/1"
PLOTS = ("time_vs_T.png", "flops_vs_T.png", "gflops_vs_T.png")
LABELS = {"layernorm": "layernorm", "softmax": "softmax", "attention_core": "attn core",
          "attention": "attention", "ffn": "ffn", "block": "block"}


class ReportError(ValueError):
    """A bad option, or an --out folder that gained foreign files during the run: the CLI
    prints it and exits with status 2, having written nothing."""


# ---------------------------------------------------------------------------------------
# the foundation's worked example, kept: every backend against the lesson's printed numbers

def entropy_bits(A):
    """Row entropies of an attention matrix in bits (0 log 0 = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(A > 0, -A * np.log2(A), 0.0)
    return terms.sum(axis=-1)


def worked_example_rows(backend: str) -> list[tuple[str, object, object]]:
    """(quantity, lesson's printed value, ours) for the worked example on one backend."""
    ex = load_worked_example()
    _, tr = api.forward(ex.H_in, ex.weights, ex.cfg, backend=backend, trace=True)
    n = np.linalg.norm
    return [
        ("|H_in|", LESSON_PRINTED["norm_H_in"], n(ex.H_in)),
        ("|H_mid|", LESSON_PRINTED["norm_H_mid"], n(tr.H_mid)),
        ("|H_out|", LESSON_PRINTED["norm_H_out"], n(tr.H_out)),
        ("|A_out|/|H_in|", LESSON_PRINTED["mha_ratio"], n(tr.A_out) / n(ex.H_in)),
        ("|F_out|/|H_mid|", LESSON_PRINTED["ffn_ratio"], n(tr.F_out) / n(tr.H_mid)),
        ("H_mid row 1 [:4]", LESSON_PRINTED["H_mid_row1_first4"], tr.H_mid[0, :4]),
        ("head 2 row 4 taps", LESSON_PRINTED["A_2_row4"], tr.A[1, 3]),
        ("entropy head 1 (bits)", LESSON_PRINTED["entropy_head1_bits"], entropy_bits(tr.A[0])),
        ("entropy head 2 (bits)", LESSON_PRINTED["entropy_head2_bits"], entropy_bits(tr.A[1])),
        ("max |H_out - lesson|", 0.0, float(np.max(np.abs(tr.H_out - ex.expected["H_out"])))),
    ]


def _fmt(v):
    if np.ndim(v) == 0:
        return repr(float(v))
    return "[" + ", ".join(f"{float(x):.6f}" for x in np.ravel(v)) + "]"


def _jsonable(v):
    return float(v) if np.ndim(v) == 0 else [float(x) for x in np.ravel(v)]


# ---------------------------------------------------------------------------------------
# options

@dataclass
class ReportOptions:
    d_model: int = 384
    n_heads: int = 6
    T_list: list = field(default_factory=list)
    backends: list = field(default_factory=list)
    unavailable: dict = field(default_factory=dict)   # default backends that cannot run here -> why
    dtype: str = "float32"
    causal: bool = True
    out: str = "tblock-report"
    mode: str = "quick"
    threads: int = 1
    repeats: int = 3
    min_repeat_s: float = 0.01      # tiny calls are looped until one repeat lasts this long
    target_s: float = 0.1           # cheap points get more repeats, up to about this long
    point_budget_s: float = 8.0     # a backend stops once one T would take longer than this
    mem_limit_bytes: int = 2 << 30  # skip a component whose (n_heads, T, T) arrays would exceed it
    ceiling_sizes: tuple = (1024, 2048)
    plots: bool = True
    seed: int = 0
    peers: list | None = None       # whole-block peers to time after the sweep; None: every installed one


MODES = {
    # (T_max in d_model, points per doubling of T, repeats, min_repeat_s, target_s, point budget s)
    "quick": (8, 1, 3, 0.01, 0.1, 8.0),
    "full": (16, 2, 7, 0.05, 0.5, 120.0),
}


def default_T_list(d_model: int, mode: str, T_min: int | None = None, T_max: int | None = None) -> list[int]:
    """Geometric T from d_model/8 to 8 d_model (16 d_model with --full); the points land on
    d_model * 2^k, so 4 d_model and 8 d_model, the FLOP model's crossovers, are measured."""
    top, per_doubling = MODES[mode][0], MODES[mode][1]
    lo = max(1, d_model // 8) if T_min is None else T_min
    hi = top * d_model if T_max is None else T_max
    grid = set()
    for k in range(-40 * per_doubling, 40 * per_doubling + 1):
        T = int(round(d_model * 2.0 ** (k / per_doubling)))
        if lo <= T <= hi:
            grid.add(T)
    grid.update(T for T in (lo, hi) if T >= 1)      # the requested ends are always measured
    return sorted(grid)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``report`` subcommand's options (tblock.cli builds the parser)."""
    p.add_argument("--d-model", type=int, default=384, help="d_model of the swept block (default 384)")
    p.add_argument("--n-heads", type=int, default=None,
                   help="heads (default d_model/64: 6 for 384, 12 for 768)")
    p.add_argument("--T-min", type=int, default=None, help="smallest T of the sweep (default d_model/8)")
    p.add_argument("--T-max", type=int, default=None,
                   help="largest T of the sweep (default 8*d_model, 16*d_model with --full)")
    p.add_argument("--T-list", default=None, help="explicit comma-separated T values, e.g. 64,256,1024")
    p.add_argument("-T", "--tokens", type=int, default=None, help="time a single T (same as --T-list T)")
    p.add_argument("--backends", default=None,
                   help=f"comma-separated, from {','.join(components.BACKENDS)} (default: every one that runs here)")
    p.add_argument("--dtype", default="float32", help="float32 (default) or float64")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                   help="causal mask (default) or the full square (--no-causal)")
    p.add_argument("--out", default="tblock-report", help="report folder (default ./tblock-report)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="the default: T up to 8*d_model, 3 repeats; under 2 minutes on 2 cores")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="T up to 16*d_model at sqrt(2) steps, 7 repeats, larger budgets")
    p.set_defaults(mode="quick")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for numba, BLAS and torch (default: every core this process may use)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per point (median reported)")
    p.add_argument("--point-budget", type=float, default=None,
                   help="seconds one backend may spend on one T; larger T are skipped once exceeded "
                        "(default 8 quick, 120 full)")
    p.add_argument("--target-time", type=float, default=None,
                   help="seconds a cheap point keeps repeating for a sturdier median (default 0.1 quick, 0.5 full)")
    p.add_argument("--ceiling-sizes", default=None,
                   help="comma-separated n of the n x n GEMMs that measure the ceiling "
                        "(default 1024,2048; --full adds 512 and 3072)")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    p.add_argument("--peers", default=None,
                   help=f"comma-separated, from {','.join(peers.PEERS)}, or none: other libraries' whole "
                        "block timed after the sweep, float32 only (default: every one installed)")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                   help="print two saved report.json side by side with ratios, then exit")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not on Linux
        return os.cpu_count() or 1


def _positive(name, value):
    if value is not None and value < 1:
        raise ReportError(f"{name} must be >= 1, got {value}")


def resolve_options(args: argparse.Namespace) -> ReportOptions:
    """Check every option and turn the namespace into ReportOptions; raises ReportError
    naming the option, before anything is measured or written."""
    _positive("--d-model", args.d_model)
    d_model = args.d_model
    if args.n_heads is None:
        if d_model % 64:
            raise ReportError(f"--n-heads is needed: d_model={d_model} is not a multiple of 64, "
                              "so there is no default head count")
        n_heads = d_model // 64
    else:
        _positive("--n-heads", args.n_heads)
        n_heads = args.n_heads
    if d_model % n_heads:
        raise ReportError(f"--n-heads: d_model={d_model} is not divisible by n_heads={n_heads}")
    if args.dtype not in ("float32", "float64"):
        raise ReportError(f"--dtype must be float32 or float64, got {args.dtype!r}")

    explicit = [args.T_list is not None, args.tokens is not None, args.T_min is not None or args.T_max is not None]
    if sum(explicit) > 1:
        raise ReportError("--T-list, -T/--tokens and --T-min/--T-max cannot be combined: give one of them")
    if args.T_list is not None:
        try:
            T_list = sorted({int(x) for x in args.T_list.split(",") if x.strip()})
        except ValueError:
            raise ReportError(f"--T-list must be comma-separated integers, got {args.T_list!r}") from None
        if not T_list:
            raise ReportError("--T-list is empty: the T range must hold at least one T")
        if T_list[0] < 1:
            raise ReportError(f"--T-list values must be >= 1, got {T_list[0]}")
    elif args.tokens is not None:
        _positive("-T/--tokens", args.tokens)
        T_list = [args.tokens]
    else:
        _positive("--T-min", args.T_min)
        _positive("--T-max", args.T_max)
        lo = max(1, d_model // 8) if args.T_min is None else args.T_min
        hi = MODES[args.mode][0] * d_model if args.T_max is None else args.T_max
        if lo > hi:
            raise ReportError(f"the T range is empty: --T-min {lo} is greater than --T-max {hi}")
        T_list = default_T_list(d_model, args.mode, lo, hi)

    unavailable = {}
    if args.backends is None:
        backends = []
        for b in components.BACKENDS:
            ok, why = components.backend_status(b)
            (backends.append(b) if ok else unavailable.__setitem__(b, why))
    else:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        if not backends:
            raise ReportError("--backends is empty: name at least one backend")
        for b in backends:
            if b not in components.BACKENDS:
                raise ReportError(f"--backends: unknown backend {b!r}; choose from {', '.join(components.BACKENDS)}")
            ok, why = components.backend_status(b)
            if not ok:
                raise ReportError(f"--backends: backend {b!r} cannot run here: {why}")
        backends = list(dict.fromkeys(backends))     # drop repeats, keep the order

    threads = usable_cores() if args.threads is None else args.threads
    _positive("--threads", threads)
    _positive("--repeats", args.repeats)
    if args.point_budget is not None and not args.point_budget > 0:
        raise ReportError(f"--point-budget must be > 0 seconds, got {args.point_budget}")
    if args.target_time is not None and not (math.isfinite(args.target_time) and args.target_time >= 0):
        raise ReportError(f"--target-time must be a finite number of seconds >= 0, got {args.target_time}")
    ceiling_sizes = (1024, 2048) if args.mode == "quick" else (512, 1024, 2048, 3072)
    if args.ceiling_sizes is not None:
        try:
            ceiling_sizes = tuple(int(x) for x in args.ceiling_sizes.split(",") if x.strip())
        except ValueError:
            raise ReportError(f"--ceiling-sizes must be comma-separated integers, got {args.ceiling_sizes!r}") from None
        if not ceiling_sizes or min(ceiling_sizes) < 1:
            raise ReportError(f"--ceiling-sizes must hold at least one n >= 1, got {args.ceiling_sizes!r}")
    peer_names = None
    if args.peers is not None:
        peer_names = [x.strip() for x in args.peers.split(",") if x.strip() and x.strip() != "none"]
        for x in peer_names:
            if x not in peers.PEERS:
                raise ReportError(f"--peers: unknown peer {x!r}; choose from {', '.join(peers.PEERS)}, or none")
        peer_names = list(dict.fromkeys(peer_names))
    out = check_out_folder(args.out)
    _, _, repeats, min_repeat_s, target_s, budget = MODES[args.mode]
    return ReportOptions(
        d_model=d_model, n_heads=n_heads, T_list=T_list, backends=backends, unavailable=unavailable,
        dtype=args.dtype, causal=args.causal, out=str(out), mode=args.mode, threads=threads,
        repeats=repeats if args.repeats is None else args.repeats, min_repeat_s=min_repeat_s,
        target_s=target_s if args.target_time is None else args.target_time,
        point_budget_s=budget if args.point_budget is None else args.point_budget,
        ceiling_sizes=ceiling_sizes,
        plots=args.plots, peers=peer_names)


def not_written_by_tblock(folder: Path) -> list[str]:
    """The entries of ``folder`` that a tblock report did not write: all of them unless its
    report.json carries a tblock report schema, else all but report.json, report.md, the plots."""
    names = sorted(p.name for p in folder.iterdir())
    try:
        schema = json.loads((folder / "report.json").read_text()).get("schema")
    except (OSError, ValueError, AttributeError):      # missing, not JSON, not an object
        schema = None
    if not (isinstance(schema, str) and schema.startswith("tblock-report/")):
        return names
    ours = {"report.json", "report.md", *PLOTS}
    return [n for n in names if n not in ours or (folder / n).is_symlink() or not (folder / n).is_file()]


def _refuse_foreign(out: str, folder: Path) -> None:
    foreign = not_written_by_tblock(folder)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ReportError(f"--out {out!r} holds files a tblock report did not write ({shown}); refusing "
                          "to replace it: choose a new or empty folder, or one that holds only a tblock report")


def check_out_folder(out: str) -> Path:
    """The report folder must be creatable, or empty, or hold nothing but a previous tblock
    report (which is replaced whole); checked by really creating and removing a probe
    folder, since os.access lies to root."""
    path = Path(out).expanduser().absolute()
    if path.exists():
        if not path.is_dir():
            raise ReportError(f"--out {out!r} exists and is not a folder")
        _refuse_foreign(out, path)
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ReportError(f"--out {out!r} cannot be created: {ancestor} is not a folder")
    try:
        probe = tempfile.mkdtemp(prefix=".tblock-probe-", dir=ancestor)
        os.rmdir(probe)
    except OSError as e:
        raise ReportError(f"--out {out!r} is not writable: {e.strerror} in {ancestor}") from None
    return path


# ---------------------------------------------------------------------------------------
# the machine: threads, versions, BLAS

@contextlib.contextmanager
def pinned_threads(n: int, with_torch: bool):
    """Run the body with numba, the BLAS (and OpenMP) pools and torch all at ``n`` threads;
    yields the counts actually in force, and restores the previous ones."""
    counts = {"requested": n}
    undo = []
    from . import _runtime      # the numba backend's count, applied to each of its calls
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
        limiter = contextlib.nullcontext()
    else:
        limiter = threadpool_limits(limits=n)
    try:
        with limiter:
            if "blas" not in counts:
                # one entry per loaded library: numpy and scipy each bundle an OpenBLAS, and
                # torch and numba's OpenMP layer may each bring a libgomp
                counts["blas"] = {f"{i['prefix']} {i.get('version') or os.path.basename(i['filepath'])}":
                                  i["num_threads"] for i in threadpool_info()}
            yield counts
    finally:
        for f in reversed(undo):
            f()


def _version(module):
    try:
        return __import__(module).__version__
    except Exception:
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
    here = Path(__file__).resolve().parent
    git = ["git", "-C", str(here)]
    try:
        tracked = subprocess.run(git + ["ls-files", "--error-unmatch", "--", "__init__.py"],
                                 capture_output=True, text=True, timeout=5)
        if tracked.returncode != 0:
            return None
        r = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict:
    from . import __version__
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(), "cores": os.cpu_count(), "usable_cores": usable_cores(),
        "platform": platform.platform(), "python": platform.python_version(),
        "versions": {"tblock": __version__, "numpy": np.__version__, "scipy": _version("scipy"),
                     "numba": _version("numba"), "cffi": _version("cffi"),
                     "matplotlib": _version("matplotlib"), "threadpoolctl": _version("threadpoolctl"),
                     **peers.peer_versions()},
        "git_commit": git_commit(),
        "blas": blas_info(),
        "loadavg_start": list(load) if load else None,
    }


# ---------------------------------------------------------------------------------------
# timing

def measure(fn, args, repeats: int, min_repeat_s: float, target_s: float = 0.0) -> dict:
    """Time ``fn(*args)``: the first call on its own (compilation and first touch land there),
    a second call to size the loop, then at least ``repeats`` repeats of ``inner`` calls each
    (more, up to 25, while they fit in ``target_s``: cheap points get a sturdier median on a
    noisy machine); per-call median and minimum over the repeats."""
    t0 = time.perf_counter()
    fn(*args)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn(*args)
    second = time.perf_counter() - t0
    # loop short calls so a repeat is well above the timer's resolution and call overhead
    inner = int(min(10_000, max(1, math.ceil(min_repeat_s / max(second, 1e-9)))))
    n = max(repeats, min(25, int(target_s / max(inner * second, 1e-9))))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        times.append((time.perf_counter() - t0) / inner)
    return {"first_call_s": first, "median_s": statistics.median(times), "min_s": min(times),
            "times_s": times, "inner": inner, "repeats": n}


def gemm_ceilings(sizes, repeats: int, with_torch: bool) -> dict:
    """Best GFLOP/s of an n x n matmul through numpy's BLAS (and torch's, when timed), per dtype:
    the yardstick for '% of ceiling'. 2 n^3 FLOPs per product."""
    out = {}
    rng = np.random.default_rng(0)
    for dtype in ("float32", "float64"):
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
        out[dtype] = {"gflops": best["gflops"], "source": f"{best['library']} matmul n={best['n']}", "runs": runs}
    return out


class Progress:
    """A text progress bar on stderr: redrawn in place on a terminal, a line per step otherwise."""

    def __init__(self, total: int, stream=None, width: int = 28):
        self.total, self.done, self.width = max(1, total), 0, width
        self.stream = sys.stderr if stream is None else stream
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()

    def step(self, label: str, n: int = 1):
        self.done = min(self.total, self.done + n)
        filled = self.width * self.done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"[{bar}] {self.done:>3}/{self.total} {time.perf_counter() - self.t0:6.1f}s {label}"
        if self.tty:
            self.stream.write("\r" + line[:110].ljust(110))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# ---------------------------------------------------------------------------------------
# the sweep

def _point_memory(cfg, T, component, backend, dtype) -> int:
    """Rough peak bytes of one component call, its inputs included: the (n_heads, T, T)
    arrays dominate."""
    if component not in ("softmax", "attention_core", "attention", "block"):
        return 0
    # the numpy oracle keeps every head's float64 A plus masks and temporaries
    item = 8 if backend in ("numpy", "c") else np.dtype(dtype).itemsize
    square = cfg.n_heads * T * T * item
    if component == "softmax":
        return 3 * square                     # input (drawn in float64 first), output
    if backend == "numpy":
        return 3 * square
    return 2 * T * T * 8 if backend == "c" else 0     # C: one head's scores and A; numba tiles


def estimate_point_s(rows: list, T_next: int, cfg: BlockConfig, repeats: int, square: str = "full") -> float:
    """Seconds one backend would spend on T_next: each component's fastest call at the last T,
    scaled by the FLOPs of the work it really does (the whole square for the oracle and the
    C reference, the causal triangle for kernels that skip masked tiles), times the calls
    a measurement makes."""
    kind = "causal" if (cfg.causal and square == "causal") else "full"
    fl = component_flops(cfg, T_next)[kind]
    return sum(r["min_s"] * fl[r["component"]] / r[f"flops_{kind}"] * (repeats + 2)
               for r in rows if r["status"] == "ok")


def run_sweep(opts: ReportOptions, sets: dict, progress: Progress | None = None) -> dict:
    """Time every component of every prepared backend at every T; returns the JSON-ready
    results. Backend by backend, so one library's idle-spinning thread pool (OpenBLAS spins
    for a while after each call) does not steal cores from the next library's calls."""
    cfg = BlockConfig(d_model=opts.d_model, n_heads=opts.n_heads, causal=opts.causal)
    dtype = np.dtype(opts.dtype)
    kind = "causal" if cfg.causal else "full"
    per_backend = {}
    for b in opts.backends:
        cs = sets[b]
        rec = per_backend[b] = {"compute_dtype": str(cs.compute_dtype), "square": cs.square, "prepare_s": cs.prepare_s,
                                "notes": list(cs.notes), "missing": dict(cs.missing), "skipped": {}, "results": []}
        time.sleep(0.2)     # let the previous backend's pools fall asleep
        t_backend = time.perf_counter()
        stopped, last = None, []
        for T in opts.T_list:
            if stopped is None and last:
                est = estimate_point_s(last, T, cfg, opts.repeats, cs.square)
                if est > opts.point_budget_s:
                    stopped = (f"T >= {T} skipped: estimated {est:.1f} s for T={T} (from the times at "
                               f"T={last[0]['T']}, scaled by FLOPs) exceeds the {opts.point_budget_s:g} s "
                               "point budget (--point-budget)")
            if stopped is not None:
                rec["skipped"][str(T)] = stopped
                if progress:
                    progress.step(f"{b} T={T} skipped", len(COMPONENTS))
                continue
            fl = component_flops(cfg, T)
            mem = {c: _point_memory(cfg, T, c, b, dtype) for c in COMPONENTS}
            # only what fits is drawn: the (n_heads, T, T) scores alone reach tens of GiB
            inputs = components.make_inputs(cfg, T, dtype, seed=opts.seed + T, components=[
                c for c in COMPONENTS if cs.available(c) and mem[c] <= opts.mem_limit_bytes])
            last = []
            for c in COMPONENTS:
                row = {"T": T, "component": c, "flops_full": fl["full"][c], "flops_causal": fl["causal"][c],
                       "flops": fl[kind][c]}
                if c in cs.missing:
                    row.update(status="n/a", reason=cs.missing[c])
                elif mem[c] > opts.mem_limit_bytes:
                    row.update(status="skipped", reason=f"needs about {mem[c] / 2**30:.1f} GiB "
                                                         f"(> {opts.mem_limit_bytes / 2**30:.1f} GiB limit)")
                else:
                    try:
                        m = measure(cs.fns[c], inputs[c], opts.repeats, opts.min_repeat_s, opts.target_s)
                    except Exception as e:
                        # one broken component must not cost the whole run: it is reported
                        row.update(status="error", reason=f"{type(e).__name__}: {e}"[:300])
                    else:
                        row.update(status="ok", **m)
                        row["gflops"] = row["flops"] / m["median_s"] / 1e9
                        last.append(row)
                rec["results"].append(row)
                if progress:
                    progress.step(f"{b} T={T} {c}")
            del inputs
        rec["sweep_s"] = time.perf_counter() - t_backend
    return {"config": {"d_model": cfg.d_model, "n_heads": cfg.n_heads, "d_k": cfg.d_k, "d_ff": cfg.d_ff,
                       "causal": cfg.causal, "norm": cfg.norm, "activation": cfg.activation,
                       "dtype": str(dtype), "batch": 1},
            "backends": per_backend}


def run_peers(opts: ReportOptions, progress: Progress | None = None) -> dict:
    """Each peer's whole block (tblock.peers) at every T, timed as the block component is,
    after a check against the numpy oracle: {name: {label, version, available, reason,
    build_s, results}}. Run after the sweep: importing OpenVINO loads TBB, which Numba would
    take for its threading layer if its pool had not started yet."""
    cfg = BlockConfig(d_model=opts.d_model, n_heads=opts.n_heads, causal=opts.causal)
    names = peers.PEERS if opts.peers is None else opts.peers
    versions = peers.peer_versions()
    out = {}
    for name in names:
        ok, why = peers.peer_status(name)
        if ok and opts.dtype != "float32":
            ok, why = False, "peers run in float32 only"
        rec = out[name] = {"label": peers.LABELS[name], "available": ok, "reason": why or None,
                           "version": versions[peers.DISTRIBUTION[name]], "results": []}
        if not ok:
            if progress:
                progress.step(f"{name} not run", len(opts.T_list))
            continue
        weights = init_weights(cfg, seed=opts.seed, dtype=np.float32)
        time.sleep(0.2)     # let the previous library's pools fall asleep
        t0 = time.perf_counter()
        try:
            fn = peers.build(name, weights, cfg, threads=opts.threads)
        except Exception as e:          # a broken peer is reported, the report goes on
            rec.update(available=False, reason=f"build failed: {type(e).__name__}: {e}"[:300])
            if progress:
                progress.step(f"{name} failed", len(opts.T_list))
            continue
        rec["build_s"] = time.perf_counter() - t0
        last = None
        for T in opts.T_list:
            fl = component_flops(cfg, T)["causal" if cfg.causal else "full"]["block"]
            row = {"T": T, "flops": fl}
            rec["results"].append(row)
            if progress:
                progress.step(f"{name} T={T}")
            if last and last["min_s"] * fl / last["flops"] * (opts.repeats + 2) > opts.point_budget_s:
                row.update(status="skipped", reason=f"over the {opts.point_budget_s:g} s point budget")
                continue
            mem = _point_memory(cfg, T, "block", "numpy", np.float32)   # the oracle that checks it
            if mem > opts.mem_limit_bytes:
                row.update(status="skipped", reason=f"the numpy oracle's check needs about {mem / 2**30:.1f} GiB "
                                                    f"(> {opts.mem_limit_bytes / 2**30:.1f} GiB limit)")
                continue
            X = components.make_inputs(cfg, T, np.float32, seed=opts.seed + T, components=["block"])["block"][0]
            try:
                t0 = time.perf_counter()
                Y = fn(X)                   # torch.compile compiles here for a new shape
                row["check_call_s"] = time.perf_counter() - t0
                row["max_rel_err"] = peers.max_rel_error(Y, api.forward(X, weights, cfg, backend="numpy"))
                if row["max_rel_err"] > peers.TOLERANCE:
                    row.update(status="wrong", reason=f"max relative error {row['max_rel_err']:.2e} against "
                                                      f"the numpy oracle (> {peers.TOLERANCE:g})")
                    continue
                m = measure(fn, (X,), opts.repeats, opts.min_repeat_s, opts.target_s)
            except Exception as e:
                row.update(status="error", reason=f"{type(e).__name__}: {e}"[:300])
                continue
            row.update(status="ok", gflops=fl / m["median_s"] / 1e9, **m)
            last = row
    return out


# ---------------------------------------------------------------------------------------
# analysis: ceilings, crossovers, ratios

def add_derived(data: dict) -> None:
    """Fill in % of ceiling, the crossovers and the backend ratios from the raw timings."""
    ceil = data["ceilings"]
    for b, rec in data["backends"].items():
        c_gf = ceil[rec["compute_dtype"]]["gflops"]
        for row in rec["results"]:
            if row["status"] == "ok":
                row["pct_ceiling"] = 100.0 * row["gflops"] / c_gf
        rec["crossover"] = {
            "attention_vs_ffn": measured_crossover(rec["results"], "attention", "ffn"),
            "core_vs_ffn": measured_crossover(rec["results"], "attention_core", "ffn"),
        }
        rec["first_call_overhead_s"] = first_call_overheads(rec["results"])
    data["summary"] = backend_ratios(data)


def _times(results, component) -> dict[int, float]:
    return {r["T"]: r["median_s"] for r in results if r["component"] == component and r["status"] == "ok"}


def measured_crossover(results, num: str, den: str) -> dict:
    """Where time(num) overtakes time(den): the first T-interval where the ratio goes from
    below 1 to at least 1, interpolated linearly in log T against log ratio. Also the ratio of
    achieved GFLOP/s (num over den) there: time equality needs FLOPs(num)/FLOPs(den) = that
    rate ratio, which is what moves the measured T away from the FLOP model's."""
    a, f = _times(results, num), _times(results, den)
    gf = {(r["component"], r["T"]): r["gflops"] for r in results if r["status"] == "ok"}
    Ts = sorted(set(a) & set(f))
    if len(Ts) < 1:
        return {"T": None, "status": "not measured", "ratios": {}, "rate_ratio": None}
    ratio = {T: a[T] / f[T] for T in Ts}

    def rate_ratio(*Tb):
        r = [gf[(num, T)] / gf[(den, T)] for T in Tb]
        return math.exp(sum(map(math.log, r)) / len(r))

    out = {"ratios": {str(T): ratio[T] for T in Ts}}
    if all(r >= 1 for r in ratio.values()):
        return {**out, "T": None, "rate_ratio": rate_ratio(Ts[0]),
                "status": f"below the sweep: {num} is already slower at T={Ts[0]}"}
    # the last upward crossing: from there on attention stays slower. Noise at small T can
    # add earlier ones; they are counted so the report can say the curve was not clean.
    ups = [(T0, T1) for T0, T1 in zip(Ts, Ts[1:]) if ratio[T0] < 1 <= ratio[T1]]
    if ups and all(ratio[T] >= 1 for T in Ts if T >= ups[-1][1]):
        T0, T1 = ups[-1]
        x0, x1, y0, y1 = math.log(T0), math.log(T1), math.log(ratio[T0]), math.log(ratio[T1])
        T = math.exp(x0 + (0 - y0) * (x1 - x0) / (y1 - y0))
        crossings = sum(1 for u, v in zip(Ts, Ts[1:]) if (ratio[u] < 1) != (ratio[v] < 1))
        note = "" if crossings == 1 else f" (the ratio crossed 1 {crossings} times: noisy timings)"
        return {**out, "T": T, "rate_ratio": rate_ratio(T0, T1),
                "status": f"measured between T={T0} and T={T1}{note}"}
    if len(Ts) >= 2 and ratio[Ts[-1]] > ratio[Ts[-2]]:
        # the last slope, extended: a hint where it would cross, clearly labelled as such
        x0, x1 = math.log(Ts[-2]), math.log(Ts[-1])
        y0, y1 = math.log(ratio[Ts[-2]]), math.log(ratio[Ts[-1]])
        T = math.exp(x1 + (0 - y1) * (x1 - x0) / (y1 - y0))
        return {**out, "T": None, "extrapolated_T": T, "rate_ratio": rate_ratio(Ts[-1]),
                "status": f"above the sweep: {num} still faster at T={Ts[-1]}; the last slope reaches 1 near T={T:.0f}"}
    return {**out, "T": None, "rate_ratio": rate_ratio(Ts[-1]),
            "status": f"above the sweep: {num} still faster at T={Ts[-1]}"}


def first_call_overheads(results) -> dict:
    """Per component, at the first T it ran: first call minus the steady median (compilation,
    first-touch of memory, lazy caches)."""
    out = {}
    for r in results:
        if r["status"] == "ok" and r["component"] not in out:
            out[r["component"]] = {"T": r["T"], "first_call_s": r["first_call_s"], "median_s": r["median_s"],
                                   "overhead_s": max(0.0, r["first_call_s"] - r["median_s"])}
    return out


def backend_ratios(data: dict) -> dict:
    """time(backend) / time(reference) per component: geometric mean over the T both measured,
    with the range and the ratio at the largest common T. The reference is the first backend."""
    names = list(data["backends"])
    if not names:
        return {"reference": None, "ratios": {}}
    ref = names[0]
    out = {"reference": ref, "ratios": {}}
    for b in names[1:]:
        for c in COMPONENTS:
            tb, tr = _times(data["backends"][b]["results"], c), _times(data["backends"][ref]["results"], c)
            Ts = sorted(set(tb) & set(tr))
            if not Ts:
                continue
            r = [tb[T] / tr[T] for T in Ts]
            out["ratios"].setdefault(b, {})[c] = {
                "geomean": math.exp(sum(map(math.log, r)) / len(r)), "min": min(r), "max": max(r),
                "n_T": len(Ts), "T_max": Ts[-1], "at_T_max": r[-1]}
    return out


def flop_model(cfg_d: dict) -> dict:
    cfg = BlockConfig(d_model=cfg_d["d_model"], n_heads=cfg_d["n_heads"], causal=cfg_d["causal"])
    return {"crossover_T_full": crossover_T(cfg, False), "crossover_T_causal": crossover_T(cfg, True),
            "sublayer_crossover_T_full": sublayer_crossover_T(cfg, False),
            "sublayer_crossover_T_causal": sublayer_crossover_T(cfg, True),
            "four_d_model": 4 * cfg.d_model, "eight_d_model": 8 * cfg.d_model}


# ---------------------------------------------------------------------------------------
# report.md: a pure function of the JSON, so a saved report.json renders the same page

def _ms(s):
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3g} s"
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} µs"


def _flops(n):
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n}"


def _T(x):
    return "-" if x is None else f"{x:,.0f}"


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    # a "|" inside a cell (|H_in|) would end the cell: escape it
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def render_markdown(data: dict) -> str:
    cfg, m, opts = data["config"], data["machine"], data["options"]
    fm = data["flop_model"]
    kind = "causal" if cfg["causal"] else "full square"
    L = ["# tblock report", ""]
    v = m["versions"]
    L += [f"Made {m['date']} by `{data['command']}` in {data['elapsed_s']:.0f} s"
          + (f" (tblock {v['tblock']}, git {m['git_commit']})." if m.get("git_commit") else f" (tblock {v['tblock']})."),
          "",
          f"- **Machine**: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable); {m['platform']}; "
          f"load average {_load(m.get('loadavg_start'))} at the start, {_load(m.get('loadavg_end'))} at the end "
          "(other work on the machine shows up as noise).",
          f"- **Software**: Python {m['python']}, " + ", ".join(f"{k} {x}" for k, x in v.items() if k != "tblock" and x)
          + ".",
          f"- **BLAS**: " + "; ".join(_blas_line(b) for b in m["blas"]) + ".",
          f"- **Threads**: {_threads_line(data['threads'])}.",
          f"- **Block**: d_model={cfg['d_model']}, n_heads={cfg['n_heads']} (d_k={cfg['d_k']}), d_ff={cfg['d_ff']}, "
          f"{'causal' if cfg['causal'] else 'no mask (full square)'}, {cfg['norm']}-LN, {cfg['activation']}, "
          f"no biases; inputs {cfg['dtype']}, one sequence (B=1).",
          f"- **Parameters per block**: {data['params']['config']:,}; the lesson's toy (d_model=8, d_ff=32) "
          f"{data['params']['toy']} (lesson: 808), {data['params']['toy_ln_affine']} with LN affines (lesson: 840).",
          f"- **Sweep** ({opts['mode']}): T = {', '.join(str(T) for T in data['T'])}; median of {opts['repeats']} "
          f"repeats after two warm-up calls; backends: {', '.join(data['backends'])}."
          + (" Time spent: ceilings {:.0f} s, ".format(data["clock"]["ceilings_s"])
             + ", ".join(f"{b} {t:.0f} s" for b, t in data["clock"]["sweep_s"].items()) + "."
             if data.get("clock") else "")]
    busy = load_warning(m)
    if busy:
        L += [f"- **Warning**: {busy}"]
    if opts.get("unavailable"):
        L += [f"- **Not run**: " + "; ".join(f"{b} ({why})" for b, why in opts["unavailable"].items()) + "."]
    L += [""]

    L += ["## Machine ceilings", "",
          "Best rate of an n x n matrix product through the BLAS in use (2 n³ FLOPs); "
          "'% of ceiling' below is measured against the ceiling of the dtype a backend computes in.", ""]
    rows = []
    for dt, c in data["ceilings"].items():
        runs = ", ".join(f"{r['library']} n={r['n']}: {r['gflops']:.1f}" for r in c["runs"])
        rows.append([dt, f"**{c['gflops']:.1f}**", c["source"], runs])
    L += _table(["dtype", "GFLOP/s", "best", "all runs (GFLOP/s)"], rows) + [""]

    L += ["## Crossover: where attention's time overtakes the FFN's", ""]
    model_T = fm["crossover_T_causal"] if cfg["causal"] else fm["crossover_T_full"]
    rows = []
    for b, rec in data["backends"].items():
        sub, core = rec["crossover"]["attention_vs_ffn"], rec["crossover"]["core_vs_ffn"]
        rr = core.get("rate_ratio")
        rows.append([b, _crossing_cell(sub), _crossing_cell(core),
                     "-" if rr is None else f"{rr:.2f}", "-" if rr is None else _T(model_T * rr)])
    L += _table(["backend", "attention sublayer = FFN, measured T", "attention core = FFN, measured T",
                 "core GFLOP/s ÷ FFN GFLOP/s there", f"FLOP model {model_T:,.0f} × that rate ratio"], rows)
    L += ["", f"FLOP model (tblock.flops), d_model={cfg['d_model']}:", "",
          f"- attention **core** (scores + softmax + AV) against the FFN's two matmuls, `tblock.crossover_T`: "
          f"T = {fm['crossover_T_full']:,.0f} = 4·d_model for the full square, "
          f"T = {fm['crossover_T_causal']:,.0f} ≈ 8·d_model causal;",
          f"- the whole attention **sublayer** (with its four d_model x d_model projections) against the whole FFN: "
          f"T ≈ {fm['sublayer_crossover_T_full']:,.0f} (≈ 2·d_model) full square, "
          f"T ≈ {fm['sublayer_crossover_T_causal']:,.0f} (≈ 4·d_model) causal.",
          "",
          "How to read it. The measured T is where the attention/FFN time ratio crosses 1, interpolated on "
          "log-log axes between the two swept T around it. FLOPs alone would put the core's crossover at the "
          "model's T; time is FLOPs divided by the achieved rate, and the core's FLOPs over the FFN's grow "
          "linearly in T, so the core's time overtakes the FFN's at the model's T times (core GFLOP/s ÷ FFN "
          "GFLOP/s), the last two columns. Attention's T² work runs slower per FLOP than the FFN's large GEMMs "
          "(a softmax with exp and masking between two skinny d_k-wide products), so on a well-tuned backend "
          "the rate ratio is below 1 and attention takes over before the FLOP model says. A backend that fills "
          "the whole T x T square even when causal (the numpy oracle, the C reference) spends the full-square "
          "work, which in the causal count shows as half the rate, and it crosses near 4·d_model; a kernel that "
          "skips masked tiles can push it towards 8·d_model. An FFN that is slow for its FLOPs (elementwise "
          "GELU passes in float64) pushes the crossover up instead.", ""]

    s = data["summary"]
    if s["ratios"]:
        ref = s["reference"]
        others = list(s["ratios"])
        L += ["## Backend against backend", "",
              f"time(backend) / time({ref}) for each component: geometric mean over the T both measured "
              f"[range], and the ratio at the largest such T. Above 1: slower than {ref}.", ""]
        rows = []
        for c in COMPONENTS:
            row = [LABELS[c]]
            for b in others:
                r = s["ratios"][b].get(c)
                row.append("n/a" if r is None else
                           f"{r['geomean']:.2f}x [{r['min']:.2f}–{r['max']:.2f}], {r['at_T_max']:.2f}x at T={r['T_max']}")
            rows.append(row)
        L += _table(["component"] + [f"{b} / {ref}" for b in others], rows) + [""]

    L += peers_markdown(data)
    L += [f"## FLOPs per component (tblock.flops; {kind} count, full square in brackets when it differs)", ""]
    rows = []
    for T in data["T"]:
        f = data["flops"][str(T)]
        k = "causal" if cfg["causal"] else "full"
        cells = []
        for c in COMPONENTS:
            cell = _flops(f[k][c])
            if f["full"][c] != f[k][c]:
                cell += f" [{_flops(f['full'][c])}]"
            cells.append(cell)
        ratio = f[k]["attention"] / f[k]["ffn"]
        rows.append([T] + cells + [f"{ratio:.2f}"])
    L += _table(["T"] + [LABELS[c] for c in COMPONENTS] + ["attention/ffn"], rows) + [""]

    for b, rec in data["backends"].items():
        L += [f"## Backend `{b}`", "",
              f"Computes in {rec['compute_dtype']}; "
              + ("skips the masked tiles of the T x T square" if rec.get("square") == "causal"
                 else "computes the whole T x T square, masked entries included") +
              f"; components prepared (weights cast, fused, transposed) "
              f"in {_ms(rec['prepare_s'])} before any timing. Each cell: median time, achieved "
              f"GFLOP/s ({kind} count), % of the {rec['compute_dtype']} ceiling."]
        for n in rec["notes"]:
            L += [f"- {n}"]
        for c, why in rec["missing"].items():
            L += [f"- {LABELS[c]}: n/a ({why})"]
        skipped = sorted({why for why in rec["skipped"].values()})
        for why in skipped:
            L += [f"- {why}"]
        L += [""]
        rows = []
        by_T = {}
        for r in rec["results"]:
            by_T.setdefault(r["T"], {})[r["component"]] = r
        for T in sorted(by_T):
            cells = []
            for c in COMPONENTS:
                r = by_T[T].get(c)
                if r is None or r["status"] == "n/a":
                    cells.append("n/a")
                elif r["status"] != "ok":
                    cells.append(f"{r['status']} ({r['reason']})")
                else:
                    cells.append(f"{_ms(r['median_s'])} · {r['gflops']:.3g} GF/s · {r['pct_ceiling']:.0f}%")
            a, f = by_T[T].get("attention"), by_T[T].get("ffn")
            ratio = (f"{a['median_s'] / f['median_s']:.2f}" if a and f and a["status"] == f["status"] == "ok" else "-")
            rows.append([T] + cells + [ratio])
        L += _table(["T"] + [LABELS[c] for c in COMPONENTS] + ["attention/ffn time"], rows) + [""]
        ov = rec["first_call_overhead_s"]
        if ov:
            L += ["First call against the steady median (compilation, first touch of memory, lazy caches), "
                  "at the first T each component ran: " +
                  "; ".join(f"{LABELS[c]} {_ms(o['first_call_s'])} vs {_ms(o['median_s'])}" for c, o in ov.items())
                  + ".", ""]

    L += ["## Lesson 13 worked example through every tblock backend", "",
          "T=4, d_model=8, 2 heads, d_ff=32, seed 13; the lesson's printed numbers next to ours "
          "(torch is a comparison here, not a tblock backend, so it has no trace to show).", ""]
    we = data["worked_example"]
    if we:
        names = list(we)
        rows = []
        for i, (q, lesson, _) in enumerate(we[names[0]]):
            rows.append([q, _fmt(lesson)] + [_fmt(we[b][i][2]) for b in names])
        L += _table(["quantity", "lesson"] + names, rows) + [""]

    L += ["## Plots", ""]
    if data["plots"]["files"]:
        L += [f"![{p}]({p})" for p in data["plots"]["files"]]
    else:
        L += [f"No plots: {data['plots']['reason']}."]
    L += [""]
    return "\n".join(L)


def _peer_reference(data: dict) -> str | None:
    """The backend peers are set against: numba when it was swept, else the first one."""
    names = list(data["backends"])
    return "numba" if "numba" in names else (names[0] if names else None)


def peer_rows(data: dict) -> tuple[list, list]:
    """(header, rows) of the whole block per T: the reference backend, each peer that ran,
    and reference / fastest peer."""
    ran = {n: p for n, p in data.get("peers", {}).items() if p["results"]}
    ref = _peer_reference(data)
    ref_t = _times(data["backends"][ref]["results"], "block") if ref else {}
    header = ["T", f"{ref} (block)"] + [p["label"] for p in ran.values()] + [f"{ref} / fastest peer"]
    rows = []
    for T in data["T"]:
        cells, best = [], None
        for p in ran.values():
            r = next((r for r in p["results"] if r["T"] == T), None)
            if r is None or r["status"] != "ok":
                cells.append("-" if r is None else r["status"])
                continue
            cells.append(f"{_ms(r['median_s'])} · {r['gflops']:.3g} GF/s")
            best = min(best or r["median_s"], r["median_s"])
        ratio = f"{ref_t[T] / best:.2f}" if best and T in ref_t else "-"
        rows.append([T, _ms(ref_t.get(T))] + cells + [ratio])
    return header, rows


def peers_markdown(data: dict) -> list[str]:
    ps = data.get("peers")
    if not ps:
        return []               # a report from before peers, or --peers none
    L = ["## The whole block against its peers", "",
         "Other libraries running the same block with the same weights (tblock.peers), float32, after "
         "the sweep: each checked against the numpy oracle at every T, then timed as the block "
         "component is (median; build and first call not counted). Below 1 in the last column: "
         "tblock is faster than every peer.", ""]
    for p in ps.values():
        if p["available"]:
            first = p["results"][0].get("check_call_s") if p["results"] else None
            L += [f"- {p['label']} {p['version']}: built in {_ms(p.get('build_s'))}, first call "
                  f"{_ms(first)}{' (where it compiles)' if p['label'] == 'torch.compile' else ''}" +
                  "".join(f"; T={r['T']} {r['status']} ({r.get('reason')})" for r in p["results"]
                          if r["status"] not in ("ok", "skipped")) + "."]
        else:
            L += [f"- {p['label']}: not run ({p['reason']})."]
    L += [""]
    if any(p["results"] for p in ps.values()):
        L += _table(*peer_rows(data)) + [""]
    return L


def _crossing_cell(x: dict) -> str:
    """A measured crossover for a table cell: the T, or which side of the sweep it lies."""
    if x["T"]:
        return _T(x["T"]) + (" (noisy)" if "noisy" in x["status"] else "")
    Ts = sorted(int(T) for T in x.get("ratios", {}))
    if not Ts:
        return "not measured"
    if x["status"].startswith("below"):
        return f"< {Ts[0]}"
    return f"> {Ts[-1]}" + (f" (trend ≈ {_T(x['extrapolated_T'])})" if x.get("extrapolated_T") else "")


def load_warning(m: dict) -> str | None:
    """A line when other processes competed for the cores while the report ran."""
    loads = [x[0] for x in (m.get("loadavg_start"), m.get("loadavg_end")) if x]
    if loads and max(loads) > 0.5:
        return (f"the 1-minute load average reached {max(loads):.2f} on {m['usable_cores']} usable cores: other "
                "processes competed for the cores, so the timings are noisy: a multi-threaded call waits at "
                "each barrier for a thread that lost its core, often a whole scheduler tick (4 ms). Rerun on "
                "a quiet machine for numbers to quote, or with --threads 1 for steadier single-core numbers")
    return None


def _load(x):
    return "?" if not x else f"{x[0]:.2f}"


def _blas_line(b):
    if isinstance(b, dict):
        name = b.get("internal_api") or b.get("name")
        return " ".join(str(x) for x in (name, b.get("version"), b.get("architecture"),
                                         f"({b.get('user_api')})" if b.get("user_api") else None) if x)
    return str(b)


def _threads_line(t):
    blas = t.get("blas")
    blas_s = ", ".join(f"{k} {n}" for k, n in blas.items()) if isinstance(blas, dict) else str(blas)
    parts = [f"{t['requested']} requested", f"numba {t.get('numba')}", f"BLAS/OpenMP: {blas_s}"]
    if t.get("torch") is not None:
        parts.append(f"torch {t['torch']}")
    if t.get("numba_threading_layer"):
        parts.append(f"numba threading layer {t['numba_threading_layer']}")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------
# plots

def write_plots(data: dict, folder: Path) -> dict:
    """The three PNGs; returns {"files": [...], "reason": why none} (matplotlib is optional)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return {"files": [], "reason": "matplotlib is not installed (pip install 'tblock-cpu[plot]')"}
    cfg, fm = data["config"], data["flop_model"]
    d = cfg["d_model"]
    k = "causal" if cfg["causal"] else "full"
    colors = dict(zip(COMPONENTS, ("tab:gray", "tab:purple", "tab:orange", "tab:red", "tab:blue", "black")))
    styles = dict(zip(components.BACKENDS, ("-", "--", ":", "-.")))

    def model_lines(ax):
        ax.axvline(fm["crossover_T_full"], color="tab:green", ls="--", lw=0.8,
                   label=f"FLOP model core = FFN, full: {fm['crossover_T_full']:.0f} (4·d)")
        ax.axvline(fm["crossover_T_causal"], color="tab:green", ls=":", lw=0.8,
                   label=f"FLOP model core = FFN, causal: {fm['crossover_T_causal']:.0f} (≈8·d)")

    def save(fig, name):
        FigureCanvasAgg(fig)
        fig.savefig(folder / name, dpi=110)

    # 1. time vs T, a panel per backend, a line per component
    names = list(data["backends"])
    cols = min(2, max(1, len(names)))
    rows_n = max(1, math.ceil(len(names) / cols))
    fig = Figure(figsize=(6.4 * cols, 4.6 * rows_n), layout="constrained")
    for i, b in enumerate(names):
        ax = fig.add_subplot(rows_n, cols, i + 1)
        res = data["backends"][b]["results"]
        for c in COMPONENTS:
            t = _times(res, c)
            if t:
                Ts = sorted(t)
                ax.plot(Ts, [t[T] for T in Ts], "o-", ms=3, color=colors[c], label=LABELS[c])
        model_lines(ax)
        x = data["backends"][b]["crossover"]["attention_vs_ffn"]
        if x["T"]:
            ax.axvline(x["T"], color="tab:red", lw=1.2, label=f"measured attention = FFN: {x['T']:.0f}")
        x = data["backends"][b]["crossover"]["core_vs_ffn"]
        if x["T"]:
            ax.axvline(x["T"], color="tab:orange", lw=1.2, label=f"measured core = FFN: {x['T']:.0f}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("median time per call (s)")
        ax.set_title(f"{b}: time per component, d_model={d}, {cfg['dtype']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, "time_vs_T.png")

    # 2. FLOPs vs T, the model alone
    fig = Figure(figsize=(7.5, 5), layout="constrained")
    ax = fig.add_subplot()
    Ts = data["T"]
    for c in COMPONENTS:
        ax.plot(Ts, [data["flops"][str(T)][k][c] for T in Ts], "o-", ms=3, color=colors[c], label=LABELS[c])
        if cfg["causal"]:
            ax.plot(Ts, [data["flops"][str(T)]["full"][c] for T in Ts], ":", color=colors[c], lw=0.8)
    model_lines(ax)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T (tokens)")
    ax.set_ylabel("FLOPs per call")
    ax.set_title(f"FLOPs per component, d_model={d} ({k} count solid" + (", full square dotted)" if cfg["causal"] else ")"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, "flops_vs_T.png")

    # 3. achieved GFLOP/s vs T against the ceiling, a panel per component
    shown = [c for c in ("attention", "ffn", "attention_core", "block")]
    fig = Figure(figsize=(12.8, 9), layout="constrained")
    for i, c in enumerate(shown):
        ax = fig.add_subplot(2, 2, i + 1)
        for b in names:
            res = [r for r in data["backends"][b]["results"] if r["component"] == c and r["status"] == "ok"]
            if res:
                ax.plot([r["T"] for r in res], [r["gflops"] for r in res], "o", ls=styles.get(b, "-"), ms=3,
                        label=f"{b} ({data['backends'][b]['compute_dtype']})")
        for dt, ceil in data["ceilings"].items():
            ax.axhline(ceil["gflops"], color="black" if dt == cfg["dtype"] else "gray", lw=0.8, ls="--",
                       label=f"{dt} GEMM ceiling {ceil['gflops']:.0f}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel(f"GFLOP/s ({k} FLOP count)")
        ax.set_title(LABELS[c])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, "gflops_vs_T.png")
    return {"files": list(PLOTS), "reason": None}


# ---------------------------------------------------------------------------------------
# writing: everything into a fresh temporary folder beside --out, then one rename

def _umask() -> int:
    mask = os.umask(0o022)      # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def write_report_folder(data: dict, out: Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())        # mkdtemp's 0700 would become the report's mode
        data["plots"] = write_plots(data, tmp) if data["options"]["plots"] else {
            "files": [], "reason": "--no-plots was given"}
        (tmp / "report.json").write_text(json.dumps(data, indent=1) + "\n")
        (tmp / "report.md").write_text(render_markdown(data))
        if out.exists():
            _refuse_foreign(str(out), out)      # again: files may have come in during the run
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=out.parent))
            os.rename(out, old / out.name)
            os.rename(tmp, out)
            shutil.rmtree(old)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------------------
# the whole run

def prepare_all(opts: ReportOptions) -> dict:
    """Every backend's components, prepared once (this imports each library, so the thread
    pinning that follows reaches every BLAS and OpenMP pool they load)."""
    cfg = BlockConfig(d_model=opts.d_model, n_heads=opts.n_heads, causal=opts.causal)
    weights = init_weights(cfg, seed=opts.seed, dtype=np.dtype(opts.dtype))
    sets = {}
    for b in opts.backends:
        t0 = time.perf_counter()
        sets[b] = components.prepare(b, cfg, weights, opts.dtype)
        sets[b].prepare_s = time.perf_counter() - t0
    return sets


def build_report(opts: ReportOptions, command: str, progress_stream=None) -> dict:
    t_start = time.perf_counter()
    data = {"schema": SCHEMA, "command": command, "options": asdict(opts), "machine": machine_info()}
    clock = {}                   # where the report's own time goes
    if opts.dtype == "float32":         # before Numba's pool starts (peers run in float32 only)
        peers.import_early(peers.PEERS if opts.peers is None else opts.peers)
    t0 = time.perf_counter()
    sets = prepare_all(opts)
    clock["prepare_s"] = time.perf_counter() - t0
    with pinned_threads(opts.threads, "torch" in opts.backends) as threads:
        data["threads"] = threads
        t0 = time.perf_counter()
        data["ceilings"] = gemm_ceilings(opts.ceiling_sizes, repeats=3, with_torch="torch" in opts.backends)
        clock["ceilings_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        data["worked_example"] = {b: [[q, _jsonable(lesson), _jsonable(ours)] for q, lesson, ours
                                      in worked_example_rows(b)] for b in opts.backends if b not in REFERENCES}
        clock["worked_example_s"] = time.perf_counter() - t0
        n_peers = len(peers.PEERS if opts.peers is None else opts.peers)
        steps = len(opts.T_list) * (len(opts.backends) * len(COMPONENTS) + n_peers)
        progress = Progress(steps, progress_stream)
        try:
            data.update(run_sweep(opts, sets, progress))
            t0 = time.perf_counter()
            data["peers"] = run_peers(opts, progress)
            clock["peers_s"] = time.perf_counter() - t0
        finally:
            progress.close()
        try:
            import numba
            data["threads"]["numba_threading_layer"] = numba.threading_layer()
        except (ImportError, ValueError):   # ValueError: no parallel numba code ran
            data["threads"]["numba_threading_layer"] = None
    cfg = BlockConfig(d_model=opts.d_model, n_heads=opts.n_heads, causal=opts.causal)
    data["T"] = list(opts.T_list)
    data["flops"] = {str(T): component_flops(cfg, T) for T in opts.T_list}
    data["flop_model"] = flop_model(data["config"])
    data["params"] = {"config": param_count(cfg), "toy": param_count(BlockConfig(d_model=8, n_heads=2)),
                      "toy_ln_affine": param_count(BlockConfig(d_model=8, n_heads=2), ln_affine=True)}
    add_derived(data)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    data["machine"]["loadavg_end"] = list(load) if load else None
    data["elapsed_s"] = time.perf_counter() - t_start
    clock["sweep_s"] = {b: rec["sweep_s"] for b, rec in data["backends"].items()}
    data["clock"] = clock
    data["plots"] = {"files": [], "reason": "not written yet"}
    return data


def summary_text(data: dict) -> str:
    """What the terminal shows after a run: the worked example, crossovers and ratios."""
    lines = []
    we = data["worked_example"]
    if we:
        names = list(we)
        lines += ["Lesson 13 worked example (T=4, d_model=8, 2 heads, d_ff=32, seed 13)",
                  f"   {'quantity':<24}{'lesson':<44}" + "".join(f"{b:<44}" for b in names)]
        for i, (q, lesson, _) in enumerate(we[names[0]]):
            lines.append(f"   {q:<24}{_fmt(lesson):<44}" + "".join(f"{_fmt(we[b][i][2]):<44}" for b in names))
        lines.append("")
    p = data["params"]
    cfg, fm = data["config"], data["flop_model"]
    lines += [f"parameters per block: d_model=8, d_ff=32: {p['toy']} (lesson 808), with LN affines "
              f"{p['toy_ln_affine']} (lesson 840); d_model={cfg['d_model']}: {p['config']:,}", ""]
    lines += ["GEMM ceilings: " + ", ".join(f"{dt} {c['gflops']:.1f} GFLOP/s ({c['source']})"
                                           for dt, c in data["ceilings"].items()), ""]
    lines += [f"crossover, d_model={cfg['d_model']} ({'causal' if cfg['causal'] else 'full square'}): FLOP model core=FFN "
              f"{fm['crossover_T_full']:.0f} full (4*d_model), {fm['crossover_T_causal']:.0f} causal (~8*d_model); "
              f"sublayer=FFN {fm['sublayer_crossover_T_full']:.0f} full, {fm['sublayer_crossover_T_causal']:.0f} causal"]
    for b, rec in data["backends"].items():
        s, c = rec["crossover"]["attention_vs_ffn"], rec["crossover"]["core_vs_ffn"]
        lines.append(f"   {b:<7} attention sublayer = FFN at T: {_crossing_cell(s)}; core = FFN at T: {_crossing_cell(c)}")
    s = data["summary"]
    if s["ratios"]:
        ref = s["reference"]
        lines += ["", f"time / time({ref}), geometric mean over common T [at the largest common T]"]
        others = list(s["ratios"])
        lines.append(f"   {'component':<12}" + "".join(f"{b + ' / ' + ref:>24}" for b in others))
        for comp in COMPONENTS:
            cells = []
            for b in others:
                r = s["ratios"][b].get(comp)
                cells.append(f"{'n/a':>24}" if r is None else
                             f"{r['geomean']:>9.2f}x [{r['at_T_max']:.2f}x T={r['T_max']}]".rjust(24))
            lines.append(f"   {LABELS[comp]:<12}" + "".join(cells))
    if any(p["results"] for p in data.get("peers", {}).values()):
        header, rows = peer_rows(data)
        rows = [[str(c).split(" · ")[0] for c in row] for row in rows]      # times only
        widths = [max(len(str(c)) for c in col) + 2 for col in zip(header, *rows)]
        lines += ["", "whole block against its peers (median time per call, float32)"]
        lines += ["   " + "".join(str(c).rjust(w) for c, w in zip(row, widths)) for row in [header] + rows]
    not_run = [f"{p['label']} ({p['reason']})" for p in data.get("peers", {}).values() if not p["available"]]
    if not_run:
        lines += ["", "peers not run: " + "; ".join(not_run)]
    return "\n".join(lines)


def run_report(opts: ReportOptions, command: str = "tblock report", out=print, progress_stream=None) -> int:
    backends = ", ".join(opts.backends)
    out(f"tblock report: d_model={opts.d_model}, n_heads={opts.n_heads}, {opts.dtype}, "
        f"{'causal' if opts.causal else 'full square'}, T={opts.T_list[0]}..{opts.T_list[-1]} "
        f"({len(opts.T_list)} points), backends {backends}, {opts.threads} threads ({opts.mode})")
    for b, why in opts.unavailable.items():
        out(f"   not run: {b}: {why}")
    data = build_report(opts, command, progress_stream)
    write_report_folder(data, Path(opts.out))
    out("")
    out(summary_text(data))
    out("")
    skipped = {b: sorted(set(r["skipped"].values())) for b, r in data["backends"].items() if r["skipped"]}
    for b, why in skipped.items():
        out(f"note: {b}: {'; '.join(why)}")
    for b, rec in data["backends"].items():
        for r in rec["results"]:
            if r["status"] == "error":
                out(f"error: {b} {r['component']} at T={r['T']}: {r['reason']}")
    busy = load_warning(data["machine"])
    if busy:
        out(f"warning: {busy}")
    out(f"wrote {opts.out}/report.md, report.json" + (", " + ", ".join(data["plots"]["files"]) if data["plots"]["files"]
                                                     else f" (no plots: {data['plots']['reason']})")
        + f" in {data['elapsed_s']:.0f} s")
    return 0


# ---------------------------------------------------------------------------------------
# --compare

def load_report(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise ReportError(f"--compare: cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ReportError(f"--compare: {path} is not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ReportError(f"--compare: {path} is not a tblock report.json (no schema {SCHEMA!r})")
    return data


def compare_text(a: dict, b: dict, name_a: str = "A", name_b: str = "B") -> str:
    L = [f"A: {name_a}", f"   {_who(a)}", f"B: {name_b}", f"   {_who(b)}"]
    diffs = [k for k in ("d_model", "n_heads", "causal", "dtype") if a["config"].get(k) != b["config"].get(k)]
    if diffs:
        L.append("warning: the configs differ in " + ", ".join(
            f"{k} ({a['config'].get(k)} vs {b['config'].get(k)})" for k in diffs) + "; ratios compare unlike things")
    L += ["", f"{'ceiling':<28}{'A GFLOP/s':>12}{'B GFLOP/s':>12}{'B/A':>8}"]
    for dt in ("float32", "float64"):
        ca, cb = a["ceilings"].get(dt), b["ceilings"].get(dt)
        if ca and cb:
            L.append(f"{dt + ' GEMM':<28}{ca['gflops']:>12.1f}{cb['gflops']:>12.1f}{cb['gflops'] / ca['gflops']:>8.2f}")
    L += ["", f"{'crossover T (measured)':<28}{'A sublayer':>12}{'B sublayer':>12}{'A core':>12}{'B core':>12}"]
    for be in dict.fromkeys(list(a["backends"]) + list(b["backends"])):
        cells = []
        for key in ("attention_vs_ffn", "core_vs_ffn"):
            for d in (a, b):
                cells.append(_T(d["backends"].get(be, {}).get("crossover", {}).get(key, {}).get("T")))
        L.append(f"{be:<28}{cells[0]:>12}{cells[1]:>12}{cells[2]:>12}{cells[3]:>12}")
    L += ["", "median time per call in ms; B/A below 1: B is faster",
          f"{'backend':<8}{'component':<16}{'T':>7}{'A ms':>12}{'B ms':>12}{'B/A':>8}"]
    only = []
    per = {}
    for be in dict.fromkeys(list(a["backends"]) + list(b["backends"])):
        ta = {(r["component"], r["T"]): r for r in a["backends"].get(be, {}).get("results", []) if r["status"] == "ok"}
        tb = {(r["component"], r["T"]): r for r in b["backends"].get(be, {}).get("results", []) if r["status"] == "ok"}
        for key in sorted(set(ta) | set(tb), key=lambda k: (COMPONENTS.index(k[0]) if k[0] in COMPONENTS else 99, k[1])):
            if key in ta and key in tb:
                ra, rb = ta[key], tb[key]
                r = rb["median_s"] / ra["median_s"]
                per.setdefault((be, key[0]), []).append(r)
                L.append(f"{be:<8}{key[0]:<16}{key[1]:>7}{ra['median_s'] * 1e3:>12.4g}"
                         f"{rb['median_s'] * 1e3:>12.4g}{r:>8.2f}")
            else:
                only.append(f"{be} {key[0]} T={key[1]} only in {'A' if key in ta else 'B'}")
    if per:
        L += ["", "geometric mean of B/A"]
        for (be, c), rs in per.items():
            L.append(f"   {be:<8}{c:<16}{math.exp(sum(map(math.log, rs)) / len(rs)):>8.2f}  ({len(rs)} T)")
    if only:
        L += ["", f"not in both ({len(only)}): " + "; ".join(only[:20]) + (" ..." if len(only) > 20 else "")]
    return "\n".join(L)


def _who(d):
    m, c = d["machine"], d["config"]
    return (f"{m['date']}, {m['cpu']}, {d['threads']['requested']} threads; d_model={c['d_model']}, "
            f"n_heads={c['n_heads']}, {c['dtype']}, {'causal' if c['causal'] else 'full square'}")


# ---------------------------------------------------------------------------------------
# the CLI entry

def main(args: argparse.Namespace, argv_text: str = "tblock report") -> int:
    """Run ``tblock report`` from parsed arguments; bad options exit 2, writing nothing."""
    try:
        if args.compare:
            a, b = (load_report(p) for p in args.compare)
            print(compare_text(a, b, *args.compare))
            return 0
        opts = resolve_options(args)
        return run_report(opts, command=argv_text)
    except ReportError as e:
        print(f"tblock report: error: {e}", file=sys.stderr)
        return 2
