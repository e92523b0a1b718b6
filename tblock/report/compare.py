"""``tblock report --compare A.json B.json``: two saved reports side by side, of either
schema (tblock-report/1 had the BLAS's GEMM rates as "ceilings" and no roofline)."""

from __future__ import annotations

import json
import math

from ..backends.components import COMPONENTS
from .cells import fmt_T
from .options import SCHEMA, SCHEMAS, ReportError


def load_report(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise ReportError(f"--compare: cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ReportError(f"--compare: {path} is not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") not in SCHEMAS:
        raise ReportError(f"--compare: {path} is not a tblock report.json (no schema {' or '.join(map(repr, SCHEMAS))})")
    return upgrade(data)


def upgrade(data: dict) -> dict:
    """A report of an older schema in the current one's terms, as far as it goes: a
    tblock-report/1's "ceilings" (the BLAS's best GEMM per dtype) become limits' blas_gemm,
    with no FMA peak, bandwidth or roofline (it measured none)."""
    if data["schema"] == "tblock-report/1":
        data = {**data, "schema": SCHEMA,
                "limits": {"peak": {}, "bandwidth": [], "blas_gemm": data.get("ceilings", {}), "blas": {}}}
    return data


def _limit_rows(a: dict, b: dict) -> list[str]:
    """The limits both reports measured, with B/A."""
    la, lb = a["limits"], b["limits"]
    rows = [(f"{dt} FMA peak", la["peak"].get(dt, {}).get("gflops"), lb["peak"].get(dt, {}).get("gflops"))
            for dt in ("float32", "float64")]
    bw_a = {lv["name"]: lv["read_GBs"] for lv in la["bandwidth"]}
    bw_b = {lv["name"]: lv["read_GBs"] for lv in lb["bandwidth"]}
    rows += [(f"{n} read GB/s", bw_a.get(n), bw_b.get(n)) for n in dict.fromkeys(list(bw_a) + list(bw_b))]
    rows += [(f"{dt} BLAS GEMM", la["blas_gemm"].get(dt, {}).get("gflops"), lb["blas_gemm"].get(dt, {}).get("gflops"))
             for dt in ("float32", "float64")]
    cell = lambda v: f"{v:>12.1f}" if v else f"{'-':>12}"          # noqa: E731
    return [f"{name:<28}{cell(x)}{cell(y)}" + (f"{y / x:>8.2f}" if x and y else f"{'-':>8}") for name, x, y in rows]


def compare_text(a: dict, b: dict, name_a: str = "A", name_b: str = "B") -> str:
    L = [f"A: {name_a}", f"   {_who(a)}", f"B: {name_b}", f"   {_who(b)}"]
    ca, cb = _config(a), _config(b)
    diffs = [k for k in ("family", "d_model", "n_heads", "n_kv_heads", "d_ff", "causal", "dtype") if ca.get(k) != cb.get(k)]
    if diffs:
        L.append("warning: the configs differ in " + ", ".join(
            f"{k} ({ca.get(k)} vs {cb.get(k)})" for k in diffs) + "; ratios compare unlike things")
    L += ["", f"{'limit (GFLOP/s, GB/s)':<28}{'A':>12}{'B':>12}{'B/A':>8}"] + _limit_rows(a, b)
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


def _config(d: dict) -> dict:
    """A report's "config" with what reports before the families left out filled in: the
    lesson's block, as many K/V heads as heads, d_ff 4 d_model."""
    c = d["config"]
    return {"family": "lesson", "n_kv_heads": c.get("n_heads"), "d_ff": 4 * c.get("d_model", 0), **c}


def _who(d):
    m, c = d["machine"], _config(d)
    family = "" if c["family"] == "lesson" else f"{c['family']} block (d_ff={c['d_ff']}, {c['n_kv_heads']} K/V heads), "
    return (f"{m['date']}, {m['cpu']}, {d['threads']['requested']} threads; {family}d_model={c['d_model']}, "
            f"n_heads={c['n_heads']}, {c['dtype']}, {'causal' if c['causal'] else 'full square'}")
