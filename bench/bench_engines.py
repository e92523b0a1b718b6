#!/usr/bin/env python3
"""tblock at every weight format against the CPU engines people run: llama.cpp, CTranslate2,
OpenVINO and transformers, decoding and prefilling a GPT-2-small- or Llama-family-shaped model.

    python bench/bench_engines.py                # everything (the first run builds llama.cpp: ~30 min on 2 cores)
    python bench/bench_engines.py --quick        # 2 runs of 8 steps: checks the whole flow
    python bench/bench_engines.py --model smollm2-135m --engines tblock,transformers,llama.cpp
    python bench/bench_engines.py --model qwen2.5-0.5b --prepare    # convert only: nothing timed
    python bench/bench_engines.py --engines tblock,llama.cpp --formats int8,int4 --dots --rounds 3
    make bench-engines                           # installs the extras first; ENGINES_ARGS adds options

The model (--model, engine_models.py): GPT-2 small's shape (the default; or L:D:H:V, GPT-2 at
another shape), SmolLM2-135M's (smollm2-135m: LlamaForCausalLM, d 576, 30 layers, 9 heads,
3 KV heads, d_ff 1536, vocab 49152, tied) or Qwen2.5-0.5B's (qwen2.5-0.5b: Qwen2ForCausalLM,
d 896, 24 layers, 14 heads, 2 KV heads, d_ff 4864, vocab 151936, tied), with transformers'
random initialisation (torch seed --seed), saved with save_pretrained with a made-up
byte-level tokenizer, batch 1, --threads threads everywhere (default 2).  Every engine reads
that checkpoint through its own converter:

  tblock        tblock.load(path, weights=fp32|bf16|int8|int4) (GPT2 or Llama, from config.json):
                the tied embedding/head in from_pretrained's default format for it (or
                --head-weights); with --dots the stored formats once more with dot= bf16 / int8
                (inputs rounded, llama.cpp's arithmetic); KV caches in --kv's format; --backend
                picks tblock's backend (default its default); each row says what the model holds
  transformers  AutoModelForCausalLM.from_pretrained, fp32, torch at --threads
  llama.cpp     built from the llama-cpp-python source package (pip download --no-binary,
                its vendored llama.cpp; cmake Release, CPU only, -march=native); its
                convert_hf_to_gguf.py writes F32 and BF16 GGUF files (bench/child_gguf_convert.py
                says what it works around), llama-quantize makes Q8_0, Q4_0 and Q4_K_M from F32;
                timed by llama-bench (-t --threads, -r runs); engine_llama_cpp.py
  CTranslate2   ct2-transformers-converter to int8_float32 and float32 (pip install ctranslate2
                when missing); timed in a child process (bench/child_engine.py)
  OpenVINO      optimum-intel's export (stateful, KV cache in the request) at fp32, and with
                nncf's int8 and int4 (symmetric, groups of 32) weight compression, made in a
                venv of its own (optimum-intel pins a transformers older than the project's);
                run by the project's openvino in a child process with the precision hint
                f32, bf16, or the CPU plugin's default (recorded); engine_converted.py
An engine whose converter does not take a model is listed under "not measured" with its error.

Measured, one run, medians:
  decode    ms per new token after a --context-token prompt (128): the prompt goes in untimed,
            then --gen greedy steps are timed together (tokens at positions 128 .. 128+gen-1),
            one sample per run.  tblock: as generate takes them at temperature 0, the first
            step a next_logits call (it prepares the step for the caches), the others in one
            compiled call (DecodeStep.greedy) where the backend has one.  llama.cpp:
            llama-bench -p 0 -n GEN -d CONTEXT (its -d fills the cache with CONTEXT tokens
            untimed; its steps feed random tokens, no sampling).
  prefill   ms for --prefill tokens (512) into an empty cache up to the last row's logits.
            tblock: next_logits (the head on the last row only); transformers: logits_to_keep=1;
            llama.cpp: llama-bench -p 512 -n 0 (logits of the last token); CTranslate2:
            generate_batch with max_length 1; OpenVINO: one request (the rows of logits its
            export computes are recorded).
  floor     a decode step's bytes / read bandwidth: for tblock and llama.cpp the best of 3
            read passes over the row's weight bytes just before its timed runs and 3 just
            after (engine_util.read_beside: a shared host's bandwidth drifts within minutes),
            for the others the run's (tblock.perf.peak.memory_bandwidth at the start; the
            end's is printed too); with --rounds, x floor is the median of the rounds' ratios.
            Bytes: the weights (tblock's blocks as stored plus the head's matrix; a GGUF
            file's tensors but the position embedding; transformers' parameters but wpe;
            CTranslate2's model.bin and OpenVINO's .bin as files) plus the KV cache the step
            reads at the timed steps' middle context, context + (gen + 1) // 2 tokens
            (tblock: model.bytes_per_token (that context, --kv); llama.cpp: its
            type_k/type_v; transformers: float32; CTranslate2 and OpenVINO: not counted).
  ratios    tblock / engine at the matching format (bf16 vs BF16, int8 vs Q8_0, int4 vs Q4_0
            and Q4_K_M, fp32 vs F32, ...; tblock's faster dot where --dots gave two) and
            tblock fp32 / engine: below 1, tblock is faster.

Everything built or downloaded lives in --cache (default $TBLOCK_ENGINES_CACHE or
~/.cache/tblock-engines), never in the repository: a second run reuses it.  An engine that
cannot be built, installed or converted is reported with the reason, never left out silently.
Nothing is asserted: it is a measurement (the load average is printed at the start and end).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import sys
import time
import traceback
from pathlib import Path

import numpy as np
from child_engine import prompt_ids
from common import add_json, add_threads, finish, machine_line, machine_record, positive_int, rel_err
from engine_converted import ctranslate2_rows, openvino_rows
from engine_llama_cpp import add_engine_args, llama_cpp_rows
from engine_models import MODELS, checkpoint, parse_model
from engine_util import Unavailable, log, read_beside, row, timed

from tblock import peers, perf

ENGINES = ("tblock", "transformers", "llama.cpp", "ctranslate2", "openvino")
TBLOCK_FORMATS = ("fp32", "bf16", "int8", "int4")
PREPARED = ("llama.cpp", "ctranslate2", "openvino")     # the engines --prepare converts for


# ---------------------------------------------------------------------------------------
# tblock and transformers, in this process

def load_tblock(path: Path, fmt: str, head: str | None = None, dot: str = "fp32"):
    """tblock's model of the checkpoint (GPT2 or Llama: tblock.load) with its blocks in
    ``fmt`` (and its head's matrix in ``head``, where given; else the class's default for
    ``fmt``), products computed as ``dot`` says."""
    import tblock
    kw = {} if head is None else {"head_weights": head}
    if dot != "fp32":
        kw["dot"] = dot
    how = "tblock.load(path, weights=fmt" + "".join(f", {k}={v!r}" for k, v in kw.items()) + ")"
    return tblock.load(path, weights=fmt, **kw), how


ROUNDING_DOT = {"bf16": "bf16", "int8": "int8", "int4": "int8"}     # a stored format's faster dot


def tblock_variants(args) -> list:
    """(format, dot) of each tblock row: every format with dot fp32, and with --dots the
    stored ones again with the dot that rounds their inputs."""
    rows = [(f, "fp32") for f in args.formats]
    if args.dots:
        rows += [(f, ROUNDING_DOT[f]) for f in args.formats if f in ROUNDING_DOT]
    return rows


def tblock_bytes(m) -> int:
    """The weights one decode step reads: the blocks as stored and the head's matrix (the
    tied embedding); with the KV cache's bytes, the floor's numerator."""
    return int(m.bytes_per_token(0))


def stored_as(a) -> str:
    """An array's dtype, or a stored matrix's format (tblock.formats)."""
    return getattr(a, "format", None) or str(a.dtype)


def tblock_holds(m, dot: str, kv: str) -> str:
    """What a tblock model holds, in words."""
    head = "tied embedding/head" if m.lm_head is None else f"embedding {stored_as(m.wte)}, untied head"
    positions = "rotary positions" if m.wpe is None else f"wpe {stored_as(m.wpe)}"
    return f"blocks {m.weight_format} (dot {dot}), {head} {m.head_format}, {positions}, KV cache {kv}"


def tblock_rows(ctx) -> list:
    rows = []
    kv, backend = ctx.args.kv, ctx.args.backend
    for fmt, dot in tblock_variants(ctx.args):
        t0 = time.perf_counter()
        # the fp32 row stays all float32: the reference the other rows' logits are set against
        m, how = load_tblock(ctx.ckpt, fmt, ctx.args.head_weights if fmt != "fp32" else None, dot)
        load_s = time.perf_counter() - t0
        buf = np.empty((1, m.vocab_size), np.float32)
        cache = m.make_cache(ctx.args.context + ctx.args.gen, format=kv)
        first = m.next_logits(ctx.prompt, cache, backend, out=buf)
        logits = buf[0].copy()
        start = int(first.argmax())
        toks = np.empty((1, ctx.args.gen + 1), np.int64)

        def decode():
            for c in cache:
                c.length = ctx.args.context
            toks[0, 0] = start
            t = time.perf_counter()
            done = 0
            while done < ctx.args.gen:
                step = m.prepared_step
                k = 0 if step is None else step.greedy(cache, toks, done + 1, ctx.args.gen - done)
                if k == 0:
                    m.next_logits(toks[0, done:done + 1], cache, backend, out=buf)
                    toks[0, done + 1], k = buf[0].argmax(), 1
                done += k
            return (time.perf_counter() - t) / ctx.args.gen

        long_cache = m.make_cache(len(ctx.long), format=kv)

        def prefill():
            for c in long_cache:
                c.reset()
            t = time.perf_counter()
            m.next_logits(ctx.long, long_cache, backend, out=buf)
            return time.perf_counter() - t

        weights = tblock_bytes(m)
        (d, p), read_bw = read_beside(weights, ctx.args.threads, lambda: timed(decode, prefill, ctx.args.reps))
        holds = tblock_holds(m, dot, kv)
        info = {"loaded_with": how, "holds": holds, "load_s": load_s, "first_token": start,
                "backend": backend or "default"}
        if fmt == "fp32":
            ctx.tblock_fp32_logits, ctx.first_token = logits, start
        elif ctx.tblock_fp32_logits is not None:
            info["prompt_logits_rel_err_vs_fp32"] = rel_err(logits, ctx.tblock_fp32_logits)
        label = fmt if dot == "fp32" else f"{fmt} dot {dot}"
        kv_bytes = int(m.bytes_per_token(ctx.mid_context, kv)) - weights
        rows.append(row("tblock", label, fmt, d, p, weights, "blocks as stored + head", info, kv_bytes, read_bw))
        if fmt == "fp32":
            ctx.fp32_row = rows[-1]
        print(f"tblock {fmt}: {holds}; loaded with {how}", flush=True)
        del m, cache, long_cache
        gc.collect()
    return rows


def transformers_rows(ctx) -> list:
    import torch
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(ctx.ckpt).float().eval()
    prompt = torch.from_numpy(ctx.prompt[None])
    long = torch.from_numpy(ctx.long[None])
    # transformers 5.x names the cache argument and output "cache", 4.x "past_key_values"
    cache_kw = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    with torch.inference_mode():
        out = hf(prompt, use_cache=True)
    kv = getattr(out, cache_kw)
    start = out.logits[:, -1].argmax(-1, keepdim=True)
    info = {"version": transformers.__version__, "torch": torch.__version__, "first_token": int(start),
            "class": type(hf).__name__, "attn_implementation": getattr(hf.config, "_attn_implementation", None)}
    if ctx.tblock_fp32_logits is not None:
        info["prompt_logits_rel_err_tblock_fp32"] = rel_err(ctx.tblock_fp32_logits, out.logits[0, -1].numpy())

    def decode():
        extra = kv.get_seq_length() - ctx.args.context
        if extra:
            kv.crop(-extra)         # back to the prompt: every run decodes from context 128
        tok = start
        with torch.inference_mode():
            t = time.perf_counter()
            for _ in range(ctx.args.gen):
                tok = hf(input_ids=tok, use_cache=True, **{cache_kw: kv}).logits[:, -1].argmax(-1, keepdim=True)
            return (time.perf_counter() - t) / ctx.args.gen

    params = inspect.signature(hf.forward).parameters
    keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {"num_logits_to_keep": 1}

    def prefill():
        with torch.inference_mode():
            t = time.perf_counter()
            hf(long, use_cache=True, **keep)
            return time.perf_counter() - t

    d, p = timed(decode, prefill, ctx.args.reps)
    # named_parameters lists a tied head once
    nbytes = sum(v.numel() * v.element_size() for k, v in hf.named_parameters() if "wpe" not in k)
    kv_bytes = ctx.args.model.kv_bytes(ctx.mid_context, 4)
    return [row("transformers", "fp32", "fp32", d, p, nbytes, "parameters but wpe", info, kv_bytes)]


MEASURE = {"tblock": tblock_rows, "transformers": transformers_rows, "llama.cpp": llama_cpp_rows,
           "ctranslate2": ctranslate2_rows, "openvino": openvino_rows}


def measure_round(ctx, engines: list) -> list:
    """Every engine's rows, in this order."""
    rows = []
    for engine in engines:
        t = time.perf_counter()
        try:
            rows += MEASURE[engine](ctx)
        except Unavailable as e:
            ctx.skip(engine, "every format", str(e))
        except Exception as e:          # another library's failure ends its rows, not the run
            if engine == "tblock":
                raise
            traceback.print_exc()
            ctx.skip(engine, "every format", f"{type(e).__name__}: {e}")
        log(f"{engine}: {time.perf_counter() - t:.0f} s")
    return rows


