#!/usr/bin/env python3
"""tblock.GPT2 against transformers' GPT2LMHeadModel: the logits of a GPT-2-small-shaped model.

    python bench/bench_gpt2.py                      # T = 128 and 1024, 2 threads (minutes)
    python bench/bench_gpt2.py --points 128 --threads 2 --json gpt2.json
    make bench-gpt2                                 # installs transformers and torch first

The model: GPT-2 small's shape (n_layer 12, n_embd 768, n_head 12, vocab 50257, n_positions
1024) with transformers' random initialisation (weights do not change the time).  The peer
is GPT2LMHeadModel in float32, eval(), under torch.inference_mode(), use_cache=False (only
the logits are wanted); tblock is that model saved with save_pretrained and loaded with
GPT2.from_pretrained, run on the numba backend.  Both compute the whole forward pass of
B = 1 sequence, the embeddings, the 12 blocks, LN_f and the vocabulary head included.

How: torch is imported before Numba's thread pool starts (tblock.peers.import_early); every
library is pinned to --threads (tblock.perf.pin_threads); the two first calls of each are
left out; then tblock.perf.interleaved runs rounds of tblock and torch in turn (a pause,
one uncounted call, a few timed samples each) and the medians are reported.  Before the
timing, tblock's logits are checked against transformers' (max relative error, printed).
Nothing is asserted: it is a measurement; a machine shared with compiles is noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

import tblock
from tblock import peers, perf

SMALL = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def parse_model(text: str) -> dict:
    """n_layer:n_embd:n_head:vocab_size -> GPT2Config keywords (n_positions stays 1024)."""
    n_layer, n_embd, n_head, vocab = (int(x) for x in text.split(":"))
    return dict(SMALL, n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab)


def build(shape: dict, seed: int):
    """(transformers' model, tblock's GPT2 loaded from its save_pretrained, seconds to load)."""
    import torch
    import transformers
    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape, bos_token_id=0, eos_token_id=0)).eval()
    with tempfile.TemporaryDirectory() as root:
        hf.save_pretrained(root)
        t = time.perf_counter()
        ours = tblock.GPT2.from_pretrained(root)
        load_s = time.perf_counter() - t
    return hf, ours, load_s


def run_record(threads: dict, model: dict, load_s: float) -> dict:
    """What a run against transformers records first (CPU, vector path, threads, versions,
    commit, load), printed as the run's header."""
    import torch
    import transformers
    c, p = perf.cpu_info(), perf.vector_path()
    results = {"cpu": c, "isa": p, "threads": threads, "usable_cores": perf.usable_cores(),
               "date": time.strftime("%Y-%m-%d"),
               "versions": {"python": platform.python_version(), **perf.versions(),
                            "transformers": transformers.__version__},
               "git_commit": perf.git_commit(), "loadavg_start": list(os.getloadavg()), "model": model,
               "load_s": load_s}
    print(f"CPU {c.get('model')} (family {c.get('family')}, model {c.get('model_id')}), "
          f"{perf.usable_cores()} usable cores; tblock path {p['name']} (LLVM cpu {p['cpu']}); "
          f"{threads['requested']} threads (numba {threads['numba']}, torch {threads['torch']})")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, tblock commit {results['git_commit']}, "
          f"load average {results['loadavg_start'][0]:.2f}")
    return results


def finish_record(results: dict, json_path: str | None) -> None:
    """The run's last line (the load, which says how far to trust it) and its JSON."""
    import numba
    results["loadavg_end"] = list(os.getloadavg())
    try:
        results["threads"]["numba_threading_layer"] = numba.threading_layer()   # known once the pool has run
    except ValueError:
        results["threads"]["numba_threading_layer"] = "not started: every call ran serially"
    print(f"\nload average at start {results['loadavg_start'][0]:.2f}, at end {results['loadavg_end'][0]:.2f} "
          f"(above the thread count: other work shared the cores)")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1, default=str)


def bench_point(hf, ours, T: int, budget_s: float, min_reps: int) -> dict:
    import torch
    ids = np.random.default_rng(T).integers(0, hf.config.vocab_size, (1, T))
    ids_t = torch.from_numpy(ids)

    def theirs():
        with torch.inference_mode():
            return hf(ids_t, use_cache=False).logits

    def mine():
        return ours(ids)

    first = {}
    for name, f in (("tblock", mine), ("transformers", theirs)):
        first[name] = perf.first_calls(f, ())       # compilation and first touch land here
    err = rel_err(mine(), theirs().numpy())
    times = perf.interleaved({"tblock": mine, "transformers": theirs}, min_reps, budget_s)
    med = {n: float(np.median(ts)) for n, ts in times.items()}
    return {"T": T, "B": 1, "max_rel_err": err, "median_s": med, "best_s": {n: min(ts) for n, ts in times.items()},
            "reps": {n: len(ts) for n, ts in times.items()}, "first_calls_s": first,
            "ratio": med["tblock"] / med["transformers"]}


def int_list(text: str) -> list[int]:
    """"128,1024" -> [128, 1024]."""
    return [int(x) for x in text.split(",")]


def add_run_arguments(ap: argparse.ArgumentParser, budget_s: float) -> None:
    """The options every run against transformers takes (this script and bench_decode)."""
    ap.add_argument("--threads", type=int, default=2, help="threads for tblock and torch (default 2)")
    ap.add_argument("--budget", type=float, default=budget_s, help="seconds of interleaved rounds per point")
    ap.add_argument("--min-reps", type=int, default=7, help="timed samples per library per point at least")
    ap.add_argument("--model", type=parse_model, default=SMALL, metavar="L:D:H:V",
                    help="another shape, n_layer:n_embd:n_head:vocab_size (default GPT-2 small: 12:768:12:50257)")
    ap.add_argument("--json", metavar="FILE", help="also write the results here")


def parse_run_arguments(ap: argparse.ArgumentParser, argv):
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    return args


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int_list, default=[128, 1024], metavar="T,T",
                    help="sequence lengths (default 128,1024)")
    add_run_arguments(ap, budget_s=20.0)
    args = parse_run_arguments(ap, argv)
    bad = [T for T in args.points if not 1 <= T <= SMALL["n_positions"]]
    if bad:
        ap.error(f"--points must lie in 1..{SMALL['n_positions']}, got {bad}")

    peers.import_early(["torch"])           # torch before Numba's pool (tblock.peers says why)
    threads, _ = perf.pin_threads(args.threads, with_torch=True)
    hf, ours, load_s = build(args.model, seed=0)
    results = run_record(threads, args.model, load_s)
    results["points"] = []
    shape = "GPT-2 small shape" if args.model == SMALL else f"shape {args.model}"
    print(f"{shape}, random weights, float32, B = 1; GPT2.from_pretrained {load_s:.1f} s; "
          f"median of interleaved rounds, logits included\n", flush=True)
    print(f"{'T':>6} {'tblock':>11} {'transformers':>13} {'ratio':>7} {'max rel err':>12}")
    for T in args.points:
        r = bench_point(hf, ours, T, args.budget, args.min_reps)
        results["points"].append(r)
        m = r["median_s"]
        print(f"{T:>6} {m['tblock'] * 1e3:>8.1f} ms {m['transformers'] * 1e3:>10.1f} ms {r['ratio']:>7.2f} "
              f"{r['max_rel_err']:>12.1e}", flush=True)
    finish_record(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
