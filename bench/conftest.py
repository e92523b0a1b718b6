"""pytest-benchmark suite of every component of every backend over a T sweep.

Not collected by ``make test`` (pyproject's testpaths is tests/); run it explicitly:

    pytest bench                         # d_model 384 and 768, T from d_model/8 to 8 d_model
    pytest bench --full                  # T up to 16 d_model
    pytest bench --smoke --benchmark-disable   # tiny sizes once, what tests/test_bench_smoke.py runs
    make bench                           # the default sweep, JSON saved under .benchmarks/

Every benchmark's extra_info says what it measured (T, d_model, n_heads, backend,
component, dtype, FLOPs full and causal, achieved GFLOP/s), and the machine info carries
the CPU, the library versions, the BLAS and the pinned thread counts, so the JSON stands
on its own.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import pytest

from tblock import BlockConfig, init_weights, perf
from tblock.backends import components as C

# (d_model, n_heads) of the sweep; the lesson's toy block is added at its own T=4
SWEEP_CONFIGS = ((384, 6), (768, 12))
TOY = (8, 2, 4)
SMOKE_CONFIGS = ((32, 2),)
SMOKE_T = (8, 32)
# a conservative GFLOP/s (full-square FLOPs) per backend, to estimate a benchmark's time
# before running it: the numpy oracle and the C reference get slow at large T; the fast
# backends reach this on two cores, and skip at most the largest --full sizes
NOMINAL_GFLOPS = {"numpy": 3.0, "c": 1.0, "numba": 60.0, "torch": 60.0}


def pytest_addoption(parser):
    g = parser.getgroup("tblock bench")
    g.addoption("--full", action="store_true", default=False, help="sweep T up to 16*d_model (default 8*d_model)")
    g.addoption("--smoke", action="store_true", default=False,
                help="tiny sizes only (d_model 32 and the toy), a tight budget: checks the suite runs")
    g.addoption("--bench-backends", default=None,
                help=f"comma-separated subset of {','.join(C.BACKENDS)} (default: all; missing ones are skipped)")
    g.addoption("--bench-threads", type=int, default=None,
                help="threads for numba, BLAS/OpenMP and torch (default: every usable core)")
    g.addoption("--bench-budget", type=float, default=None,
                help="skip a benchmark whose estimated time exceeds this many seconds (default 20; smoke 2)")
    g.addoption("--bench-dtype", default="float32", choices=("float32", "float64"), help="input dtype")
    g.addoption("--bench-mem-gib", type=float, default=4.0,
                help="skip a benchmark whose (n_heads, T, T) arrays would need more GiB than this")


@dataclass(frozen=True)
class Case:
    backend: str
    d_model: int
    n_heads: int
    T: int
    component: str

    @property
    def id(self):
        return f"{self.backend}-{self.component}-d{self.d_model}-T{self.T}"


def sweep_T(d_model: int, full: bool) -> list[int]:
    """d_model/8 to 8 d_model (16 with --full), doubling: tblock.perf's grid, with 4 and 8
    d_model, the FLOP model's crossovers (full square and causal)."""
    return perf.t_grid(d_model, 16 if full else 8)


def bench_settings(config) -> dict:
    smoke = config.getoption("--smoke")
    budget = config.getoption("--bench-budget")
    backends = config.getoption("--bench-backends")
    threads = config.getoption("--bench-threads") or perf.usable_cores()
    return {
        "smoke": smoke, "full": config.getoption("--full"), "dtype": config.getoption("--bench-dtype"),
        "budget_s": budget if budget is not None else (2.0 if smoke else 20.0),
        "backends": list(C.BACKENDS) if backends is None else [b.strip() for b in backends.split(",") if b.strip()],
        "threads": threads, "mem_bytes": int(config.getoption("--bench-mem-gib") * 2**30),
    }