# ---------------------------------------------------------------------------------------
# the tables

def merge_rounds(rounds: list, ctx) -> list:
    """The rounds' rows as one row per engine and format (the first round's order): every
    round's samples, the median of the rounds' medians, and those medians (``rounds``) for
    ratios paired round by round; a row missing from some round keeps the rounds it has."""
    merged = {}
    for rows in rounds:
        for r in rows:
            key = (r["engine"], r["weights"])
            m = merged.setdefault(key, dict(r, decode_s=[], prefill_s=[],
                                            rounds={"decode": [], "prefill": [], "read": []}))
            for what in ("decode", "prefill"):
                m[f"{what}_s"] += r[f"{what}_s"]
                m["rounds"][what].append(r[f"{what}_median_s"])
            m["rounds"]["read"].append(r["read_bw"])
    for m in merged.values():
        for what in ("decode", "prefill"):
            m[f"{what}_median_s"] = float(np.median(m["rounds"][what]))
        reads = [bw for bw in m["rounds"]["read"] if bw]
        m["read_bw"] = float(np.median(reads)) if reads else None
    if ctx.fp32_row is not None:
        ctx.fp32_row = merged[("tblock", ctx.fp32_row["weights"])]
    return list(merged.values())


def paired(a: dict, b: dict, key: str) -> float:
    """a's time / b's: the median of the rounds' ratios where both have every round, else
    the ratio of their medians."""
    what = key.split("_")[0]
    ra, rb = a["rounds"][what], b["rounds"][what]
    if len(ra) == len(rb) > 1:
        return float(np.median([x / y for x, y in zip(ra, rb)]))
    return a[key] / b[key]


