"""report.md and the terminal summary: pure functions of the JSON, so a saved report.json
renders the same page."""

from __future__ import annotations


from ..backends.components import COMPONENTS
from .analysis import median_times
from .cells import (LABELS, crossover_formulas, flops_text, fmt_T, fmt_value, lesson_shape, ms,  # noqa: F401
                    plain, table)  # (fmt_T: compare imports it from here)
from .roofline_text import limits_lines, limits_section, roofline_section

def render_markdown(data: dict) -> str:
    sections = (_header, limits_section, roofline_section, _crossovers, _ratios, peers_markdown, _flops_table, _backends,
                _worked_example, _plots)
    return "\n".join(line for section in sections for line in section(data))


def _header(data: dict) -> list[str]:
    """Who made the report, on what, and how."""
    cfg, m, opts = data["config"], data["machine"], data["options"]
    v = m["versions"]
    L = ["# tblock report", "",
         f"Made {m['date']} by `{data['command']}` in {data['elapsed_s']:.0f} s"
         + (f" (tblock {v['tblock']}, git {m['git_commit']})." if m.get("git_commit") else f" (tblock {v['tblock']})."),
         "",
         f"- **Machine**: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable); {m['platform']}; "
         f"load average {_load(m.get('loadavg_start'))} at the start, {_load(m.get('loadavg_end'))} at the end "
         "(other work on the machine shows up as noise).",
         f"- **Software**: Python {m['python']}, " + ", ".join(f"{k} {x}" for k, x in v.items() if k != "tblock" and x)
         + ".",
         f"- **BLAS**: " + "; ".join(_blas_line(b) for b in m["blas"]) + ".",
         f"- **Threads**: {_threads_line(data['threads'])}.",
         _block_line(cfg),
         f"- **Parameters per block**: {data['params']['config']:,}; the lesson's toy (d_model=8, d_ff=32) "
         f"{data['params']['toy']} (lesson: 808), {data['params']['toy_ln_affine']} with LN affines (lesson: 840).",
         f"- **Sweep** ({opts['mode']}): T = {', '.join(str(T) for T in data['T'])}; median of {opts['repeats']} "
         f"repeats after two warm-up calls; backends: {', '.join(data['backends'])}."
         + (" Time spent: limits {:.0f} s, ".format(data["clock"]["limits_s"])
            + ", ".join(f"{b} {t:.0f} s" for b, t in data["clock"]["sweep_s"].items()) + "."
            if data.get("clock") else "")]
    busy = load_warning(m, data["threads"]["requested"])
    if busy:
        L += [f"- **Warning**: {busy}"]
    if opts.get("unavailable"):
        L += [f"- **Not run**: " + "; ".join(f"{b} ({why})" for b, why in opts["unavailable"].items()) + "."]
    return L + [""]


def _block_line(cfg: dict) -> str:
    """The swept block: its shape and, beyond the lesson's, each of its variants."""
    mask = "causal" if cfg["causal"] else "no mask (full square)"
    if cfg.get("family", "lesson") == "lesson":
        return (f"- **Block**: d_model={cfg['d_model']}, n_heads={cfg['n_heads']} (d_k={cfg['d_k']}), "
                f"d_ff={cfg['d_ff']}, {mask}, {cfg['norm']}-LN, {cfg['activation']}, "
                f"no biases; inputs {cfg['dtype']}, one sequence (B=1).")
    group = cfg["n_heads"] // cfg["n_kv_heads"]
    return (f"- **Block** (`--family {cfg['family']}`): d_model={cfg['d_model']}, n_heads={cfg['n_heads']} "
            f"(d_k={cfg['d_k']}), n_kv_heads={cfg['n_kv_heads']} (grouped-query: d_kv={cfg['d_kv']}, {group} query "
            f"head{'s' if group > 1 else ''} per K/V head), d_ff={cfg['d_ff']}, {mask}, {cfg['norm']}-norm RMSNorm "
            f"with gamma (the layernorm component times it), SwiGLU FFN (silu(X W_gate) ⊙ X W_up) W_down, rotary "
            f"positions on Q and K (θ={cfg['rope_theta']:g}), no biases; inputs {cfg['dtype']}, one sequence (B=1).")


