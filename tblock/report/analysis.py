"""What the raw timings say: each point under its roof, the measured crossovers, backend ratios."""

from __future__ import annotations

import math

from ..backends.components import COMPONENTS, sublayer_crossover_T
from ..counting import crossover_T
from .family import block_config
from .roofline import add_roofline


def add_derived(data: dict) -> None:
    """Fill in the roofline (bytes, intensity, bound, % of roof), the crossovers and the
    backend ratios from the raw timings."""
    add_roofline(data)
    for rec in data["backends"].values():
        rec["crossover"] = {
            "attention_vs_ffn": measured_crossover(rec["results"], "attention", "ffn"),
            "core_vs_ffn": measured_crossover(rec["results"], "attention_core", "ffn"),
        }
        rec["first_call_overhead_s"] = first_call_overheads(rec["results"])
    data["summary"] = backend_ratios(data)


# the last slope is extended to a crossing no further than this (a longer sequence than any model's)
EXTRAPOLATE_MAX_T = 10**9


def median_times(results, component) -> dict[int, float]:
    """T -> median seconds of one component's successful rows."""
    return {r["T"]: r["median_s"] for r in results if r["component"] == component and r["status"] == "ok"}


def measured_crossover(results, num: str, den: str) -> dict:
    """Where time(num) overtakes time(den): the first T-interval where the ratio goes from
    below 1 to at least 1, interpolated linearly in log T against log ratio. Also the ratio of
    achieved GFLOP/s (num over den) there: time equality needs FLOPs(num)/FLOPs(den) = that
    rate ratio, which is what moves the measured T away from the FLOP model's."""
    a, f = median_times(results, num), median_times(results, den)
    gf = {(r["component"], r["T"]): r["gflops"] for r in results if r["status"] == "ok"}
    Ts = sorted(set(a) & set(f))
    if len(Ts) < 1:
        return {"T": None, "status": "not measured", "ratios": {}, "rate_ratio": None}
    ratio = {T: a[T] / f[T] for T in Ts}

    def rate_ratio(*Tb):
        r = [gf[(num, T)] / gf[(den, T)] for T in Tb]
        return math.exp(sum(map(math.log, r)) / len(r))

    out = {"ratios": {str(T): ratio[T] for T in Ts}}
    if all(r >= 1 for r in ratio.values()):
        return {**out, "T": None, "rate_ratio": rate_ratio(Ts[0]),
                "status": f"below the sweep: {num} is already slower at T={Ts[0]}"}
    # the last upward crossing: from there on attention stays slower. Noise at small T can
    # add earlier ones; they are counted so the report can say the curve was not clean.
    ups = [(T0, T1) for T0, T1 in zip(Ts, Ts[1:]) if ratio[T0] < 1 <= ratio[T1]]
    if ups and all(ratio[T] >= 1 for T in Ts if T >= ups[-1][1]):
        T0, T1 = ups[-1]
        x0, x1, y0, y1 = math.log(T0), math.log(T1), math.log(ratio[T0]), math.log(ratio[T1])
        T = math.exp(x0 + (0 - y0) * (x1 - x0) / (y1 - y0))
        crossings = sum(1 for u, v in zip(Ts, Ts[1:]) if (ratio[u] < 1) != (ratio[v] < 1))
        note = "" if crossings == 1 else f" (the ratio crossed 1 {crossings} times: noisy timings)"
        return {**out, "T": T, "rate_ratio": rate_ratio(T0, T1),
                "status": f"measured between T={T0} and T={T1}{note}"}
    if len(Ts) >= 2 and ratio[Ts[-1]] > ratio[Ts[-2]]:
        # the last slope, extended: a hint where it would cross, clearly labelled as such;
        # none from a nearly flat slope (noise), which would reach 1 at an absurd T
        x0, x1 = math.log(Ts[-2]), math.log(Ts[-1])
        y0, y1 = math.log(ratio[Ts[-2]]), math.log(ratio[Ts[-1]])
        log_T = x1 + (0 - y1) * (x1 - x0) / (y1 - y0)
        if log_T <= math.log(EXTRAPOLATE_MAX_T):
            T = math.exp(log_T)
            return {**out, "T": None, "extrapolated_T": T, "rate_ratio": rate_ratio(Ts[-1]),
                    "status": f"above the sweep: {num} still faster at T={Ts[-1]}; the last slope reaches 1 near T={T:.0f}"}
    return {**out, "T": None, "rate_ratio": rate_ratio(Ts[-1]),
            "status": f"above the sweep: {num} still faster at T={Ts[-1]}"}


def first_call_overheads(results) -> dict:
    """Per component, at the first T it ran: first call minus the steady median (compilation,
    first-touch of memory, lazy caches)."""
    out = {}
    for r in results:
        if r["status"] == "ok" and r["component"] not in out:
            out[r["component"]] = {"T": r["T"], "first_call_s": r["first_call_s"], "median_s": r["median_s"],
                                   "overhead_s": max(0.0, r["first_call_s"] - r["median_s"])}
    return out


def backend_ratios(data: dict) -> dict:
    """time(backend) / time(reference) per component: geometric mean over the T both measured,
    with the range and the ratio at the largest common T. The reference is the first backend."""
    names = list(data["backends"])
    if not names:
        return {"reference": None, "ratios": {}}
    ref = names[0]
    out = {"reference": ref, "ratios": {}}
    for b in names[1:]:
        for c in COMPONENTS:
            tb, tr = median_times(data["backends"][b]["results"], c), median_times(data["backends"][ref]["results"], c)
            Ts = sorted(set(tb) & set(tr))
            if not Ts:
                continue
            r = [tb[T] / tr[T] for T in Ts]
            out["ratios"].setdefault(b, {})[c] = {
                "geomean": math.exp(sum(map(math.log, r)) / len(r)), "min": min(r), "max": max(r),
                "n_T": len(Ts), "T_max": Ts[-1], "at_T_max": r[-1]}
    return out


def flop_model(cfg_d: dict) -> dict:
    """The FLOP model's crossovers for report.json's "config": the attention core against the
    FFN's matmuls (tblock.crossover_T: d_ff and 2 d_ff - 1 for the two-matrix FFN, 1.5 d_ff
    and 3 d_ff - 1 for the gated one), and the whole sublayers against each other."""
    cfg = block_config(cfg_d)
    return {"crossover_T_full": crossover_T(cfg, False), "crossover_T_causal": crossover_T(cfg, True),
            "sublayer_crossover_T_full": sublayer_crossover_T(cfg, False),
            "sublayer_crossover_T_causal": sublayer_crossover_T(cfg, True),
            "four_d_model": 4 * cfg.d_model, "eight_d_model": 8 * cfg.d_model,
            "ffn_matrices": 3 if cfg.ffn == "gated" else 2}
