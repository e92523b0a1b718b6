"""The report's four PNGs (matplotlib is optional): time and FLOPs against T, achieved
GFLOP/s against the limits, and the roofline."""

from __future__ import annotations

import math
from pathlib import Path

from ..backends.components import BACKENDS, COMPONENTS
from .analysis import median_times
from .cells import LABELS, block_text, crossover_formulas
from .options import PLOTS

COLORS = dict(zip(COMPONENTS, ("tab:gray", "tab:purple", "tab:orange", "tab:red", "tab:blue", "black")))
STYLES = dict(zip(BACKENDS, ("-", "--", ":", "-.")))
MARKERS = dict(zip(BACKENDS, ("o", "s", "^", "D")))
BACKEND_COLORS = dict(zip(BACKENDS, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
# legends go to the right of their axes, outside the data
TIME_LABELS = {"softmax": "softmax, standalone: writes the\n(n_heads, T, T) probabilities,\nwhich the block never does"}
OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0, "fontsize": 7}


def write_plots(data: dict, folder: Path) -> dict:
    """The four PNGs; returns {"files": [...], "reason": why none} (matplotlib is optional)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return {"files": [], "reason": "matplotlib is not installed (pip install 'tblock-cpu[plot]')"}

    def save(fig, name):
        FigureCanvasAgg(fig)
        fig.savefig(folder / name, dpi=110)

    save(_time_vs_T(data, Figure), "time_vs_T.png")
    save(_flops_vs_T(data, Figure), "flops_vs_T.png")
    save(_gflops_vs_T(data, Figure), "gflops_vs_T.png")
    save(_roofline(data, Figure), "roofline.png")
    return {"files": list(PLOTS), "reason": None}


def _model_lines(ax, data):
    """The FLOP model's core = FFN crossovers (tblock.crossover_T), full square and causal."""
    fm = data["flop_model"]
    full, causal = (f.lstrip("= ") for f in crossover_formulas(data["config"]))
    ax.axvline(fm["crossover_T_full"], color="tab:green", ls="--", lw=0.8,
               label=f"FLOP model core = FFN, full: {fm['crossover_T_full']:.0f} ({full})")
    ax.axvline(fm["crossover_T_causal"], color="tab:green", ls=":", lw=0.8,
               label=f"FLOP model core = FFN, causal: {fm['crossover_T_causal']:.0f} ({causal})")


def _block(cfg) -> str:
    """A title's words for the swept block: its variant beyond the lesson's, if any."""
    text = block_text(cfg)
    return f"; {text}" if text else ""


def _log_axes(ax, xlabel, ylabel, title):
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)


def _time_vs_T(data, Figure):
    """Time against T, a panel per backend, a line per component."""
    cfg, names = data["config"], list(data["backends"])
    rows_n = max(1, math.ceil(len(names) / 2))
    fig = Figure(figsize=(15, 4.6 * rows_n), layout="constrained")
    for i, b in enumerate(names):
        ax = fig.add_subplot(rows_n, 2, i + 1)
        res = data["backends"][b]["results"]
        for c in COMPONENTS:
            t = median_times(res, c)
            if t:
                Ts = sorted(t)
                ax.plot(Ts, [t[T] for T in Ts], "o-", ms=3, color=COLORS[c], label=TIME_LABELS.get(c, LABELS[c]))
        _model_lines(ax, data)
        for key, color, what in (("attention_vs_ffn", "tab:red", "attention"), ("core_vs_ffn", "tab:orange", "core")):
            x = data["backends"][b]["crossover"][key]
            if x["T"]:
                ax.axvline(x["T"], color=color, lw=1.2, label=f"measured {what} = FFN: {x['T']:.0f}")
        _log_axes(ax, "T (tokens)", "median time per call (s)",
                  f"{b}: time per component, d_model={cfg['d_model']}, {cfg['dtype']}{_block(cfg)}")
        ax.legend(**OUTSIDE)
    return fig


def _flops_vs_T(data, Figure):
    """The FLOP model alone."""
    cfg = data["config"]
    k = "causal" if cfg["causal"] else "full"
    fig = Figure(figsize=(9.5, 5), layout="constrained")
    ax = fig.add_subplot()
    Ts = data["T"]
    for c in COMPONENTS:
        ax.plot(Ts, [data["flops"][str(T)][k][c] for T in Ts], "o-", ms=3, color=COLORS[c], label=LABELS[c])
        if cfg["causal"]:
            ax.plot(Ts, [data["flops"][str(T)]["full"][c] for T in Ts], ":", color=COLORS[c], lw=0.8)
    _model_lines(ax, data)
    _log_axes(ax, "T (tokens)", "FLOPs per call", f"FLOPs per component, d_model={cfg['d_model']}{_block(cfg)} "
              f"({k} count solid" + (", full square dotted)" if cfg["causal"] else ")"))
    ax.legend(**OUTSIDE)
    return fig


