"""report.md's "Machine limits" and "Roofline" sections and their terminal lines: pure
functions of the JSON, like the rest of report.md (tblock.report.markdown)."""

from __future__ import annotations

from ..backends.components import COMPONENTS
from .cells import LABELS, bytes_text, flops_text, ms, table

SOFTMAX_NOTE = (
    "The standalone softmax normalises a materialised (n_heads, T, T) score array and writes the "
    "(n_heads, T, T) probabilities: about 6 FLOPs per score against at least 8 bytes in float32, so it "
    "runs on the memory roof, and its bytes grow as T². The attention core, the sublayer and the block "
    "never write those probabilities (they work on tiles of the square that stay in cache), so at large T "
    "the standalone softmax takes longer than the whole block: it times a way of computing attention the "
    "block does not use.")


def limits_section(data: dict) -> list[str]:
    """The FMA peaks, the read bandwidths and the BLAS's GEMM, as measured in the run."""
    lim = data["limits"]
    isa, n = lim["isa"], lim["threads"]
    L = ["## Machine limits", "",
         f"Measured in this run on {n} thread{'s' if n > 1 else ''}: at the start, after each backend's "
         "sweep and at the end; the best of these is used (a limit is what the machine can do, a moment when "
         f"other processes held a core only hides it). Vector path: **{isa['name']}** ({isa['vector_bytes'] * 8}-bit vectors"
         + (", forced by TBLOCK_ISA" if isa.get("forced") else "") + ").", ""]
    rows = []
    for dt, p in lim["peak"].items():
        rows.append([f"{dt} FMA peak", f"**{p['gflops']:.1f} GFLOP/s**",
                     f"{p['accumulators']} independent chains of {isa['vector_bytes'] * 8}-bit FMAs ({p['lanes']} "
                     f"lanes) per thread, no memory traffic; {_spread(p['samples_gflops'])}"])
    for lv in lim["bandwidth"]:
        held = "main memory" if lv["capacity_bytes"] is None else f"holds {bytes_text(lv['capacity_bytes'])} on {n} threads"
        rows.append([f"{lv['name']} read bandwidth", f"**{lv['read_GBs']:.1f} GB/s**",
                     f"{held}: a {bytes_text(lv['buffer_bytes'])} buffer summed with vector loads, best of "
                     f"{lv['runs']}; {_spread(lv['samples_GBs'])}"])
    for dt, g in lim["blas_gemm"].items():
        runs = ", ".join(f"{r['library']} n={r['n']}: {r['gflops']:.1f}" for r in g["runs"])
        rows.append([f"{dt} BLAS GEMM (reference)", f"{g['gflops']:.1f} GFLOP/s", f"{g['source']}; {runs}"])
    L += table(["limit", "value", "how"], rows) + [""]
    note = lim["blas"].get("note")
    return L + ["The float32 and float64 limits below are the FMA peaks. The BLAS's GEMM is a reference line, "
                "not a limit: it shows what the BLAS in use reaches, with the kernel it runs"
                + (f". **Note**: {note}." if note else ".") if lim["blas_gemm"] else "", ""]


def _spread(samples) -> str:
    """The measurements a limit is the best of."""
    return f"{len(samples)} measurements, {min(samples):.1f}–{max(samples):.1f}"