def _crossovers(data: dict) -> list[str]:
    """The measured crossovers per backend next to the FLOP model's, and how to read them."""
    cfg, fm = data["config"], data["flop_model"]
    model_T = fm["crossover_T_causal"] if cfg["causal"] else fm["crossover_T_full"]
    rows = []
    for b, rec in data["backends"].items():
        sub, core = rec["crossover"]["attention_vs_ffn"], rec["crossover"]["core_vs_ffn"]
        rr = core.get("rate_ratio")
        rows.append([b, _crossing_cell(sub), _crossing_cell(core),
                     "-" if rr is None else f"{rr:.2f}", "-" if rr is None else fmt_T(model_T * rr)])
    L = ["## Crossover: where attention's time overtakes the FFN's", ""]
    L += table(["backend", "attention sublayer = FFN, measured T", "attention core = FFN, measured T",
                 "core GFLOP/s ÷ FFN GFLOP/s there", f"FLOP model {model_T:,.0f} × that rate ratio"], rows)
    full, causal = crossover_formulas(cfg)
    d = cfg["d_model"]
    sub = [fm[f"sublayer_crossover_T_{k}"] for k in ("full", "causal")]
    sub_terms = ("2·d_model", "4·d_model") if lesson_shape(cfg) else tuple(f"{T / d:.2g}·d_model" for T in sub)
    gqa = cfg.get("n_kv_heads", cfg["n_heads"]) != cfg["n_heads"]
    projections = ("W_Q and W_O d_model x d_model, W_K and W_V d_model x d_kv" if gqa
                   else "four d_model x d_model projections")
    matmuls = "three" if cfg.get("ffn") == "gated" else "two"
    return L + ["", f"FLOP model (tblock.flops), d_model={d}" + (f", d_ff={cfg['d_ff']}" if not lesson_shape(cfg) else "")
                + ":", "",
                f"- attention **core** (scores + softmax + AV) against the FFN's {matmuls} matmuls, `tblock.crossover_T`: "
                f"T = {fm['crossover_T_full']:,.0f} {full} for the full square, "
                f"T = {fm['crossover_T_causal']:,.0f} {causal} causal;",
                f"- the whole attention **sublayer** (with its {projections}) against the whole FFN: "
                f"T ≈ {sub[0]:,.0f} (≈ {sub_terms[0]}) full square, "
                f"T ≈ {sub[1]:,.0f} (≈ {sub_terms[1]}) causal.",
                "", READING, ""] + ([FAMILY_READING[cfg["family"]], ""] if cfg.get("family") in FAMILY_READING else [])


READING = (
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
    "GELU passes in float64) pushes the crossover up instead.")


# what the crossover means for a block beyond the lesson's (only llama today)
FAMILY_READING = {"llama": (
    "The Llama-family block. Its FFN is gated (SwiGLU): three d_model x d_ff matrices, 6 T d_model d_ff "
    "FLOPs, so scores + AV catch up with it at T = 1.5·d_ff (full square) or 3·d_ff − 1 (causal) rather "
    "than d_ff and 2·d_ff − 1; with d_ff ≈ 8/3 d_model, the width Llama and SmolLM2 choose so the three "
    "matrices hold the two-matrix FFN's parameters, that is 4·d_model and 8·d_model again. Grouped-query "
    "attention does not move the core's crossover: every query head still scores and mixes d_k columns, "
    "it only reads fewer distinct K/V heads. It shrinks W_K and W_V, so the sublayer's projection FLOPs "
    "(which moves the sublayer crossover), and the KV cache a decode step reads. Rotary positions are counted "
    "with the Q/K projections (3 FLOPs per turned element), RMSNorm as 3 FLOPs per element plus gamma.")}


