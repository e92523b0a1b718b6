#!/usr/bin/env python3
"""Decoding with a KV cache: tblock.GPT2 against transformers, and against the memory's floor.

    python bench/bench_decode.py                    # contexts 128 and 1024, prefill 1024, 2 threads
    python bench/bench_decode.py --contexts 128 --json decode.json
    make bench-decode                               # installs transformers and torch first

The model: GPT-2 small's shape (12 layers, 768, 12 heads, vocab 50257) with transformers'
random initialisation, float32, B = 1; tblock is that model saved with save_pretrained and
loaded with GPT2.from_pretrained (numba backend).  Measured, in one run:

  decode step at context L (the step's token attends over L keys: L - 1 cached, itself)
    tblock:        model.next_logits(token, cache): the embedding, 12 cached blocks, LN_f and
                   the vocabulary head on that one row; then the caches' length is set back
                   to L - 1, so every repetition decodes at the same context;
    transformers:  model(input_ids=token, cache=<DynamicCache of L - 1>, use_cache=True)
                   under torch.inference_mode, then cache.crop(-1);
    also tblock's parts on their own: the 12 blocks (Stack with caches) and the head.
  floor            weight bytes / read bandwidth.  Bytes counted: the float32 parameters of
                   the 12 blocks (every matrix, bias and LayerNorm) plus the tied embedding
                   wte the head reads (vocab x d); not the one wpe row, not the cache.  The
                   cache's 2 * n_layer * L * d floats, also read every step, give the second
                   floor "+ KV".  Read bandwidth: tblock.perf.peak.memory_bandwidth, 1 GiB
                   summed with vector loads on every thread, best of 10, in this run.  And
                   "in rounds": the same read of the weights' bytes (tblock.perf.peak.read_pass)
                   timed in the decode point's own interleaved rounds, its median: the floor
                   under the bandwidth the step itself met (a shared host's swings by a
                   third between moments).  And "paired": the median of 40 (or
                   --min-reps) ratios of one step to one such read made right beside it
                   (tblock.perf.paired, the order alternating): the floor at the step's own
                   moments.
  prefill          P tokens into empty caches, logits of the last row only (tblock:
                   next_logits; transformers: model(ids, use_cache=True, logits_to_keep=1)).
  memory           the caches' bytes against 2 * n_layer * T * d * 4 (T = n_positions), their
                   decode scratch (KVCache.work: a step allocates nothing), and
                   the process's RSS after the first token and after --steps more (greedy
                   GPT2.stream: nothing may grow per token), with generate's tokens/s beside
                   transformers' generate (greedy, the same prompt and count).

Timing: torch imported before Numba's pool (tblock.peers.import_early), every library pinned
to --threads (tblock.perf.pin_threads), tblock.perf.interleaved rounds, medians.  Before the
timing, each point's logits are compared with transformers' (max relative error, printed).
Nothing is asserted: it is a measurement; a shared machine is noisy (the load average is
printed at the start and the end).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time

import numpy as np
from common import SMALL, add_transformers_run, build_gpt2, finish, int_list, rel_err, transformers_record

from tblock import peers, perf



def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm (pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def weight_bytes(ours) -> dict:
    """Bytes of float32 weights one decode step streams (see the module's docstring)."""
    from tblock.backends.numba.packing import packed as _packed
    blocks = sum(a.nbytes for w in ours.blocks for a in w.arrays().values())
    packed = sum(_packed(w, np.float32).nbytes for w in ours.blocks)
    return {"blocks": blocks, "head": ours.wte.nbytes, "total": blocks + ours.wte.nbytes,
            "blocks_packed": packed}        # what the kernels read: the panels, padding included


def hf_step_fn(hf, cache_kw: str):
    """one cached transformers step at a fixed context: forward one token, crop it off again."""
    import torch

    def make(ids_t, L):
        with torch.inference_mode():
            out = hf(ids_t[:, :L - 1], use_cache=True)
        kv = getattr(out, cache_kw)     # the DynamicCache of L - 1 tokens (5.x names it cache)
        tok = ids_t[:, L - 1:L]

        def step():
            with torch.inference_mode():
                logits = hf(input_ids=tok, use_cache=True, **{cache_kw: kv}).logits
            kv.crop(-1)                 # back to L - 1: the next repetition decodes at L again
            return logits
        return step
    return make


PAIRS = 40      # a step and a read of the weights' bytes side by side, this many times


def decode_point(hf, ours, L, make_hf_step, floor_s, kv_floor_s, read_floor, budget_s, min_reps) -> dict:
    ids = np.random.default_rng(L).integers(0, hf.config.vocab_size, (1, L))
    import torch
    theirs = make_hf_step(torch.from_numpy(ids), L)
    cache = ours.make_cache(L)
    ours.next_logits(ids[0, :L - 1], cache)              # L - 1 tokens cached
    tok = ids[0, L - 1:]
    buf = np.empty((1, ours.config.vocab_size), np.float32)
    H1 = ours.wte[ids[:, L - 1:]] + ours.wpe[L - 1:L]     # (1, 1, d): the step's embedding

    def back():
        for c in cache:
            c.length = L - 1

    def step():
        ours.next_logits(tok, cache, out=buf)
        back()

    def blocks():
        ours.stack(H1, backend="numba", cache=cache)
        back()

    def head():
        ours.head(H1, "numba", buf[:, None])            # LN_f + the head GEMV, on some row

    first = perf.first_calls(step, ())
    step()
    err = rel_err(buf[0], theirs()[0, -1].numpy())
    times = perf.interleaved({"tblock": step, "transformers": theirs, "tblock blocks": blocks,
                              "tblock head": head, "read the weights' bytes": read_floor}, min_reps, budget_s)
    med = {n: float(np.median(ts)) for n, ts in times.items()}
    in_rounds = med["read the weights' bytes"]
    pairs = np.array(perf.paired(step, read_floor, max(min_reps, PAIRS)))     # (n, 2): step, read
    paired = pairs[:, 0] / pairs[:, 1]
    return {"context": L, "max_rel_err": err, "median_s": med, "best_s": {n: min(ts) for n, ts in times.items()},
            "reps": {n: len(ts) for n, ts in times.items()}, "first_calls_s": first,
            "ratio": med["tblock"] / med["transformers"], "floor_s": floor_s, "over_floor": med["tblock"] / floor_s,
            "floor_kv_s": kv_floor_s, "over_floor_kv": med["tblock"] / kv_floor_s,
            "floor_in_rounds_s": in_rounds, "over_floor_in_rounds": med["tblock"] / in_rounds,
            "paired_s": pairs.tolist(), "over_floor_paired": float(np.median(paired)),
            "over_floor_paired_iqr": np.percentile(paired, [25, 75]).tolist()}


def prefill_point(hf, ours, P, budget_s, min_reps) -> dict:
    import torch
    ids = np.random.default_rng(P + 1).integers(0, hf.config.vocab_size, (1, P))
    ids_t = torch.from_numpy(ids)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(hf.forward).parameters else {}
    cache = ours.make_cache(P)
    buf = np.empty((1, ours.config.vocab_size), np.float32)

    def mine():
        for c in cache:
            c.reset()
        return ours.next_logits(ids[0], cache, out=buf)

    def theirs():
        with torch.inference_mode():
            return hf(ids_t, use_cache=True, **keep).logits[0, -1]

    first = perf.first_calls(mine, ())
    err = rel_err(mine(), theirs().numpy())
    times = perf.interleaved({"tblock": mine, "transformers": theirs}, min_reps, budget_s)
    med = {n: float(np.median(ts)) for n, ts in times.items()}
    return {"tokens": P, "max_rel_err": err, "median_s": med, "best_s": {n: min(ts) for n, ts in times.items()},
            "reps": {n: len(ts) for n, ts in times.items()}, "first_calls_s": first,
            "ratio": med["tblock"] / med["transformers"], "transformers_logits_to_keep": bool(keep)}


def memory_point(hf, ours, prompt_len, steps) -> dict:
    """The caches' size, RSS across --steps greedy tokens, and generate's tokens/s on both sides."""
    import torch
    c = ours.config
    caches = ours.make_cache()
    cache_bytes = sum(k.nbytes for k in caches)
    work_bytes = sum(k.work.nbytes for k in caches)     # a decode step's scratch, beside the cache
    expected = 2 * c.n_layer * c.n_positions * c.n_embd * 4
    del caches
    ids = np.random.default_rng(7).integers(0, c.vocab_size, prompt_len)
    rss, t, toks = [], [], []
    for n, tok in enumerate(ours.stream(ids, steps + 1, temperature=0), 1):
        toks.append(tok)
        if n in (1, steps + 1):
            rss.append(rss_bytes())
            t.append(time.perf_counter())
    ours_tps = steps / (t[1] - t[0])          # the one-token steps after the first token
    hf.generation_config.eos_token_id = None        # no early stop: the same count as ours
    hf.generation_config.pad_token_id = 0
    x = torch.from_numpy(ids[None])
    with torch.inference_mode():
        t0 = time.perf_counter()
        theirs = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=steps + 1)
        hf_s = time.perf_counter() - t0
    return {"cache_bytes": cache_bytes, "cache_bytes_expected": expected, "work_bytes": work_bytes,
            "prompt": prompt_len, "steps": steps,
            "rss_after_first_token": rss[0], "rss_after_last": rss[1], "rss_growth": rss[1] - rss[0],
            "tblock_tokens_per_s": ours_tps, "transformers_generate_tokens_per_s": (steps + 1) / hf_s,
            "same_tokens_as_transformers": bool(np.array_equal(np.concatenate([ids, toks]), theirs[0].numpy()))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int_list, default=[128, 1024], metavar="L,L",
                    help="decode-step contexts (keys attended; default 128,1024)")
    ap.add_argument("--prefill", type=int, default=1024, help="prefill length (default 1024)")
    ap.add_argument("--steps", type=int, default=200, help="decode steps of the memory check (default 200)")
    ap.add_argument("--bandwidth-mib", type=int, default=1024, help="buffer of the bandwidth measurement")
    add_transformers_run(ap, budget_s=15.0)
    args = ap.parse_args(argv)
    n_pos = args.model["n_positions"]
    bad = [L for L in args.contexts + [args.prefill] if not 1 <= L <= n_pos]
    if bad:
        ap.error(f"--contexts and --prefill must lie in 1..{n_pos}, got {bad}")
    if not 1 <= args.steps <= n_pos - 2:
        ap.error(f"--steps must lie in 1..{n_pos - 2}, got {args.steps}")

    peers.import_early(["torch"])           # torch before Numba's pool (tblock.peers says why)
    threads, _ = perf.pin_threads(args.threads, with_torch=True)
    from tblock.perf.peak import memory_bandwidth, read_pass
    hf, ours, load_s = build_gpt2(args.model, seed=0)
    cache_kw = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    results = transformers_record(threads, args.model, load_s)

    bw = memory_bandwidth(threads["numba"], nbytes=args.bandwidth_mib << 20)
    results["bandwidth"] = bw
    wb = results["weight_bytes"] = weight_bytes(ours)
    read = bw["read_GBs"] * 1e9
    floor = wb["total"] / read
    results["floor_s"] = floor
    print(f"\nmemory: read {bw['read_GBs']:.1f} GB/s, copy {bw['copy_GBs']:.1f} GB/s (read + written; "
          f"{bw['copy_GBs'] / 2:.1f} GB/s copied), {bw['buffer_bytes'] >> 20} MiB, best of {bw['runs']}")
    print(f"weights per token: blocks {wb['blocks'] / 1e6:.1f} MB (packed {wb['blocks_packed'] / 1e6:.1f} MB) + "
          f"head, tied wte {wb['head'] / 1e6:.1f} MB = {wb['total'] / 1e6:.1f} MB; floor {floor * 1e3:.2f} ms/token")
    shape = "GPT-2 small shape" if args.model == SMALL else f"shape {args.model}"
    print(f"{shape}, random weights, float32, B = 1; medians of interleaved rounds\n", flush=True)

    read_floor = read_pass(wb["total"], threads["numba"])
    make_hf_step = hf_step_fn(hf, cache_kw)
    d, n_layer = args.model["n_embd"], args.model["n_layer"]
    print(f"{'context':>7} {'tblock':>9} {'blocks':>8} {'head':>7} {'transformers':>13} {'ratio':>6} "
          f"{'floor':>8} {'x floor':>7} {'+KV floor':>9} {'x':>5} {'in rounds':>9} {'x':>5} {'x paired':>8} "
          f"{'rel err':>8}")
    results["decode"] = []
    for L in args.contexts:
        kv_floor = (wb["total"] + 2 * n_layer * L * d * 4) / read
        r = decode_point(hf, ours, L, make_hf_step, floor, kv_floor, read_floor, args.budget, args.min_reps)
        results["decode"].append(r)
        m = r["median_s"]
        print(f"{L:>7} {m['tblock'] * 1e3:>6.2f} ms {m['tblock blocks'] * 1e3:>5.2f} ms {m['tblock head'] * 1e3:>4.2f} ms "
              f"{m['transformers'] * 1e3:>10.2f} ms {r['ratio']:>6.2f} {floor * 1e3:>5.2f} ms {r['over_floor']:>7.2f} "
              f"{kv_floor * 1e3:>6.2f} ms {r['over_floor_kv']:>5.2f} {r['floor_in_rounds_s'] * 1e3:>6.2f} ms "
              f"{r['over_floor_in_rounds']:>5.2f} {r['over_floor_paired']:>8.2f} {r['max_rel_err']:>8.1e}", flush=True)

    r = results["prefill"] = prefill_point(hf, ours, args.prefill, args.budget, args.min_reps)
    m = r["median_s"]
    print(f"\nprefill of {args.prefill} tokens (last row's logits): tblock {m['tblock'] * 1e3:.1f} ms, "
          f"transformers {m['transformers'] * 1e3:.1f} ms, ratio {r['ratio']:.2f} (rel err {r['max_rel_err']:.1e})",
          flush=True)

    r = results["memory"] = memory_point(hf, ours, min(128, n_pos - args.steps - 1), args.steps)
    pad = ("" if r["cache_bytes"] == r["cache_bytes_expected"] else
           "; the rest is the packed layout's padding of d_k and T to whole panels")
    print(f"caches: {r['cache_bytes']:,} bytes for T = {n_pos} "
          f"(2 * {n_layer} * {n_pos} * {d} * 4 = {r['cache_bytes_expected']:,}{pad}), and {r['work_bytes']:,} bytes "
          f"of decode scratch (KVCache.work); RSS after the first token "
          f"{r['rss_after_first_token'] / 2**20:.1f} MiB, after {r['steps']} more {r['rss_after_last'] / 2**20:.1f} MiB "
          f"({r['rss_growth'] / 2**20:+.2f} MiB)")
    print(f"greedy generation after a {r['prompt']}-token prompt: tblock {r['tblock_tokens_per_s']:.1f} tokens/s, "
          f"transformers' generate {r['transformers_generate_tokens_per_s']:.1f} tokens/s; "
          f"same tokens: {r['same_tokens_as_transformers']}")

    finish(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
