#!/usr/bin/env python3
"""The first call: compiling the numba backend from an empty cache, and loading it from the cache.

    python bench/first_call.py                   # d_model 768, T 1024, float32, 3 runs
    python bench/first_call.py --runs 5 --json first_call.json
    make bench-first-call

Every measurement is a fresh process (a child of this script) with NUMBA_CACHE_DIR set to
a folder of its own:

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
import json
import os
import statistics
import subprocess
import sys
import tempfile

from tblock import perf

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import numpy as np
import tblock
from numba.core.registry import CPUDispatcher
t1 = time.perf_counter()
job, d, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c0, w0 = time.process_time(), time.perf_counter()
if job == "warmup":
    tblock.warmup()
else:
    cfg = tblock.BlockConfig(d_model=d, n_heads=d // 64, d_ff=4 * d)
    w = tblock.init_weights(cfg, seed=0, dtype=np.float32)
    H = np.random.default_rng(0).standard_normal((T, d)).astype(np.float32)
    c0, w0 = time.process_time(), time.perf_counter()
    tblock.forward(H, w, cfg)
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
import gc
stats = [o.stats for o in gc.get_objects() if isinstance(o, CPUDispatcher)]
print(json.dumps({"import_s": t1 - t0, "wall_s": wall, "cpu_s": cpu,
                  "compiled": sum(sum(s.cache_misses.values()) for s in stats),
                  "loaded": sum(sum(s.cache_hits.values()) for s in stats),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def child(job: str, d: int, T: int, cache_dir: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    p = subprocess.run([sys.executable, "-c", CHILD, job, str(d), str(T)], env=env, capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"the {job} child failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


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
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-warmup", action="store_true", help="skip the warmup() measurement")
    ap.add_argument("--json", help="write the measurements here")
    args = ap.parse_args()
    cpu, path = perf.cpu_info(), perf.vector_path()
    print(f"CPU: {cpu['model']} (family {cpu.get('family')} model {cpu.get('model_id')}), "
          f"vector path {path['name']}, load {os.getloadavg()[0]:.2f}")
    record = {"machine": perf.machine_info(), "vector_path": path, "d_model": args.d_model, "T": args.T,
              "runs": args.runs}
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
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
