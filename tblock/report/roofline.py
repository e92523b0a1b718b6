"""The roofline: each timed call's FLOPs against the bytes it must move at least, and the
rate the machine's measured limits (tblock.report.limits) allow it.

    bound = min(FMA peak of the dtype it computes in, intensity x read bandwidth)

with intensity = FLOPs / bytes.  The bytes are a lower bound (BYTE_MODEL): its inputs,
weights and outputs once each, in the report's dtype, nothing in between.  The bandwidth is
that of the smallest memory level that holds those bytes: the report times a call over and
over on the same arrays, so a call whose data fit a cache reads them from there."""

from __future__ import annotations

import numpy as np

from ..config import BlockConfig
from ..counting import flops, param_breakdown
from .family import block_config

BYTE_MODEL = (
    "bytes = what a call must move at least: its inputs, its weights and its output once each, in "
    "the report's dtype (X and the output are T x d_model; the attention core reads Q, K and V; the "
    "standalone softmax reads the (n_heads, T, T) scores (only the lower triangle when causal) and "
    "writes all of its (n_heads, T, T) probabilities); no intermediate (Q, K, V, the FFN's T x d_ff "
    "hidden layer, scores) is counted, so a fused kernel could reach it and an unfused one cannot. "
    "A decode step reads its row, every weight and the K and V of the cached tokens, and writes its "
    "own K and V and its output row.")
LEVEL_MODEL = (
    "The memory roof of a point is the read bandwidth of the smallest level that holds its bytes "
    "(L1 and L2 once per thread, L3 shared): every call is timed over and over on the same arrays, so "
    "what fits a cache is read from there; a level is credited at least the bandwidth of every level "
    "beyond it (a level timed slower than a larger one met a busy moment). The bandwidths are measured "
    "by summing a buffer of half that level's size with vector loads on every thread (main memory: 8 "
    "times the last cache, at least 256 MiB).")
# a point counts as above its roof when its rate exceeds the bound by more than this: the
# median of a few calls on a shared host against a best-of-runs limit
NOISE_PCT = 5.0


def weight_elements(cfg: BlockConfig) -> dict[str, int]:
    """Parameters each component reads (tblock.backends.components' components), as
    tblock.counting counts them: grouped-query W_K, W_V of d_kv columns, the gated FFN's
    third matrix, RMSNorm's gamma alone."""
    parts = param_breakdown(cfg)
    ln = parts["ln_affine"] // 2 if cfg.ln_affine else 0      # one norm's gamma (and beta)
    attn = parts["attention"] + (parts["attn_bias"] if cfg.qkv_bias else 0)
    ffn = parts["ffn"] + (parts["ffn_bias"] if cfg.ffn_bias else 0)
    return {"layernorm": ln, "softmax": 0, "attention_core": 0, "attention": attn, "ffn": ffn,
            "block": attn + ffn + 2 * ln}


def component_bytes(cfg: BlockConfig, T: int, component: str, itemsize: int) -> int:
    """The bytes one call of ``component`` on T tokens must move at least (BYTE_MODEL)."""
    d, H = cfg.d_model, cfg.n_heads
    if component == "softmax":
        read = H * (T * (T + 1) // 2 if cfg.causal else T * T)
        return (read + H * T * T) * itemsize
    inputs = T * (d + 2 * cfg.d_kv) if component == "attention_core" else T * d      # Q; K, V of d_kv
    return (inputs + weight_elements(cfg)[component] + T * d) * itemsize


def decode_flops(cfg: BlockConfig, context: int) -> int:
    """FLOPs of one cached step of the block whose token attends over ``context`` keys (the
    context - 1 cached and its own): tblock.flops for one token, whose one score per head
    becomes ``context``."""
    c = flops(cfg, 1).full
    return sum(c.values()) + (context - 1) * (c["scores"] + c["softmax"] + c["av"])


def decode_bytes(cfg: BlockConfig, context: int, itemsize: int) -> int:
    """Bytes of that step at least: its row in and out, every weight, and the keys and values
    of ``context`` tokens (context - 1 read from the cache, its own written), d_kv wide each."""
    d = cfg.d_model
    return (2 * d + weight_elements(cfg)["block"] + 2 * context * cfg.d_kv) * itemsize


def memory_level(nbytes: int, bandwidth: list[dict]) -> tuple[str, float]:
    """(name, GB/s) of the smallest level of ``bandwidth`` (limits' list, smallest first, main
    memory last) whose capacity holds ``nbytes``.  Its GB/s are at least those of every larger
    level: what a cache holds can always be read as fast as from further out, and a level
    timed lower than one beyond it met a busy moment."""
    i = next((i for i, lv in enumerate(bandwidth) if lv["capacity_bytes"] is None or nbytes <= lv["capacity_bytes"]),
             len(bandwidth) - 1)
    return bandwidth[i]["name"], max(lv["read_GBs"] for lv in bandwidth[i:])


def bound(peak_gflops: float, intensity: float, bandwidth_GBs: float) -> float:
    """The roofline's bound in GFLOP/s: FLOP/byte x GB/s is GFLOP/s."""
    return min(peak_gflops, intensity * bandwidth_GBs)


def place(n_flops: int, nbytes: int, peak_gflops: float, bandwidth: list[dict], gflops: float | None = None) -> dict:
    """One point on the roofline: its bytes, intensity, memory level, bound, which roof
    bounds it, and (when ``gflops`` was measured) its % of that bound."""
    level, bw = memory_level(nbytes, bandwidth)
    intensity = n_flops / nbytes
    b = bound(peak_gflops, intensity, bw)
    out = {"bytes": nbytes, "intensity": intensity, "level": level, "bandwidth_GBs": bw,
           "peak_gflops": peak_gflops, "bound_gflops": b,
           "bound_by": "compute" if peak_gflops <= intensity * bw else "memory"}
    if gflops is not None:
        out["pct_roof"] = 100.0 * gflops / b
    return out


def add_roofline(data: dict) -> None:
    """Place every component row of every backend, and the decode step, under its roof;
    data["roofline"] holds the models and the points above their roof (beyond NOISE_PCT)."""
    lim = data["limits"]
    cfg = block_config(data["config"])
    itemsize = np.dtype(data["config"]["dtype"]).itemsize
    above = []
    for b, rec in data["backends"].items():
        peak = lim["peak"][rec["compute_dtype"]]["gflops"]
        for row in rec["results"]:
            ok = row["status"] == "ok"
            row.update(place(row["flops"], component_bytes(cfg, row["T"], row["component"], itemsize), peak,
                             lim["bandwidth"], row["gflops"] if ok else None))
            if ok and row["pct_roof"] > 100 + NOISE_PCT:
                above.append({"backend": b, "component": row["component"], "T": row["T"], "pct_roof": row["pct_roof"]})
    dec = data.get("decode")
    if dec and dec.get("flops"):
        dec.update(place(dec["flops"], decode_bytes(cfg, dec["context"], itemsize),
                         lim["peak"][data["config"]["dtype"]]["gflops"], lim["bandwidth"], dec.get("gflops")))
        if dec.get("pct_roof", 0) > 100 + NOISE_PCT:
            above.append({"backend": dec["backend"], "component": "decode", "T": dec["context"],
                          "pct_roof": dec["pct_roof"]})
    data["roofline"] = {"byte_model": BYTE_MODEL, "level_model": LEVEL_MODEL, "noise_pct": NOISE_PCT,
                        "above": above}
