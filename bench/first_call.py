#!/usr/bin/env python3
"""The first call: compiling the numba backend from an empty cache, and loading it from the cache.

    python bench/first_call.py                   # d_model 768, T 1024, float32, 3 runs
    python bench/first_call.py --runs 5 --json first_call.json
    make bench-first-call

Every measurement is a fresh process (bench/child_first_call.py) with NUMBA_CACHE_DIR set
to a folder of its own:

  cold     the folder is empty: `import tblock`, then the first tblock.forward on a (T,
           d_model) input of random weights; its wall and CPU time, the signatures Numba
           compiled for it, and the child's peak RSS (compiling is most of it)
  cached   a second child on the folder the cold one filled: the same first call, loaded
  warmup   tblock.warmup() in a child on an empty folder (everything forward can call:
           both dtypes, serial and parallel, every input layout), then in one on the
           folder it filled

Medians over --runs; the import's own time is printed apart.  Nothing is asserted: a
shared machine is noisy (the load average is printed at the start and the end).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from common import add_json, finish, last_json, machine_line, machine_record, positive_int, run_child

def child(job: str, d: int, T: int, cache_dir: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    p = run_child("child_first_call", job, d, T, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"the {job} child failed:\n{p.stderr}")
    return last_json(p)


def measure(job: str, d: int, T: int, runs: int) -> dict:
    """{"cold": [...], "cached": [...]}: a cold child and a cached one on its folder, per run."""
    out = {"cold": [], "cached": []}
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="tblock-first-call-") as cache_dir:
            out["cold"].append(child(job, d, T, cache_dir))
            out["cached"].append(child(job, d, T, cache_dir))
    return out


def median(rows: list, key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("-T", type=int, default=1024)
    ap.add_argument("--runs", type=positive_int, default=3)
    ap.add_argument("--no-warmup", action="store_true", help="skip the warmup() measurement")
    add_json(ap)
    args = ap.parse_args()
    record = machine_record()       # no threads pinned here: the children use every usable core
    record.update(d_model=args.d_model, T=args.T, runs=args.runs)
    print(machine_line(record))
    jobs = ["forward"] + ([] if args.no_warmup else ["warmup"])
    for job in jobs:
        rows = measure(job, args.d_model, args.T, args.runs)
        record[job] = rows
        what = f"first forward, d_model {args.d_model}, T {args.T}, float32" if job == "forward" else "warmup()"
        for kind in ("cold", "cached"):
            r = rows[kind]
            walls = ", ".join(f"{x['wall_s']:.2f}" for x in r)
            print(f"{what:<40} {kind:>6}: wall {median(r, 'wall_s'):6.2f} s  cpu {median(r, 'cpu_s'):6.2f} s  "
                  f"compiled {median(r, 'compiled'):4.0f}  loaded {median(r, 'loaded'):4.0f}  "
                  f"peak RSS {median(r, 'peak_rss_mib'):4.0f} MiB  (import {median(r, 'import_s'):.2f} s; "
                  f"walls {walls})")
    finish(record, args.json)


if __name__ == "__main__":
    main()
