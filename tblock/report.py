"""``tblock report``: the worked example through every backend, counts, and one timing."""

from __future__ import annotations

import time

import numpy as np

from . import api
from .config import BlockConfig
from .counting import COMPONENTS, flops, param_count
from .weights import init_weights
from .worked_example import LESSON_PRINTED, load_worked_example


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


def time_forward(H, w, cfg, backend, repeats=3):
    """Best-of-``repeats`` wall time of one forward; one untimed call first (compilation, caches)."""
    api.forward(H, w, cfg, backend=backend)
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        api.forward(H, w, cfg, backend=backend)
        best = min(best, time.perf_counter() - t0)
    return best


def run_report(d_model=768, n_heads=12, T=1024, out=print):
    backends = api.available_backends()
    out("tblock report")
    out("=============")
    out(f"backends available: {', '.join(backends)}")
    out("")
    out("Lesson 13 worked example (T=4, d_model=8, 2 heads, d_ff=32, seed 13)")
    for backend in backends:
        out(f"-- backend {backend}")
        out(f"   {'quantity':<24}{'lesson':<44}ours")
        for name, lesson, ours in worked_example_rows(backend):
            out(f"   {name:<24}{_fmt(lesson):<44}{_fmt(ours)}")
    out("")
    toy = BlockConfig(d_model=8, n_heads=2)
    out(f"parameters per block (d_model=8, d_ff=32): {param_count(toy)} "
        f"(lesson 808), with LN affines {param_count(toy, ln_affine=True)} (lesson 840)")
    cfg = BlockConfig(d_model=d_model, n_heads=n_heads)
    out(f"parameters per block (d_model={d_model}, d_ff={cfg.d_ff}): {param_count(cfg):,}")
    out("")
    fc = flops(cfg, T)
    out(f"FLOPs per block forward, d_model={d_model}, n_heads={n_heads}, T={T} (2 per multiply-add)")
    out(f"   {'component':<12}{'full square':>18}{'causal':>18}")
    for k in COMPONENTS:
        out(f"   {k:<12}{fc.full[k]:>18,}{fc.causal[k]:>18,}")
    out(f"   {'total':<12}{fc.total(False):>18,}{fc.total(True):>18,}")
    out(f"crossover T where scores+AV = FFN matmuls: {fc.crossover_full:g} full square "
        f"(4*d_model = {4 * d_model}), {fc.crossover_causal:g} causal (~8*d_model = {8 * d_model})")
    out("")
    out(f"wall time of one block forward, float32, d_model={d_model}, n_heads={n_heads}, T={T} (best of 3)")
    w = init_weights(cfg, seed=0, dtype=np.float32)
    H = np.random.default_rng(1).standard_normal((T, d_model)).astype(np.float32)
    for backend in backends:
        t = time_forward(H, w, cfg, backend)
        gflops = fc.total(cfg.causal) / t / 1e9
        out(f"   {backend:<8}{t * 1e3:10.2f} ms   {gflops:8.2f} GFLOP/s (causal count)")
    return 0
