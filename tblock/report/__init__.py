"""``tblock report``: where the time of one block goes, and where attention overtakes the FFN.

The report measures the machine's limits (the FMA peak of the vector path in use, the read
bandwidth of each memory level; the BLAS's GEMM as a reference), then sweeps the sequence
length T for one block config and times every component (tblock.backends) of every backend
separately, next to the FLOPs tblock.flops gives for it, and a cached decode step; each is
placed under its roofline bound. It writes a folder (report.md, report.json, PNG plots) and
prints a summary. The FLOP model says scores + AV (4 T^2 d_model for the full
square, about half that causal) catch up with the FFN's 4 T d_model d_ff at T = d_ff
(4 d_model), or about 8 d_model causal; the report puts the measured crossover next to it.
``--family llama`` sweeps the block of today's small models instead (RMSNorm, SwiGLU, rotary,
grouped-query attention): its three FFN matrices move the model's crossover to 1.5 d_ff
(3 d_ff - 1 causal), grouped K/V heads do not move it.

``tblock report --compare A.json B.json`` prints two saved reports side by side.

    options    the command line and the --out folder
    family     the swept block (--family) and the one function that builds its BlockConfig
    limits     the machine's limits, measured (through tblock.perf.peak)
    sweep      the measurements (through tblock.perf)
    roofline   the byte model and each point's bound
    analysis   crossovers and ratios from the raw timings
    markdown   report.md and the terminal summary
    plots      the PNGs
    compare    --compare
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import api, peers  # noqa: F401  (api: the module the tests patch forward on)
from ..backends import REFERENCES
from ..backends.components import COMPONENTS, component_flops
from ..config import BlockConfig
from ..counting import param_count
from ..outfolder import OutputError, write_folder
from ..perf import Progress, git_commit, machine_info, pinned_threads  # noqa: F401
# besides what this module runs, the names the CLI and the tests use are importable from here
from .analysis import add_derived, flop_model, measured_crossover  # noqa: F401
from .compare import compare_text, load_report
from .limits import measure_limits, remeasure
from .markdown import load_warning, render_markdown, summary_text
from .options import (PLOTS, SCHEMA, ReportError, ReportOptions, add_arguments, check_out_folder,  # noqa: F401
                      default_T_list, refuse_foreign, resolve_options, written_by_tblock)
from .plots import write_plots
from .sweep import prepare_all, run_peers, run_sweep, time_decode, worked_example_rows


def _jsonable(v):
    return float(v) if np.ndim(v) == 0 else [float(x) for x in np.ravel(v)]


def write_report_folder(data: dict, out: Path, force: bool = False) -> None:
    """report.json, report.md and the plots into ``out`` (tblock.outfolder's rules): a
    previous report's files are replaced, its plots not written this time removed, and
    anything else in the folder refuses the write unless ``force`` (then it is left alone)."""
    out = Path(out)

    def fill(staging: Path) -> list[str]:
        data["plots"] = write_plots(data, staging) if data["options"]["plots"] else {
            "files": [], "reason": "--no-plots was given"}
        (staging / "report.json").write_text(json.dumps(data, indent=1) + "\n")
        (staging / "report.md").write_text(render_markdown(data))
        return ["report.json", "report.md", *data["plots"]["files"]]

    if out.is_dir() and not force:
        refuse_foreign(str(out), out)      # again: files may have come in during the run
    write_folder(out, str(out), "--out", fill, ours=written_by_tblock, force=force, stale=PLOTS)


def build_report(opts: ReportOptions, command: str, progress_stream=None) -> dict:
    t_start = time.perf_counter()
    data = {"schema": SCHEMA, "command": command, "options": asdict(opts), "machine": machine_info()}
    clock = {}                   # where the report's own time goes
    cfg = opts.block()
    if opts.dtype == "float32" and cfg.lesson_block:   # before Numba's pool starts (peers: float32, the lesson's block)
        peers.import_early(peers.PEERS if opts.peers is None else opts.peers)
    t0 = time.perf_counter()
    sets = prepare_all(opts)
    clock["prepare_s"] = time.perf_counter() - t0
    with pinned_threads(opts.threads, "torch" in opts.backends) as threads:
        data["threads"] = threads
        t0 = time.perf_counter()
        data["limits"] = measure_limits(threads["numba"], opts.ceiling_sizes, with_torch="torch" in opts.backends)
        clock["limits_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        data["worked_example"] = {b: [[q, _jsonable(lesson), _jsonable(ours)] for q, lesson, ours
                                      in worked_example_rows(b)] for b in opts.backends if b not in REFERENCES}
        clock["worked_example_s"] = time.perf_counter() - t0
        n_peers = len(peers.PEERS if opts.peers is None else opts.peers)
        steps = len(opts.T_list) * (len(opts.backends) * len(COMPONENTS) + n_peers) + 1
        progress = Progress(steps, progress_stream)
        try:
            data.update(run_sweep(opts, sets, progress, between=lambda: remeasure(data["limits"])))
            t0 = time.perf_counter()
            data["decode"] = time_decode(opts, data["backends"])
            clock["decode_s"] = time.perf_counter() - t0
            progress.step("numba decode step")
            t0 = time.perf_counter()
            data["peers"] = run_peers(opts, progress)
            clock["peers_s"] = time.perf_counter() - t0
        finally:
            progress.close()
        t0 = time.perf_counter()
        remeasure(data["limits"])
        clock["limits_s"] += time.perf_counter() - t0
        try:
            import numba
            data["threads"]["numba_threading_layer"] = numba.threading_layer()
        except (ImportError, ValueError):   # ValueError: no parallel numba code ran
            data["threads"]["numba_threading_layer"] = None
    data["T"] = list(opts.T_list)
    data["flops"] = {str(T): component_flops(cfg, T) for T in opts.T_list}
    data["flop_model"] = flop_model(data["config"])
    data["params"] = {"config": param_count(cfg), "toy": param_count(BlockConfig(d_model=8, n_heads=2)),
                      "toy_ln_affine": param_count(BlockConfig(d_model=8, n_heads=2), ln_affine=True)}
    add_derived(data)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    data["machine"]["loadavg_end"] = list(load) if load else None
    data["elapsed_s"] = time.perf_counter() - t_start
    clock["sweep_s"] = {b: rec["sweep_s"] for b, rec in data["backends"].items()}
    data["clock"] = clock
    data["plots"] = {"files": [], "reason": "not written yet"}
    return data


def run_report(opts: ReportOptions, command: str = "tblock report", out=print, progress_stream=None) -> int:
    backends = ", ".join(opts.backends)
    cfg = opts.block()
    family = "" if opts.family == "lesson" else (
        f"{opts.family} block (RMSNorm, SwiGLU d_ff={cfg.d_ff}, rotary, {cfg.kv_heads} K/V heads), ")
    out(f"tblock report: {family}d_model={opts.d_model}, n_heads={opts.n_heads}, {opts.dtype}, "
        f"{'causal' if opts.causal else 'full square'}, T={opts.T_list[0]}..{opts.T_list[-1]} "
        f"({len(opts.T_list)} points), backends {backends}, {opts.threads} threads ({opts.mode})")
    for b, why in opts.unavailable.items():
        out(f"   not run: {b}: {why}")
    data = build_report(opts, command, progress_stream)
    write_report_folder(data, Path(opts.out), force=opts.force)
    out("")
    out(summary_text(data))
    out("")
    skipped = {b: sorted(set(r["skipped"].values())) for b, r in data["backends"].items() if r["skipped"]}
    for b, why in skipped.items():
        out(f"note: {b}: {'; '.join(why)}")
    for b, rec in data["backends"].items():
        for r in rec["results"]:
            if r["status"] == "error":
                out(f"error: {b} {r['component']} at T={r['T']}: {r['reason']}")
    busy = load_warning(data["machine"], data["threads"]["requested"])
    if busy:
        out(f"warning: {busy}")
    out(f"wrote {opts.out}/report.md, report.json" + (", " + ", ".join(data["plots"]["files"]) if data["plots"]["files"]
                                                     else f" (no plots: {data['plots']['reason']})")
        + f" in {data['elapsed_s']:.0f} s")
    return 0


def main(args: argparse.Namespace, argv_text: str = "tblock report") -> int:
    """Run ``tblock report`` from parsed arguments; bad options exit 2, writing nothing."""
    try:
        if args.compare:
            a, b = (load_report(p) for p in args.compare)
            print(compare_text(a, b, *args.compare))
            return 0
        opts = resolve_options(args)
        return run_report(opts, command=argv_text)
    except (ReportError, OutputError) as e:
        print(f"tblock report: error: {e}", file=sys.stderr)
        return 2
