"""``tblock report --compare A.json B.json``: two saved reports side by side."""

from __future__ import annotations

import json
import math

from ..backends.components import COMPONENTS
from .markdown import fmt_T
from .options import SCHEMA, ReportError


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
                cells.append(fmt_T(d["backends"].get(be, {}).get("crossover", {}).get(key, {}).get("T")))
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
