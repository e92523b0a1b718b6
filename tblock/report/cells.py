"""How report.md and the terminal write numbers, sizes and tables."""

from __future__ import annotations

import numpy as np

LABELS = {"layernorm": "layernorm", "softmax": "softmax (standalone)", "attention_core": "attn core",
          "attention": "attention", "ffn": "ffn", "block": "block"}


def fmt_value(v):
    if np.ndim(v) == 0:
        return repr(float(v))
    return "[" + ", ".join(f"{float(x):.6f}" for x in np.ravel(v)) + "]"


def ms(s):
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3g} s"
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} µs"


def flops_text(n):
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n}"


def fmt_T(x):
    return "-" if x is None else f"{x:,.0f}"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    # a "|" inside a cell (|H_in|) would end the cell: escape it
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def bytes_text(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def lesson_shape(cfg_d: dict) -> bool:
    """The lesson's block at its d_ff = 4 d_model, whose crossovers read 4·d_model and 8·d_model."""
    return cfg_d.get("family", "lesson") == "lesson" and cfg_d.get("d_ff", 4 * cfg_d["d_model"]) == 4 * cfg_d["d_model"]


def crossover_formulas(cfg_d: dict) -> tuple[str, str]:
    """The FLOP model's core = FFN crossover (tblock.crossover_T) as formulas, full square and
    causal, each starting with its relation sign: "= 4·d_model", "≈ 8·d_model" for the
    lesson's block; in d_ff, then in d_model, otherwise ("= 1.5·d_ff ≈ 4·d_model" gated)."""
    if lesson_shape(cfg_d):
        return "= 4·d_model", "≈ 8·d_model"
    d, f = cfg_d["d_model"], cfg_d["d_ff"]
    gated = cfg_d.get("ffn") == "gated"
    full, causal = (1.5 * f, 3 * f - 1) if gated else (f, 2 * f - 1)
    names = ("1.5·d_ff", "3·d_ff − 1") if gated else ("d_ff", "2·d_ff − 1")
    return (f"= {names[0]} ≈ {full / d:.3g}·d_model", f"= {names[1]} ≈ {causal / d:.3g}·d_model")


def plain(text: str) -> str:
    """A formula for the terminal: * for ·, ~ for ≈, - for −."""
    return text.replace("≈ ", "~").replace("·", "*").replace("−", "-")


def block_text(cfg_d: dict) -> str:
    """The swept block's variant in a few words ("" for the lesson's block)."""
    if cfg_d.get("family", "lesson") == "lesson":
        return ""
    return (f"{cfg_d['family']} block: RMSNorm, SwiGLU d_ff={cfg_d['d_ff']}, rotary, "
            f"{cfg_d['n_kv_heads']} K/V head{'s' if cfg_d['n_kv_heads'] != 1 else ''}")