def _ratios(data: dict) -> list[str]:
    """Each backend's time over the reference backend's, per component."""
    s = data["summary"]
    if not s["ratios"]:
        return []
    ref, others = s["reference"], list(s["ratios"])
    L = ["## Backend against backend", "",
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
    return L + table(["component"] + [f"{b} / {ref}" for b in others], rows) + [""]


def _flops_table(data: dict) -> list[str]:
    k = "causal" if data["config"]["causal"] else "full"
    L = [f"## FLOPs per component (tblock.flops; {'causal' if k == 'causal' else 'full square'} count, "
         "full square in brackets when it differs)", ""]
    rows = []
    for T in data["T"]:
        f = data["flops"][str(T)]
        cells = [flops_text(f[k][c]) + (f" [{flops_text(f['full'][c])}]" if f["full"][c] != f[k][c] else "")
                 for c in COMPONENTS]
        rows.append([T] + cells + [f"{f[k]['attention'] / f[k]['ffn']:.2f}"])
    return L + table(["T"] + [LABELS[c] for c in COMPONENTS] + ["attention/ffn"], rows) + [""]


def _backends(data: dict) -> list[str]:
    kind = "causal" if data["config"]["causal"] else "full square"
    return [line for b, rec in data["backends"].items() for line in _backend(b, rec, kind)]


def _backend(b: str, rec: dict, kind: str) -> list[str]:
    """One backend's section: what it computes, then a row per T."""
    L = [f"## Backend `{b}`", "",
         f"Computes in {rec['compute_dtype']}; "
         + ("skips the masked tiles of the T x T square" if rec.get("square") == "causal"
            else "computes the whole T x T square, masked entries included") +
         f"; components prepared (weights cast, fused, transposed) "
         f"in {ms(rec['prepare_s'])} before any timing. Each cell: median time, achieved "
         f"GFLOP/s ({kind} count), % of roof (the Roofline section; {rec['compute_dtype']} peak)."]
    L += [f"- {n}" for n in rec["notes"]]
    L += [f"- {LABELS[c]}: n/a ({why})" for c, why in rec["missing"].items()]
    L += [f"- {why}" for why in sorted(set(rec["skipped"].values()))]
    by_T = {}
    for r in rec["results"]:
        by_T.setdefault(r["T"], {})[r["component"]] = r
    rows = [[T] + [_cell(by_T[T].get(c)) for c in COMPONENTS] + [_time_ratio(by_T[T])] for T in sorted(by_T)]
    L += [""] + table(["T"] + [LABELS[c] for c in COMPONENTS] + ["attention/ffn time"], rows) + [""]
    ov = rec["first_call_overhead_s"]
    if ov:
        L += ["First call against the steady median (compilation, first touch of memory, lazy caches), "
              "at the first T each component ran: " +
              "; ".join(f"{LABELS[c]} {ms(o['first_call_s'])} vs {ms(o['median_s'])}" for c, o in ov.items())
              + ".", ""]
    return L


def _cell(r) -> str:
    if r is None or r["status"] == "n/a":
        return "n/a"
    if r["status"] != "ok":
        return f"{r['status']} ({r['reason']})"
    return f"{ms(r['median_s'])} · {r['gflops']:.3g} GF/s · {r['pct_roof']:.0f}% of roof"


def _time_ratio(row: dict) -> str:
    a, f = row.get("attention"), row.get("ffn")
    return f"{a['median_s'] / f['median_s']:.2f}" if a and f and a["status"] == f["status"] == "ok" else "-"


def _worked_example(data: dict) -> list[str]:
    L = ["## Lesson 13 worked example through every tblock backend", "",
         "T=4, d_model=8, 2 heads, d_ff=32, seed 13; the lesson's printed numbers next to ours "
         "(torch is a comparison here, not a tblock backend, so it has no trace to show).", ""]
    we = data["worked_example"]
    if not we:
        return L
    names = list(we)
    rows = [[q, fmt_value(lesson)] + [fmt_value(we[b][i][2]) for b in names] for i, (q, lesson, _) in enumerate(we[names[0]])]
    return L + table(["quantity", "lesson"] + names, rows) + [""]


def _plots(data: dict) -> list[str]:
    if data["plots"]["files"]:
        return ["## Plots", ""] + [f"![{p}]({p})" for p in data["plots"]["files"]] + [""]
    return ["## Plots", "", f"No plots: {data['plots']['reason']}.", ""]


def _peer_reference(data: dict) -> str | None:
    """The backend peers are set against: numba when it was swept, else the first one."""
    names = list(data["backends"])
    return "numba" if "numba" in names else (names[0] if names else None)


def peer_rows(data: dict) -> tuple[list, list]:
    """(header, rows) of the whole block per T: the reference backend, each peer that ran,
    and reference / fastest peer."""
    ran = {n: p for n, p in data.get("peers", {}).items() if p["results"]}
    ref = _peer_reference(data)
    ref_t = median_times(data["backends"][ref]["results"], "block") if ref else {}
    header = ["T", f"{ref} (block)"] + [p["label"] for p in ran.values()] + [f"{ref} / fastest peer"]
    rows = []
    for T in data["T"]:
        cells, best = [], None
        for p in ran.values():
            r = next((r for r in p["results"] if r["T"] == T), None)
            if r is None or r["status"] != "ok":
                cells.append("-" if r is None else r["status"])
                continue
            cells.append(f"{ms(r['median_s'])} · {r['gflops']:.3g} GF/s")
            best = min(best or r["median_s"], r["median_s"])
        ratio = f"{ref_t[T] / best:.2f}" if best and T in ref_t else "-"
        rows.append([T, ms(ref_t.get(T))] + cells + [ratio])
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
            L += [f"- {p['label']} {p['version']}: built in {ms(p.get('build_s'))}, first call "
                  f"{ms(first)}{' (where it compiles)' if p['label'] == 'torch.compile' else ''}" +
                  "".join(f"; T={r['T']} {r['status']} ({r.get('reason')})" for r in p["results"]
                          if r["status"] not in ("ok", "skipped")) + "."]
    L += [f"- {', '.join(labels)}: not run ({why})." for why, labels in not_run(ps).items()] + [""]
    if any(p["results"] for p in ps.values()):
        L += table(*peer_rows(data)) + [""]
    return L


def not_run(ps: dict) -> dict[str, list[str]]:
    """The peers that did not run, grouped by why: {reason: [label, ...]}."""
    out = {}
    for p in ps.values():
        if not p["available"]:
            out.setdefault(p["reason"], []).append(p["label"])
    return out


def _crossing_cell(x: dict) -> str:
    """A measured crossover for a table cell: the T, or which side of the sweep it lies."""
    if x["T"]:
        return fmt_T(x["T"]) + (" (noisy)" if "noisy" in x["status"] else "")
    Ts = sorted(int(T) for T in x.get("ratios", {}))
    if not Ts:
        return "not measured"
    if x["status"].startswith("below"):
        return f"< {Ts[0]}"
    return f"> {Ts[-1]}" + (f" (trend ≈ {fmt_T(x['extrapolated_T'])})" if x.get("extrapolated_T") else "")


def load_warning(m: dict, own: int = 0) -> str | None:
    """A line when other processes competed for the cores while the report ran.  The load at
    the end counts the report's own ``own`` threads too, so it is held to 0.5 above them."""
    start, end = (x[0] if x else 0.0 for x in (m.get("loadavg_start"), m.get("loadavg_end")))
    if start > 0.5 or end > own + 0.5:
        return (f"the 1-minute load average was {start:.2f} at the start and {end:.2f} at the end (the report's "
                f"own {own} thread{'s' if own != 1 else ''} included) on {m['usable_cores']} usable cores: other "
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


def summary_text(data: dict) -> str:
    """What the terminal shows after a run: the worked example, crossovers and ratios."""
    lines = []
    we = data["worked_example"]
    if we:
        names = list(we)
        lines += ["Lesson 13 worked example (T=4, d_model=8, 2 heads, d_ff=32, seed 13)",
                  f"   {'quantity':<24}{'lesson':<44}" + "".join(f"{b:<44}" for b in names)]
        for i, (q, lesson, _) in enumerate(we[names[0]]):
            lines.append(f"   {q:<24}{fmt_value(lesson):<44}" + "".join(f"{fmt_value(we[b][i][2]):<44}" for b in names))
        lines.append("")
    p = data["params"]
    cfg, fm = data["config"], data["flop_model"]
    lines += [f"parameters per block: d_model=8, d_ff=32: {p['toy']} (lesson 808), with LN affines "
              f"{p['toy_ln_affine']} (lesson 840); d_model={cfg['d_model']}: {p['config']:,}", ""]
    lines += limits_lines(data) + [""]
    full, causal = (plain(f).lstrip("= ") for f in crossover_formulas(cfg))
    family = "" if lesson_shape(cfg) else f", {cfg.get('family', 'lesson')} block, d_ff={cfg['d_ff']}"
    lines += [f"crossover, d_model={cfg['d_model']}{family} ({'causal' if cfg['causal'] else 'full square'}): FLOP model "
              f"core=FFN {fm['crossover_T_full']:.0f} full ({full}), {fm['crossover_T_causal']:.0f} causal ({causal}); "
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
    skipped = not_run(data.get("peers", {}))
    if skipped:
        lines += ["", "peers not run: " + "; ".join(f"{', '.join(labels)} ({why})" for why, labels in skipped.items())]
    return "\n".join(lines)

