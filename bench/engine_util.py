"""What bench_engines.py and its engine modules share: the exception of an engine that
cannot be had, logging, logged subprocesses, files made under a temporary name, the timing
loop and the row every engine's measurement becomes.  Nothing is measured here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


class Unavailable(Exception):
    """An engine, or one of its formats, that cannot be had here; the message says why."""


def log(msg: str) -> None:
    print(f"== {msg}", file=sys.stderr, flush=True)


def run_logged(cmd: list, log_path: Path, what: str, timeout: float = 3600, **kw) -> None:
    """cmd with its output in log_path; Unavailable naming ``what`` and the log's last lines if it fails."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as f:
        try:
            p = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, timeout=timeout, **kw)
        except FileNotFoundError as e:
            raise Unavailable(f"{what}: {e.filename} not found") from None
        except subprocess.TimeoutExpired:
            raise Unavailable(f"{what}: no result after {timeout:.0f} s (log {log_path})") from None
    if p.returncode:
        tail = " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-3:])
        raise Unavailable(f"{what} failed (exit {p.returncode}): {tail[-400:]} (log {log_path})")


def fresh(path: Path) -> Path:
    """path's temporary sibling, emptied: written there, renamed into place when complete,
    so an interrupted run never leaves a half-made file a later run would reuse."""
    tmp = path.with_name(path.name + ".partial")
    if tmp.is_dir():
        shutil.rmtree(tmp)
    elif tmp.exists():
        tmp.unlink()
    return tmp


def timed(decode, prefill, reps: int) -> tuple[list, list]:
    """One untimed call of each (compiles, first touches), then ``reps`` of each, interleaved."""
    decode(), prefill()
    d, p = [], []
    for _ in range(reps):
        d.append(decode())
        p.append(prefill())
    return d, p


def read_beside(nbytes: int, threads: int, measure, passes: int = 3):
    """measure()'s result, and the best read bandwidth (bytes/s) of ``passes`` passes over
    nbytes just before it and as many just after (tblock.perf.peak.read_pass): a floor of
    the moment the measurement ran, where a shared host's bandwidth drifts within minutes."""
    from tblock.perf.peak import read_pass
    read = read_pass(nbytes, threads)

    def best() -> float:
        times = []
        for _ in range(passes):
            t = time.perf_counter()
            read()
            times.append(time.perf_counter() - t)
        return min(times)
    before = best()
    out = measure()
    return out, nbytes / min(before, best())


def row(engine, weights, matches, decode_s, prefill_s, nbytes, bytes_what, info, kv_bytes=None,
        read_bw=None) -> dict:
    """One engine's measurement at one format: ``nbytes`` the weights a decode step reads
    (``bytes_what`` says which), ``kv_bytes`` the keys and values it reads at the timed
    steps' middle context (None: not known), ``read_bw`` the read bandwidth beside the
    measurement (read_beside; None: only the run's)."""
    return {"engine": engine, "weights": weights, "matches": matches, "decode_s": list(decode_s),
            "prefill_s": list(prefill_s), "decode_median_s": float(np.median(decode_s)),
            "prefill_median_s": float(np.median(prefill_s)), "bytes": int(nbytes), "bytes_counted": bytes_what,
            "kv_bytes": kv_bytes, "read_bw": read_bw, "loadavg": os.getloadavg()[0], "info": info}