def floor_bytes(r: dict) -> int:
    """The bytes a row's floor counts: its weights and, where known, its KV cache's."""
    return r["bytes"] + (r["kv_bytes"] or 0)


def x_floor(r: dict, run_bw: float) -> float:
    """A merged row's decode time over its floor: round by round against the read beside it
    (read_beside), their median; the run's bandwidth run_bw where the row has none."""
    pairs = [t * bw / floor_bytes(r) for t, bw in zip(r["rounds"]["decode"], r["rounds"]["read"]) if bw]
    return float(np.median(pairs)) if pairs else r["decode_median_s"] * (r["read_bw"] or run_bw) / floor_bytes(r)


def print_tables(rows: list, floor_bw: float, args) -> None:
    ours = [r for r in rows if r["engine"] == "tblock"]
    rounds = f" (the median of {args.rounds} rounds' medians; ratios paired round by round)" if args.rounds > 1 else ""

    def ratios(r, key):
        # tblock's fastest row at the matching format (either dot), and its fp32 row
        same = min((t for t in ours if t["matches"] == r["matches"]), key=lambda t: t[key], default=None)
        fp32 = next((t for t in ours if t["weights"] == "fp32"), None)
        a = f"{paired(same, r, key):.2f} ({same['weights']})" if same else "-"
        b = f"{paired(fp32, r, key):.2f}" if fp32 else "-"
        return a, b

    print(f"\ndecode: ms per new token after a {args.context}-token prompt, {args.gen} greedy steps timed together, "
          f"median of {args.reps} runs{rounds}; floor = (weight + KV bytes at context "
          f"{args.context + (args.gen + 1) // 2}) / the read bandwidth beside the row's timed runs (best of 3 "
          f"passes over its weights' bytes before them and 3 after; the run's {floor_bw / 1e9:.1f} GB/s where none)")
    print(f"{'engine':<13} {'weights':<42} {'ms/token':>8} {'weight MB':>9} {'KV MB':>6} {'read GB/s':>9} "
          f"{'floor ms':>8} {'x floor':>7} {'tblock same / this':>24} {'tblock fp32 / this':>18}")
    for r in rows:
        ms, floor = r["decode_median_s"] * 1e3, floor_bytes(r) / (r["read_bw"] or floor_bw) * 1e3
        a, b = ratios(r, "decode_median_s")
        kv = "-" if r["kv_bytes"] is None else f"{r['kv_bytes'] / 1e6:.1f}"
        print(f"{r['engine']:<13} {r['weights']:<42} {ms:>8.2f} {r['bytes'] / 1e6:>9.1f} {kv:>6} "
              f"{(r['read_bw'] or floor_bw) / 1e9:>9.1f} {floor:>8.2f} {x_floor(r, floor_bw):>7.2f} {a:>24} {b:>18}")
    print(f"\nprefill: ms for {args.prefill} tokens into an empty cache, the last row's logits, "
          f"median of {args.reps} runs{rounds}")
    print(f"{'engine':<13} {'weights':<42} {'ms':>9} {'tokens/s':>9} {'tblock same / this':>24} "
          f"{'tblock fp32 / this':>18}")
    for r in rows:
        ms = r["prefill_median_s"] * 1e3
        a, b = ratios(r, "prefill_median_s")
        print(f"{r['engine']:<13} {r['weights']:<42} {ms:>9.1f} {args.prefill / r['prefill_median_s']:>9.0f} "
              f"{a:>24} {b:>18}")