def rounds_for(est_call_s: float, smoke: bool) -> int:
    """Fixed rounds for the large sizes (pedantic mode): fewer as a call gets longer."""
    if smoke:
        return 1
    return 5 if est_call_s < 0.5 else 3


def estimate_s(case: Case, dtype: str) -> float:
    """Seconds the whole benchmark would take at the backend's nominal rate: two warm-up
    calls and the rounds, on the full square's FLOPs (what the slow backends compute)."""
    cfg = BlockConfig(d_model=case.d_model, n_heads=case.n_heads)
    call = C.component_flops(cfg, case.T)["full"][case.component] / (NOMINAL_GFLOPS[case.backend] * 1e9)
    return call * (2 + rounds_for(call, False))


def cases(config) -> list:
    s = bench_settings(config)
    sizes = [TOY]
    for d, h in (SMOKE_CONFIGS if s["smoke"] else SWEEP_CONFIGS):
        sizes += [(d, h, T) for T in (SMOKE_T if s["smoke"] else sweep_T(d, s["full"]))]
    out = []
    # backend outermost: one library's spinning thread pool never lands in another's timing
    for b in s["backends"]:
        if b not in C.BACKENDS:
            raise pytest.UsageError(f"--bench-backends: unknown backend {b!r}; choose from {', '.join(C.BACKENDS)}")
        ok, why = C.backend_status(b)
        for d, h, T in sizes:
            for comp in C.COMPONENTS:
                case = Case(b, d, h, T, comp)
                marks = []
                cfg = BlockConfig(d_model=d, n_heads=h)
                mem = C.point_memory(cfg, T, comp, b, s["dtype"])
                est = estimate_s(case, s["dtype"])
                if not ok:
                    marks.append(pytest.mark.skip(reason=f"backend {b} cannot run here: {why}"))
                elif mem > s["mem_bytes"]:
                    marks.append(pytest.mark.skip(reason=f"{case.id}: needs about {mem / 2**30:.1f} GiB "
                                                         f"(> --bench-mem-gib {s['mem_bytes'] / 2**30:g})"))
                elif est > s["budget_s"]:
                    marks.append(pytest.mark.skip(reason=f"{case.id}: estimated {est:.0f} s at a nominal "
                                                         f"{NOMINAL_GFLOPS[b]:g} GFLOP/s > --bench-budget "
                                                         f"{s['budget_s']:g} s"))
                out.append(pytest.param(case, id=case.id, marks=marks))
    return out


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        metafunc.parametrize("case", cases(metafunc.config))


# ---------------------------------------------------------------------------------------
# session state: pinned threads, prepared components, the inputs of the current size

@pytest.fixture(scope="session")
def settings(request):
    return bench_settings(request.config)


@pytest.fixture(scope="session", autouse=True)
def pinned(settings):
    """Every library at the same thread count for the whole session; the counts are recorded."""
    for b in settings["backends"]:
        if b in C.BACKENDS and C.backend_status(b)[0]:
            C.prepare(b, BlockConfig(d_model=TOY[0], n_heads=TOY[1]),
                      init_weights(BlockConfig(d_model=TOY[0], n_heads=TOY[1]), 0))   # loads every library
    with perf.pinned_threads(settings["threads"], "torch" in settings["backends"]
                               and C.backend_status("torch")[0]) as counts:
        _SESSION["threads"] = counts
        yield counts


_SESSION = {"threads": None, "last_backend": None}


@pytest.fixture(scope="session")
def component_sets(settings):
    cache = {}

    def get(backend, d_model, n_heads):
        key = (backend, d_model, n_heads)
        if key not in cache:
            cfg = BlockConfig(d_model=d_model, n_heads=n_heads)
            t0 = time.perf_counter()
            cs = C.prepare(backend, cfg, init_weights(cfg, seed=0, dtype=settings["dtype"]), settings["dtype"])
            cs.prepare_s = time.perf_counter() - t0
            cache[key] = cs
        return cache[key]
    return get


