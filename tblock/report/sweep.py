"""The measurements: the worked example on every backend, the component sweep, a cached
decode step and the peers' whole block, all through tblock.perf's harness (the machine's
limits: tblock.report.limits)."""

from __future__ import annotations

import time

import numpy as np

from .. import api, peers
from ..backends import components
from ..backends.components import COMPONENTS, component_flops, point_memory
from ..config import BlockConfig
from ..kvcache import KVCache
from ..lesson.analysis import row_entropies_bits
from ..perf import Progress, measure, settle
from ..weights import init_weights
from ..worked_example import LESSON_PRINTED, load_worked_example
from .options import ReportOptions
from .roofline import decode_flops


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
        ("entropy head 1 (bits)", LESSON_PRINTED["entropy_head1_bits"], row_entropies_bits(tr.A[0])),
        ("entropy head 2 (bits)", LESSON_PRINTED["entropy_head2_bits"], row_entropies_bits(tr.A[1])),
        ("max |H_out - lesson|", 0.0, float(np.max(np.abs(tr.H_out - ex.expected["H_out"])))),
    ]


def estimate_point_s(rows: list, T_next: int, cfg: BlockConfig, repeats: int, square: str = "full") -> float:
    """Seconds one backend would spend on T_next: each component's fastest call at the last T,
    scaled by the FLOPs of the work it really does (the whole square for the oracle and the
    C reference, the causal triangle for kernels that skip masked tiles), times the calls
    a measurement makes."""
    kind = "causal" if (cfg.causal and square == "causal") else "full"
    fl = component_flops(cfg, T_next)[kind]
    return sum(r["min_s"] * fl[r["component"]] / r[f"flops_{kind}"] * (repeats + 2)
               for r in rows if r["status"] == "ok")


def prepare_all(opts: ReportOptions) -> dict:
    """Every backend's components, prepared once (this imports each library, so the thread
    pinning that follows reaches every BLAS and OpenMP pool they load)."""
    cfg = opts.block()
    weights = init_weights(cfg, seed=opts.seed, dtype=np.dtype(opts.dtype))
    sets = {}
    for b in opts.backends:
        t0 = time.perf_counter()
        sets[b] = components.prepare(b, cfg, weights, opts.dtype)
        sets[b].prepare_s = time.perf_counter() - t0
    return sets


def run_sweep(opts: ReportOptions, sets: dict, progress: Progress | None = None, between=None) -> dict:
    """Time every component of every prepared backend at every T; returns the JSON-ready
    results. Backend by backend, so one library's idle-spinning thread pool (OpenBLAS spins
    for a while after each call) does not steal cores from the next library's calls;
    ``between()``, when given, runs after each backend's sweep."""
    cfg = opts.block()
    dtype = np.dtype(opts.dtype)
    kind = "causal" if cfg.causal else "full"
    per_backend = {}
    for b in opts.backends:
        cs = sets[b]
        rec = per_backend[b] = {"compute_dtype": str(cs.compute_dtype), "square": cs.square, "prepare_s": cs.prepare_s,
                                "notes": list(cs.notes), "missing": dict(cs.missing), "skipped": {}, "results": []}
        settle(0.2)
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
            mem = {c: point_memory(cfg, T, c, b, dtype) for c in COMPONENTS}
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
        if between:
            between()
    return {"config": opts.config(), "backends": per_backend}


# why the whole-block peers are not run for a block beyond the lesson's
PEERS_LESSON_ONLY = ("the whole-block peers are built for the lesson's block only (LayerNorm, the two-matrix "
                     "FFN, no rotary, n_kv_heads = n_heads), not this one")


def run_peers(opts: ReportOptions, progress: Progress | None = None) -> dict:
    """Each peer's whole block (tblock.peers) at every T, timed as the block component is,
    after a check against the numpy oracle: {name: {label, version, available, reason,
    build_s, results}}. Run after the sweep: importing OpenVINO loads TBB, which Numba would
    take for its threading layer if its pool had not started yet."""
    cfg = opts.block()
    names = peers.PEERS if opts.peers is None else opts.peers
    versions = peers.peer_versions()
    out = {}
    for name in names:
        ok, why = (False, PEERS_LESSON_ONLY) if not cfg.lesson_block else peers.peer_status(name)
        if ok and opts.dtype != "float32":
            ok, why = False, "peers run in float32 only"
        rec = out[name] = {"label": peers.LABELS[name], "available": ok, "reason": why or None,
                           "version": versions[peers.DISTRIBUTION[name]], "results": []}
        if not ok:
            if progress:
                progress.step(f"{name} not run", len(opts.T_list))
            continue
        weights = init_weights(cfg, seed=opts.seed, dtype=np.float32)
        settle(0.2)
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
            mem = point_memory(cfg, T, "block", "numpy", np.float32)   # the oracle that checks it
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


def time_decode(opts: ReportOptions, backends: dict) -> dict:
    """One cached step of the swept block on the numba backend (tblock.forward with a
    KVCache): one token attending over ``context`` keys, the largest T at which the sweep
    timed numba's block (the context - 1 before it cached by one call first); the cache is
    set back after each step, so every repetition decodes at the same context."""
    rec = {"backend": "numba"}
    ran = [r["T"] for r in backends.get("numba", {}).get("results", []) if r["component"] == "block" and r["status"] == "ok"]
    if not opts.causal:
        return {**rec, "status": "n/a", "reason": "a KV cache needs a causal block (--no-causal was given)"}
    if not ran:
        return {**rec, "status": "n/a", "reason": "the numba backend's block was not timed in this sweep"}
    L = rec["context"] = max(ran)
    cfg = opts.block()                  # causal: checked above
    dtype = np.dtype(opts.dtype)
    weights = init_weights(cfg, seed=opts.seed, dtype=dtype)
    X = components.make_inputs(cfg, L, dtype, seed=opts.seed + L, components=["block"])["block"][0][None]  # (1, L, d)
    try:
        cache = KVCache(cfg, L, 1, dtype)
        if L > 1:
            api.forward(X[:, :L - 1], weights, cfg, backend="numba", cache=cache)
        x = X[:, L - 1:]

        def step():
            api.forward(x, weights, cfg, backend="numba", cache=cache)
            cache.length = L - 1
        m = measure(step, (), opts.repeats, opts.min_repeat_s, opts.target_s)
    except Exception as e:              # reported like a component's error
        return {**rec, "status": "error", "reason": f"{type(e).__name__}: {e}"[:300]}
    fl = decode_flops(cfg, L)
    return {**rec, "status": "ok", "flops": fl, "gflops": fl / m["median_s"] / 1e9, **m}