def holds(r: dict) -> str:
    """What a row's model holds, in words."""
    i = r["info"]
    if r["engine"] == "tblock":
        err = i.get("prompt_logits_rel_err_vs_fp32")
        err = "" if err is None else f"; the prompt's logits against fp32's: max rel err {err:.1e}"
        return i["holds"] + f"; backend {i['backend']}; loaded with {i['loaded_with']}{err}"
    if r["engine"] == "llama.cpp":
        types = " + ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(i.get("types_bytes", {}).items(),
                                                                        key=lambda kv: -kv[1]))
        return (f"{types or i.get('unread')}; token_embd (also the tied head) {i.get('token_embd')}; KV cache "
                f"{i.get('type_k')}/{i.get('type_v')}, flash_attn {i.get('flash_attn')}, build {i.get('build_commit')}")
    if r["engine"] == "OpenVINO":
        return (f"inference precision {i.get('inference_precision')}; head sliced to the last row: "
                f"{i.get('head_sliced')} (prefill logits rows {i.get('prefill_logits_rows')}); {i.get('version')}")
    if r["engine"] == "CTranslate2":
        return f"compute type {r['weights']}; ctranslate2 {i.get('version')}"
    err = i.get("prompt_logits_rel_err_tblock_fp32")
    err = "" if err is None else f"; the prompt's logits against tblock fp32's: max rel err {err:.1e}"
    return (f"{i.get('class')} (attention {i.get('attn_implementation')}), transformers {i.get('version')}, "
            f"torch {i.get('torch')}{err}")


