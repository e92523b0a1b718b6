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
import sys

import numpy as np
from common import SMALL, add_transformers_run, build_gpt2, finish, int_list, rel_err, transformers_record

from tblock import peers, perf


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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int_list, default=[128, 1024], metavar="T,T",
                    help="sequence lengths (default 128,1024)")
    add_transformers_run(ap, budget_s=20.0)
    args = ap.parse_args(argv)
    bad = [T for T in args.points if not 1 <= T <= SMALL["n_positions"]]
    if bad:
        ap.error(f"--points must lie in 1..{SMALL['n_positions']}, got {bad}")

    peers.import_early(["torch"])           # torch before Numba's pool (tblock.peers says why)
    threads, _ = perf.pin_threads(args.threads, with_torch=True)
    hf, ours, load_s = build_gpt2(args.model, seed=0)
    results = transformers_record(threads, args.model, load_s)
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
    finish(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