@pytest.fixture(scope="session")
def inputs_for(settings):
    """The inputs of one size, kept until the size changes (the score tensors get large)."""
    last = {}

    def get(d_model, n_heads, T):
        key = (d_model, n_heads, T)
        if key not in last:
            last.clear()
            cfg = BlockConfig(d_model=d_model, n_heads=n_heads)
            last[key] = C.make_inputs(cfg, T, settings["dtype"], seed=T)
        return last[key]
    return get


def pytest_benchmark_update_machine_info(config, machine_info):
    info = perf.machine_info()
    machine_info["tblock"] = {k: info[k] for k in ("cpu", "cores", "usable_cores", "versions", "blas",
                                                   "git_commit", "loadavg_start")}
    machine_info["tblock"]["threads"] = _SESSION["threads"]
    machine_info["tblock"]["settings"] = bench_settings(config)


# ---------------------------------------------------------------------------------------
# the one measurement every component benchmark makes

def run_case(benchmark, case: Case, cs, args, settings) -> None:
    if _SESSION["last_backend"] not in (None, case.backend):
        perf.settle(0.3)    # the previous library's pools spin for ~0.1 s after their last call
    _SESSION["last_backend"] = case.backend
    fn = cs.fns[case.component]
    # explicit warm-up: pytest-benchmark warms up only on PyPy by default, and numba
    # compiles on the first call; the second call sizes the rounds
    first, est = perf.first_calls(fn, args)
    cfg = BlockConfig(d_model=case.d_model, n_heads=case.n_heads)
    fl = C.component_flops(cfg, case.T)
    benchmark.group = f"{case.component} d_model={case.d_model} T={case.T}"
    benchmark.extra_info.update(
        T=case.T, d_model=case.d_model, n_heads=case.n_heads, d_ff=cfg.d_ff, causal=cfg.causal,
        backend=case.backend, component=case.component, dtype=settings["dtype"],
        compute_dtype=str(cs.compute_dtype), flops_full=fl["full"][case.component],
        flops_causal=fl["causal"][case.component], flops=fl["causal" if cfg.causal else "full"][case.component],
        first_call_s=first, prepare_s=cs.prepare_s, threads=_SESSION["threads"], pid=os.getpid())
    if est < 0.01 and not settings["smoke"]:
        # cheap: fixed rounds of a loop sized to ~2 ms, well above the timer's resolution
        # (pytest-benchmark's own calibration wanders for seconds on a loaded machine)
        iterations = max(1, min(10_000, int(0.002 / max(est, 1e-9))))
        benchmark.pedantic(fn, args=args, rounds=20, iterations=iterations, warmup_rounds=0)
    else:
        benchmark.pedantic(fn, args=args, rounds=rounds_for(est, settings["smoke"]), iterations=1, warmup_rounds=0)
    benchmark.extra_info["mode"] = "pedantic"
    stats = getattr(benchmark, "stats", None)
    if stats is not None:               # None with --benchmark-disable
        median = stats.stats.median
        benchmark.extra_info["median_s"] = median
        benchmark.extra_info["gflops"] = benchmark.extra_info["flops"] / median / 1e9


@pytest.fixture
def measure_case(settings):
    """run_case and check_output for the test modules (which cannot import this conftest
    by name: tests/ has a conftest.py too)."""
    def run(benchmark, case, cs, args):
        run_case(benchmark, case, cs, args, settings)
        check_output(case, cs.fns[case.component](*args), BlockConfig(d_model=case.d_model, n_heads=case.n_heads))
    return run


def check_output(case: Case, out, cfg: BlockConfig) -> None:
    """Each benchmark also checks its component returned the right shape, finite."""
    want = {"softmax": (cfg.n_heads, case.T, case.T)}.get(case.component, (case.T, cfg.d_model))
    a = np.asarray(out)
    assert a.shape == want, f"{case.id} returned shape {a.shape}, want {want}"
    assert np.isfinite(a).all(), f"{case.id} returned non-finite values"