def roofline_section(data: dict) -> list[str]:
    """Every component and T under its roof: FLOPs, bytes, intensity, and each backend's rate."""
    r = data["roofline"]
    names = list(data["backends"])
    L = ["## Roofline", "",
         "bound = min(FMA peak of the dtype a backend computes in, FLOP/byte × read bandwidth of the memory "
         "level that holds the bytes); % of roof = achieved GFLOP/s ÷ bound. FLOPs: tblock.flops, "
         f"{'causal' if data['config']['causal'] else 'full square'} count (as in the backend tables). "
         + r["byte_model"] + " " + r["level_model"], "",
         SOFTMAX_NOTE, "",
         "Each backend's cell: achieved GFLOP/s of its bound, and % of roof.", ""]
    by = {b: {(x["component"], x["T"]): x for x in data["backends"][b]["results"]} for b in names}
    rows = []
    for c in COMPONENTS:
        for T in data["T"]:
            ref = next((by[b][c, T] for b in names if (c, T) in by[b]), None)
            if ref is None or "bytes" not in ref:
                continue
            rows.append([LABELS[c], T, flops_text(ref["flops"]), bytes_text(ref["bytes"]), f"{ref['intensity']:.3g}",
                         f"{ref['level']} ({ref['bandwidth_GBs']:.0f} GB/s)"] + [_roof_cell(by[b].get((c, T))) for b in names])
    d = data.get("decode")
    if d and "bytes" in d:
        rows.append([f"decode step ({d['backend']})", f"context {d['context']}", flops_text(d["flops"]), bytes_text(d["bytes"]),
                     f"{d['intensity']:.3g}", f"{d['level']} ({d['bandwidth_GBs']:.0f} GB/s)"]
                    + [_roof_cell(d) if b == d["backend"] else "" for b in names])
    L += table(["component", "T", "FLOPs", "bytes (least)", "FLOP/byte", "held in"] + names, rows) + [""]
    if d:
        L += [_decode_line(d), ""]
    above = r["above"]
    L += [f"Above the roof by more than the noise margin ({r['noise_pct']:g}%): "
          + ("; ".join(f"{a['backend']} {a['component']} T={a['T']} ({a['pct_roof']:.0f}%)" for a in above)
             if above else "none") + ".", ""]
    return L


def _roof_cell(x) -> str:
    if x is None or x["status"] != "ok":
        return "-" if x is None else x["status"]
    return f"{x['gflops']:.3g} of {x['bound_gflops']:.3g} ({x['pct_roof']:.0f}%)"


def _decode_line(d: dict) -> str:
    if d["status"] != "ok":
        return f"Decode step: {d['status']} ({d['reason']})."
    return (f"Decode step: one token through the block on the {d['backend']} backend with a KVCache, attending over "
            f"{d['context']} keys ({d['context'] - 1} cached and its own), the cache set back after each step: "
            f"{ms(d['median_s'])} median, {d['gflops']:.3g} GFLOP/s, {d['bound_by']}-bound, "
            f"{d['pct_roof']:.0f}% of its roof; at {d['bandwidth_GBs']:.0f} GB/s its bytes alone take "
            f"{ms(d['bytes'] / d['bandwidth_GBs'] / 1e9)}.")


def limits_lines(data: dict) -> list[str]:
    """The limits and the roofline in a few terminal lines."""
    lim = data["limits"]
    L = [f"limits ({lim['isa']['name']} path, {lim['threads']} threads): FMA peak "
         + ", ".join(f"{dt} {p['gflops']:.1f}" for dt, p in lim["peak"].items()) + " GFLOP/s; read bandwidth "
         + ", ".join(f"{lv['name']} {lv['read_GBs']:.0f}" for lv in lim["bandwidth"]) + " GB/s",
         "BLAS GEMM (reference): " + ", ".join(f"{dt} {g['gflops']:.1f} GFLOP/s ({g['source']})"
                                               for dt, g in lim["blas_gemm"].items())]
    if lim["blas"].get("note"):
        L.append(f"   note: {lim['blas']['note']}")
    best = {}
    for b, rec in data["backends"].items():
        ok = [r for r in rec["results"] if r["status"] == "ok"]
        if ok:
            best[b] = max(ok, key=lambda r: r["pct_roof"])
    if best:
        L.append("highest % of roof: " + "; ".join(f"{b} {LABELS[r['component']]} T={r['T']} {r['pct_roof']:.0f}%"
                                                  for b, r in best.items()))
    d = data.get("decode")
    if d and d["status"] == "ok":
        L.append(f"decode step ({d['backend']}, context {d['context']}): {ms(d['median_s'])}, "
                 f"{d['gflops']:.3g} GFLOP/s, {d['pct_roof']:.0f}% of its {d['bound_by']} roof ({d['level']})")
    above = data["roofline"]["above"]
    if above:
        L.append(f"above the roof (> {data['roofline']['noise_pct']:g}% over): "
                 + "; ".join(f"{a['backend']} {a['component']} T={a['T']} {a['pct_roof']:.0f}%" for a in above))
    return L