def _gflops_vs_T(data, Figure):
    """Achieved GFLOP/s against T, a panel per component, with the FMA peaks and the BLAS's GEMM."""
    cfg, lim = data["config"], data["limits"]
    k = "causal" if cfg["causal"] else "full"
    fig = Figure(figsize=(15, 9), layout="constrained")
    for i, c in enumerate(("attention", "ffn", "attention_core", "block")):
        ax = fig.add_subplot(2, 2, i + 1)
        for b, rec in data["backends"].items():
            res = [r for r in rec["results"] if r["component"] == c and r["status"] == "ok"]
            if res:
                ax.plot([r["T"] for r in res], [r["gflops"] for r in res], marker=MARKERS.get(b, "o"),
                        ls=STYLES.get(b, "-"), ms=3, color=BACKEND_COLORS.get(b), label=f"{b} ({rec['compute_dtype']})")
        for dt, p in lim["peak"].items():
            ax.axhline(p["gflops"], color="black" if dt == cfg["dtype"] else "gray", lw=1.0,
                       label=f"{dt} FMA peak {p['gflops']:.0f}")
        for dt, g in lim["blas_gemm"].items():
            ax.axhline(g["gflops"], color="black" if dt == cfg["dtype"] else "gray", lw=0.8, ls=":",
                       label=f"{dt} BLAS GEMM {g['gflops']:.0f} (reference)")
        _log_axes(ax, "T (tokens)", f"GFLOP/s ({k} FLOP count)", LABELS[c])
        ax.legend(**OUTSIDE)
    blas = lim["blas_gemm"].get(cfg["dtype"])
    if blas:
        fig.suptitle(f"BLAS GEMM reference: {blas['source']}", fontsize=9)
    return fig


def _points(data):
    """(backend, component, T, intensity, GFLOP/s) of every timed row."""
    return [(b, r["component"], r["T"], r["intensity"], r["gflops"])
            for b, rec in data["backends"].items() for r in rec["results"] if r["status"] == "ok"]


def _roofline(data, Figure):
    """GFLOP/s against FLOP/byte, log-log: the FMA peaks, a bandwidth roof per memory level,
    the BLAS's GEMM as a reference, a marker per component (colour), backend (shape) and T (size)."""
    cfg, lim = data["config"], data["limits"]
    pts = _points(data)
    dec = data.get("decode") or {}
    xs = [p[3] for p in pts] + ([dec["intensity"]] if dec.get("status") == "ok" else [])
    peaks = {dt: p["gflops"] for dt, p in lim["peak"].items()
             if dt == cfg["dtype"] or any(rec["compute_dtype"] == dt for rec in data["backends"].values())}
    top = max(peaks.values())
    ridge = [top / lv["read_GBs"] for lv in lim["bandwidth"]]
    x0, x1 = min(xs + ridge) / 3, max(xs + ridge) * 3
    fig = Figure(figsize=(12, 7), layout="constrained")
    ax = fig.add_subplot()
    n_lv = len(lim["bandwidth"])
    for j, lv in enumerate(lim["bandwidth"]):
        main = lv["name"] == "DRAM"
        knee = top / lv["read_GBs"]
        ax.plot([x0, knee], [x0 * lv["read_GBs"], top], color="black" if main else str(0.35 + 0.4 * j / n_lv),
                lw=1.6 if main else 0.9, ls="-" if main else "--",
                label=f"{lv['name']} read bandwidth {lv['read_GBs']:.0f} GB/s")
        ax.annotate(lv["name"], (knee, top), xytext=(-4, 3 + 9 * (j % 2)), textcoords="offset points", ha="right",
                    fontsize=7)
    fastest = max(lv["read_GBs"] for lv in lim["bandwidth"])
    for dt, g in peaks.items():          # flat from where the fastest level's roof reaches it
        ax.plot([g / fastest, x1], [g, g], color="black" if dt == cfg["dtype"] else "dimgray", lw=1.6,
                ls="-" if dt == cfg["dtype"] else "-.", label=f"{dt} FMA peak {g:.0f} GFLOP/s ({lim['isa']['name']})")
    for dt, g in lim["blas_gemm"].items():
        if dt in peaks:
            ax.axhline(g["gflops"], color="tab:green", lw=0.9, ls=":" if dt == cfg["dtype"] else (0, (1, 4)),
                       label=f"{dt} BLAS GEMM {g['gflops']:.0f}: {g['source']} (reference)")
    Ts = sorted({p[2] for p in pts}) or [1]
    lo, hi = math.log(Ts[0]), math.log(Ts[-1])

    def size(T):
        return 14 + 70 * ((math.log(T) - lo) / (hi - lo) if hi > lo else 0.5)
    for b, c, T, x, y in pts:
        ax.scatter(x, y, s=size(T), color=COLORS[c], marker=MARKERS.get(b, "o"), alpha=0.8,
                   edgecolors="white", linewidths=0.4)
    if dec.get("status") == "ok":
        ax.scatter(dec["intensity"], dec["gflops"], s=160, marker="*", color="tab:cyan", edgecolors="black",
                   linewidths=0.6, zorder=5, label=f"decode step ({dec['backend']}), context {dec['context']}")
    # legend entries for the encodings: colour = component, shape = backend
    for c in COMPONENTS:
        ax.scatter([], [], color=COLORS[c], marker="o", s=30, label=LABELS[c])
    for b in data["backends"]:
        ax.scatter([], [], color="gray", marker=MARKERS.get(b, "o"), s=30,
                   label=f"{b} ({data['backends'][b]['compute_dtype']})")
    ax.set_xlim(x0, x1)
    ys = [p[4] for p in pts] + [x0 * min(lv["read_GBs"] for lv in lim["bandwidth"])]
    ax.set_ylim(min(ys) / 2, top * 2)
    _log_axes(ax, "arithmetic intensity (FLOPs per byte moved at least)", "GFLOP/s",
              f"Roofline: d_model={cfg['d_model']}{_block(cfg)}, {cfg['dtype']}, T={Ts[0]}..{Ts[-1]} (marker size grows with T)\n"
              f"{data['machine']['cpu']}, {lim['isa']['name']} path, {lim['threads']} threads")
    ax.legend(**OUTSIDE)
    return fig