class Run:
    """What the measurements share: the options, the cache, the checkpoint, the prompts,
    and the list of what could not be measured."""

    def __init__(self, args, cache: Path, ckpt: Path):
        self.args, self.cache, self.ckpt = args, cache, ckpt
        V = args.model.vocab_size
        self.prompt = prompt_ids(args.context, V, args.seed)
        self.long = prompt_ids(args.prefill, V, args.seed + 1)
        # the cache's length at the timed decode steps' middle: the KV bytes the floor counts
        self.mid_context = args.context + (args.gen + 1) // 2
        self.tblock_fp32_logits = self.first_token = self.fp32_row = None      # tblock fp32's, when it ran first
        self.skipped = []

    def skip(self, engine: str, what: str, reason: str) -> None:
        self.skipped.append({"engine": engine, "weights": what, "reason": reason})
        print(f"not measured: {engine} {what}: {reason}", flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"a subset of {','.join(ENGINES)} (default all)")
    ap.add_argument("--formats", default=",".join(TBLOCK_FORMATS),
                    help="tblock formats, and the engines' formats matching them (default fp32,bf16,int8,int4)")
    ap.add_argument("--model", type=parse_model, default=MODELS["gpt2"], metavar="NAME",
                    help=f"the model's shape: {', '.join(MODELS)} (default gpt2: GPT-2 small), or "
                         f"n_layer:n_embd:n_head:vocab_size for a GPT-2 of another shape")
    ap.add_argument("--head-weights", choices=TBLOCK_FORMATS, default=None,
                    help="tblock's embedding/head format in the bf16, int8 and int4 rows (default: "
                         "from_pretrained's for each format; the fp32 row stays float32)")
    ap.add_argument("--dots", action="store_true",
                    help="time the stored formats once more with the dot that rounds their inputs (bf16 for "
                         "bf16, int8 for int8 and int4: llama.cpp's arithmetic)")
    ap.add_argument("--kv", choices=("fp32", "bf16", "int8"), default="fp32",
                    help="the KV cache format of tblock's rows (default fp32)")
    ap.add_argument("--backend", default=None,
                    help="tblock's backend (default: tblock's default, numba); numpy or c check the flow, "
                         "they are not fast")
    ap.add_argument("--context", type=positive_int, default=128, help="the prompt before the timed decode steps")
    ap.add_argument("--gen", type=positive_int, default=32, help="decode steps timed together (default 32)")
    ap.add_argument("--prefill", type=positive_int, default=512, help="prefill length (default 512)")
    ap.add_argument("--reps", type=positive_int, default=10, help="timed runs per engine and format (default 10)")
    ap.add_argument("--rounds", type=positive_int, default=1,
                    help="measure every engine this many times, the engines' order reversed each round; "
                         "a row's time is the median of its rounds' medians, a ratio the median of the "
                         "rounds' ratios (default 1)")
    ap.add_argument("--quick", action="store_true", help="2 runs of 8 decode steps: checks the flow, measures little")
    ap.add_argument("--prepare", action="store_true",
                    help=f"make the checkpoint and the converted files of {', '.join(PREPARED)} (those in "
                         f"--engines and --formats) into the cache, time nothing")
    ap.add_argument("--seed", type=int, default=0, help="torch's seed for the weights, numpy's for the prompts")
    add_engine_args(ap, "builds, downloads and converted models")
    add_threads(ap, 2)
    add_json(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.gen = min(args.reps, 2), min(args.gen, 8)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [e for e in args.engines if e not in ENGINES] + [f for f in args.formats if f not in TBLOCK_FORMATS]
    if bad:
        ap.error(f"--engines takes {','.join(ENGINES)} and --formats {','.join(TBLOCK_FORMATS)}, got {bad}")
    n_pos = args.model.n_positions
    if args.context + args.gen > n_pos or args.prefill > n_pos:
        ap.error(f"--context + --gen and --prefill must be at most n_positions={n_pos}")
    if args.model.vocab_size < 257:
        ap.error("the tokenizer the converters need has 256 byte symbols and an end of text: vocab_size >= 257")
    return args


def prepare(ctx) -> int:
    """--prepare: every converted file of the engines asked for, in the cache; nothing timed."""
    for engine in [e for e in ctx.args.engines if e in PREPARED]:
        t = time.perf_counter()
        try:
            MEASURE[engine](ctx)
        except Unavailable as e:
            ctx.skip(engine, "every format", str(e))
        log(f"{engine}: {time.perf_counter() - t:.0f} s")
    print(f"prepared {ctx.ckpt.parent}" + ("; not prepared:" if ctx.skipped else ""))
    for s in ctx.skipped:
        print(f"  {s['engine']} {s['weights']}: {s['reason']}")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    cache = args.cache.expanduser().resolve()
    cache.mkdir(parents=True, exist_ok=True)
    if args.prepare:
        return prepare(Run(args, cache, checkpoint(cache, args.model, args.seed, log)))
    peers.import_early(["torch"])           # torch before Numba's pool (tblock.peers says why)
    threads, _ = perf.pin_threads(args.threads, with_torch=True)
    from tblock.perf.peak import memory_bandwidth
    record = machine_record(threads)
    print(machine_line(record) + f"; {args.threads} threads for every engine")
    ckpt = checkpoint(cache, args.model, args.seed, log)
    ctx = Run(args, cache, ckpt)
    print(f"{args.model}, random weights (transformers' init, torch seed {args.seed}), batch 1; checkpoint {ckpt}")
    bw = memory_bandwidth(threads["numba"])
    print(f"memory: read {bw['read_GBs']:.1f} GB/s on {threads['numba']} threads (best of {bw['runs']})", flush=True)
    rounds = [measure_round(ctx, args.engines if i % 2 == 0 else args.engines[::-1]) for i in range(args.rounds)]
    rows = merge_rounds(rounds, ctx)
    bw_end = memory_bandwidth(threads["numba"])
    print(f"memory at the end: read {bw_end['read_GBs']:.1f} GB/s")
    print_tables(rows, bw["read_GBs"] * 1e9, args)
    print("\nwhat each holds (weight MB and KV MB: the bytes counted for the floor):")
    for r in rows:
        tok = r["info"].get("first_token")
        same = ("" if tok is None or ctx.first_token is None or r is ctx.fp32_row else
                f"; first greedy token after the prompt {'equals' if tok == ctx.first_token else 'differs from'} "
                f"tblock fp32's")
        kv = "" if r["kv_bytes"] is None else f" + KV cache {r['kv_bytes'] / 1e6:.1f} MB"
        print(f"  {r['engine']} {r['weights']}: {r['bytes'] / 1e6:.1f} MB ({r['bytes_counted']}){kv}; "
              f"{holds(r)}{same}")
    ctx.skipped = [dict(t) for t in dict.fromkeys(tuple(s.items()) for s in ctx.skipped)]     # once each
    if ctx.skipped:
        print("\nnot measured:")
        for s in ctx.skipped:
            print(f"  {s['engine']} {s['weights']}: {s['reason']}")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings["model"] = args.model.record()
    record.update(settings=settings, checkpoint=str(ckpt), bandwidth=bw, bandwidth_end=bw_end, rows=rows,
                  skipped=ctx.skipped)
    finish(record, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
