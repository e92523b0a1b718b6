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
