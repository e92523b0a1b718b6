"""The report's three PNGs (matplotlib is optional)."""

from __future__ import annotations

import math
from pathlib import Path

from ..backends.components import BACKENDS, COMPONENTS
from .analysis import median_times
from .markdown import LABELS
from .options import PLOTS


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
    styles = dict(zip(BACKENDS, ("-", "--", ":", "-.")))

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
            t = median_times(res, c)
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
