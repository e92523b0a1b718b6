#!/usr/bin/env python3
"""Throughput of many prompts: tblock's continuous batcher (generate_many) against a loop of
single generate calls, transformers' padded batch generate and llama.cpp's batched bench.

    python bench/bench_batch.py                      # 64 prompts of 16..256 tokens, 64 new each, B 8,16,32,64
    python bench/bench_batch.py --weights int8       # tblock int8 against llama.cpp Q8_0
    python bench/bench_batch.py --quick              # a tiny GPT-2, 6 short prompts: checks the flow
    make bench-batch                                 # BATCH_ARGS adds options

The model: GPT-2 small's shape (12 layers, d 768, 12 heads, vocab 50257, n_positions 1024)
with transformers' random initialisation (torch seed --seed), the checkpoint bench_engines.py
makes and keeps in --cache (engine_models.checkpoint), --threads threads everywhere (2).
The workload: --prompts prompts (64) of lengths drawn uniformly in --lengths (16:256) and
random token ids (numpy seed --seed, never the end-of-text id), --new new tokens each (64),
greedy, no end-of-text token: every prompt makes exactly --new tokens.

Contenders (--peers picks), each in a child process of its own (child_batch.py), one
untimed warm-up, then --reps runs of the whole workload (wall) and of its prompts with one
new token each (prefill: every prompt through the model up to its first token):

  many          tblock: model.generate_many(prompts, new, temperature=0, max_batch=B) for each B
                of --batches, blocks in --weights (tblock.load(checkpoint, weights=...))
  loop          tblock: model.generate(p, new, temperature=0) for each prompt in turn
  transformers  GPT2LMHeadModel.generate on batches of B prompts in input order, left padded
                with attention_mask and pad_token_id, greedy, float32 whatever --weights says
  llama.cpp     llama-batched-bench (built beside bench_engines.py's llama-bench, from the
                same llama-cpp-python source package) on the checkpoint's GGUF at the matching
                type (fp32 F32, bf16 BF16, int8 Q8_0): -npp the workload's mean prompt length,
                -ntg --new, -npl each B, -t --threads.  It runs B prompts of EQUAL length once:
                the equal-length analogue of the workload, not the workload; its KV cache
                in llama.cpp's default type (recorded)

Reported per contender: wall seconds, generated tokens/s (prompts x new / wall), total
tokens/s ((prompt tokens + generated) / wall), prefill seconds (llama.cpp: its T_PP), the
floor and wall / floor, and whether its tokens equal the single loop's (greedy: tblock's
generate_many must give exactly generate's; transformers may differ where two logits nearly
tie).  The floor of a batch of B: the prompts in waves of B in input order; each wave's
prefill max(weights / read bandwidth, its FLOPs / FMA peak), then new - 1 decode steps, each
max((weights + the wave's KV caches) / read bandwidth, the wave's FLOPs / FMA peak); bytes
from model.bytes_per_token(context), the read bandwidth (tblock.perf.peak.memory_bandwidth)
and the float32 FMA peak (tblock.perf.peak.measured_fma_peak) measured in this run.  Ratios
of total tokens/s: generate_many(B) / loop, / transformers(B), / llama.cpp(B).  Nothing is
asserted: it is a measurement (the load average is printed at the start and the end).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from common import add_json, add_threads, child_failure, finish, int_list, last_json, machine_line, machine_record, \
    positive_int, run_child
from engine_llama_cpp import add_engine_args, gguf_file, llama_cpp_build, llama_cpp_tree
from engine_models import MODELS, checkpoint, parse_model
from engine_util import Unavailable, log, run_logged

from tblock import counting, perf

PEERS = ("many", "loop", "transformers", "llama.cpp")
GGUF_KIND = {"fp32": "F32", "bf16": "BF16", "int8": "Q8_0"}        # tblock's --weights -> the GGUF type
QUICK = dict(model="2:64:4:512", prompts=6, lengths=(4, 24), new=8, batches=[2, 4])


# ---------------------------------------------------------------------------------------
# the workload

def parse_lengths(text: str) -> tuple[int, int]:
    """"16:256" -> (16, 256)."""
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO:HI, got {text!r}") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI, got {text!r}")
    return lo, hi


def make_workload(args) -> list[np.ndarray]:
    """The prompts: lengths uniform in --lengths, ids uniform below the end-of-text id."""
    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(args.lengths[0], args.lengths[1] + 1, args.prompts)
    eot = args.model.vocab_size - 1
    return [rng.integers(0, eot, n).astype(np.int64) for n in lengths]


# ---------------------------------------------------------------------------------------
# the floor: what the bytes read and the FLOPs done allow

class Floor:
    """Seconds the workload needs at the measured read bandwidth and FMA peak, for a model
    whose decode step reads ``weight_bytes`` plus ``kv_per_token`` per cached token."""

    def __init__(self, model, weight_bytes: int, read_Bps: float, flops_per_s: float):
        self.W, self.read, self.peak = weight_bytes, read_Bps, flops_per_s
        self.kv = model.bytes_per_token(1) - model.bytes_per_token(0)          # bytes per cached token
        self.cfg, self.n_layer = model.stack.cfg, len(model.blocks)
        self.head = 2 * model.vocab_size * self.cfg.d_model                    # one row's logits
        one = counting.flops(self.cfg, 1).causal
        self.per_token = sum(v for k, v in one.items() if k not in ("scores", "softmax", "av"))
        self.per_key = 4 * self.cfg.d_model + counting.SOFTMAX_FLOPS_PER_SCORE * self.cfg.n_heads

    def prefill_flops(self, T: int) -> int:
        """A prompt of T tokens through every block, and the head on its last row."""
        return self.n_layer * sum(counting.flops(self.cfg, T).causal.values()) + self.head

    def step_flops(self, context: int) -> int:
        """One decode step of one sequence attending over ``context`` keys."""
        return self.n_layer * (self.per_token + self.per_key * context) + self.head

    def seconds(self, lengths, new: int, batch: int) -> dict:
        """{prefill, decode, total} for prompts of ``lengths`` in waves of ``batch``."""
        pre = dec = 0.0
        for w in range(0, len(lengths), batch):
            wave = np.asarray(lengths[w:w + batch])
            pre += max(self.W / self.read, sum(self.prefill_flops(int(T)) for T in wave) / self.peak)
            for t in range(1, new):
                ctx = wave + t
                dec += max((self.W + self.kv * int(ctx.sum())) / self.read,
                           sum(self.step_flops(int(c)) for c in ctx) / self.peak)
        return {"prefill": pre, "decode": dec, "total": pre + dec}


# ---------------------------------------------------------------------------------------
# the contenders

def tblock_weights(args) -> str:
    """tblock's weights as child_batch takes them: the format, then "/dot" unless fp32."""
    return args.weights if args.dot == "fp32" else f"{args.weights}/{args.dot}"


def child_row(args, job, batch, ckpt, workload, tmp) -> dict:
    """One contender in child_batch.py: its times and its tokens, or why not."""
    tokens = Path(tmp) / f"{job}-{batch}.npz"
    weights = "fp32" if job == "transformers" else tblock_weights(args)
    log(f"{job} B={batch}")
    p = run_child("child_batch", job, ckpt, workload, tokens, weights, args.threads, batch, args.reps)
    if p.returncode:
        return {"error": child_failure(p)}
    r = last_json(p)
    r["tokens"] = np.load(tokens)["tokens"]
    return r


def batched_bench_tool(ctx) -> tuple:
    """(llama-batched-bench, the llama.cpp tree, llama-bench's tools): the first built once in
    bench_engines.py's llama.cpp build folder."""
    tree = llama_cpp_tree(ctx)
    tools = llama_cpp_build(ctx, tree)          # configures the folder, llama-quantize for the GGUFs
    tool = tools["llama-bench"].parent / "llama-batched-bench"
    if not tool.is_file():
        if ctx.args.no_install:
            raise Unavailable(f"no {tool} (and --no-install)")
        log("building llama-batched-bench")
        run_logged(["cmake", "--build", tools["llama-bench"].parent.parent, "-j", ctx.args.build_jobs,
                    "--target", "llama-batched-bench"], ctx.cache / "logs" / "llama-batched-bench-build.log",
                   "cmake build of llama-batched-bench", timeout=3600)
    return tool, tree, tools


def llama_cpp_rows(args, cache: Path, ckpt: Path, npp: int) -> tuple[list, dict]:
    """llama-batched-bench at -npp npp -ntg --new -npl --batches: a row per B."""
    ctx = SimpleNamespace(cache=cache, ckpt=ckpt, args=SimpleNamespace(
        llama_cpp_python=args.llama_cpp_python, no_install=args.no_install, build_jobs=args.build_jobs))
    tool, tree, tools = batched_bench_tool(ctx)
    model = gguf_file(ctx, tree, tools, GGUF_KIND[args.weights])
    n_ctx = max(args.batches) * (npp + args.new)         # every sequence's prompt and new tokens at once
    # the smallest B once more first, untimed: its first configuration pays one-off allocations
    npl = [min(args.batches)] + args.batches
    cmd = [tool, "-m", model, "-c", n_ctx, "-npp", npp, "-ntg", args.new, "-npl", ",".join(map(str, npl)),
           "-t", args.threads, "-tb", args.threads, "--output-format", "jsonl"]
    cmd = [str(c) for c in cmd]
    rows = {}
    for _ in range(args.reps):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if p.returncode:
            raise Unavailable(f"llama-batched-bench failed: {child_failure(p)}")
        lines = [line for line in (p.stdout + "\n" + p.stderr).splitlines() if line.startswith('{"n_kv_max"')]
        for r in map(json.loads, lines[1:]):            # the first: the warm-up
            rows.setdefault(r["pl"], []).append(r)
    info = {"command": " ".join(cmd), "file": str(model), "kind": GGUF_KIND[args.weights],
            "kv_type": "llama.cpp's default (f16)", "missing_B": [B for B in args.batches if B not in rows]}
    out = []
    for B, runs in sorted(rows.items()):
        med = {k: float(np.median([r[k] for r in runs])) for k in ("t_pp", "t_tg", "t")}      # its rates, of medians
        out.append({"job": "llama.cpp", "batch": B, "wall_s": [r["t"] for r in runs],
                    "prefill_s": [r["t_pp"] for r in runs], "runs": runs, "pp_tps": B * npp / med["t_pp"],
                    "tg_tps": B * args.new / med["t_tg"], "total_tps_reported": B * (npp + args.new) / med["t"],
                    "n_prompts": B, "prompt_tokens": B * npp, "generated": B * args.new,
                    "flash_attn": runs[0]["flash_attn"]})
    return out, info


# ---------------------------------------------------------------------------------------
# the run

def summarise(r: dict, prompts, new: int, floor: dict | None) -> dict:
    """Median wall and prefill, the rates, the floor's ratio."""
    wall, pre = float(np.median(r["wall_s"])), float(np.median(r["prefill_s"]))
    n = r.get("n_prompts", len(prompts))
    gen = r.get("generated", n * new)
    tot = r.get("prompt_tokens", sum(len(p) for p in prompts)) + gen
    out = {"wall_median_s": wall, "prefill_median_s": pre, "generated_tps": gen / wall, "total_tps": tot / wall}
    if floor:
        out.update(floor_s=floor["total"], floor=floor, over_floor=wall / floor["total"])
    return out


def agreement(r: dict, ref) -> str:
    """How many prompts' new tokens equal the reference's."""
    if ref is None or "tokens" not in r:
        return "-"
    same = int(np.sum(np.all(r["tokens"] == ref, axis=1)))
    return f"{same}/{len(ref)}"


def print_table(rows: list) -> None:
    print("\n| contender | weights | B | wall s | prefill s | generated tok/s | total tok/s | floor s | x floor | "
          "tokens = loop's |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        fl = f"{r['floor_s']:.3g} | {r['over_floor']:.2f}" if "floor_s" in r else "- | -"
        print(f"| {r['label']} | {r['weights']} | {r['batch']} | {r['wall_median_s']:.2f} | "
              f"{r['prefill_median_s']:.2f} | {r['generated_tps']:.1f} | {r['total_tps']:.1f} | {fl} | "
              f"{r.get('agree', '-')} |")


def print_ratios(rows: list) -> list:
    """generate_many(B)'s total tokens/s over each other contender's at the same B (the loop: B 1)."""
    by = {(r["job"], r["batch"]): r for r in rows}
    loop = by.get(("loop", 1))
    out = []
    print("\n| B | many / loop | many / transformers | many / llama.cpp (equal-length analogue) |")
    print("|---:|---:|---:|---:|")
    for r in (r for r in rows if r["job"] == "many"):
        B = r["batch"]
        ratio = {name: r["total_tps"] / other["total_tps"] if other else None
                 for name, other in (("loop", loop), ("transformers", by.get(("transformers", B))),
                                     ("llama.cpp", by.get(("llama.cpp", B))))}
        out.append({"batch": B, **ratio})
        print(f"| {B} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in ratio.values()) + " |")
    print_best(rows)
    return out


def print_best(rows: list) -> None:
    """The issue's criterion: generate_many's best B against each contender's best."""
    best = {}
    for r in rows:
        if r["job"] not in best or r["total_tps"] > best[r["job"]]["total_tps"]:
            best[r["job"]] = r
    many = best.get("many")
    if many is None:
        return
    parts = [f"{many['total_tps'] / best[j]['total_tps']:.2f}x {what} (B {best[j]['batch']})"
             for j, what in (("loop", "the loop of generate (issue #34 asks >= 6)"),
                             ("transformers", "transformers' best"),
                             ("llama.cpp", "llama.cpp's best, equal-length analogue")) if j in best]
    print(f"\nbest generate_many: B {many['batch']}, {many['total_tps']:.1f} total tokens/s = " + "; ".join(parts))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--prompts", type=positive_int, default=64, help="how many prompts (default 64)")
    ap.add_argument("--lengths", type=parse_lengths, default=(16, 256), metavar="LO:HI",
                    help="prompt lengths, drawn uniformly in LO..HI (default 16:256)")
    ap.add_argument("--new", type=positive_int, default=64, help="new tokens per prompt (default 64)")
    ap.add_argument("--batches", type=int_list, default=[8, 16, 32, 64], metavar="B,B",
                    help="max_batch of generate_many, transformers' batch, llama.cpp's -npl (default 8,16,32,64)")
    ap.add_argument("--weights", choices=tuple(GGUF_KIND), default="fp32",
                    help="tblock's weights and llama.cpp's matching GGUF type (default fp32; transformers stays fp32)")
    ap.add_argument("--dot", choices=("fp32", "int8", "bf16"), default="fp32",
                    help="how tblock's stored weights multiply (tblock.load's dot): int8 with int8 weights is "
                         "llama.cpp's arithmetic, bf16 with bf16 (default fp32: the stored values exactly)")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"a subset of {','.join(PEERS)} (default all)")
    ap.add_argument("--reps", type=positive_int, default=1, help="runs of the workload per contender (default 1)")
    ap.add_argument("--model", type=parse_model, default=MODELS["gpt2"], metavar="L:D:H:V",
                    help="a GPT-2 of another shape, n_layer:n_embd:n_head:vocab_size (default GPT-2 small)")
    ap.add_argument("--seed", type=int, default=0, help="torch's seed for the weights, numpy's for the prompts")
    ap.add_argument("--quick", action="store_true",
                    help=f"a tiny GPT-2 ({QUICK['model']}), {QUICK['prompts']} prompts of {QUICK['lengths']} tokens, "
                         f"{QUICK['new']} new, B {QUICK['batches']}: checks the flow, measures nothing")
    add_engine_args(ap, "bench_engines' checkpoints, builds and GGUFs")
    add_threads(ap, 2)
    add_json(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.prompts, args.lengths = parse_model(QUICK["model"]), QUICK["prompts"], QUICK["lengths"]
        args.new, args.batches = QUICK["new"], QUICK["batches"]
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    bad = [p for p in args.peers if p not in PEERS]
    if bad:
        ap.error(f"--peers takes a subset of {','.join(PEERS)}, got {bad}")
    if min(args.batches) < 1:
        ap.error(f"--batches must be >= 1, got {args.batches}")
    if args.dot not in ("fp32", {"int8": "int8", "bf16": "bf16"}.get(args.weights)):
        ap.error(f"--dot {args.dot} multiplies {'int8' if args.dot == 'int8' else 'bf16'} weights, "
                 f"got --weights {args.weights}")
    if args.lengths[1] + args.new > args.model.n_positions:
        ap.error(f"the longest prompt + --new must fit n_positions={args.model.n_positions}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cache = args.cache.expanduser().resolve()
    threads, _ = perf.pin_threads(args.threads, with_torch=False)      # torch only in its child
    from tblock.perf.peak import measured_fma_peak, memory_bandwidth

    import tblock
    record = machine_record(threads)
    record["versions"]["transformers"] = installed("transformers")       # imported in its child only
    record["versions"]["torch"] = installed("torch")
    print(machine_line(record) + f"; {args.threads} threads for every contender; tblock.isa() {tblock.isa()}")
    ckpt = checkpoint(cache, args.model, args.seed, log)
    prompts = make_workload(args)
    lengths = [len(p) for p in prompts]
    npp = round(float(np.mean(lengths)))
    print(f"{args.model}, random weights (torch seed {args.seed}); checkpoint {ckpt}")
    print(f"workload: {args.prompts} prompts of {min(lengths)}..{max(lengths)} tokens (mean {np.mean(lengths):.1f}, "
          f"{sum(lengths)} in all), {args.new} new tokens each, greedy, no end of text; tblock weights {tblock_weights(args)}")

    model = tblock.load(ckpt, weights=args.weights)
    bw = memory_bandwidth(threads["numba"], nbytes=(64 if args.quick else 1024) << 20)
    peak = measured_fma_peak(threads["numba"], runs=3 if args.quick else 5, n=2_000_000 if args.quick else 20_000_000)
    print(f"read bandwidth {bw['read_GBs']:.1f} GB/s, float32 FMA peak {peak:.0f} GFLOP/s on {threads['numba']} threads; "
          f"a decode step reads {model.bytes_per_token(0) / 1e6:.1f} MB of weights", flush=True)
    floor = Floor(model, model.bytes_per_token(0), bw["read_GBs"] * 1e9, peak * 1e9)
    fp32_bytes = 4 * (model.param_count() - model.n_positions * model.stack.cfg.d_model - 2 * model.stack.cfg.d_model)
    floor_fp32 = Floor(model, fp32_bytes, bw["read_GBs"] * 1e9, peak * 1e9)      # transformers' float32
    del model

    rows, skipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        workload = Path(tmp) / "workload.npz"
        np.savez(workload, ids=np.concatenate(prompts), lengths=np.array(lengths), new=args.new)
        jobs = [("loop", 1)] if "loop" in args.peers else []
        jobs += [(j, B) for j in ("many", "transformers") if j in args.peers for B in args.batches]
        for job, B in jobs:
            r = child_row(args, job, B, ckpt, workload, tmp)
            if "error" in r:
                skipped.append({"contender": job, "batch": B, "reason": r["error"]})
                print(f"not measured: {job} B={B}: {r['error']}", flush=True)
                continue
            fl = (floor_fp32 if job == "transformers" else floor).seconds(lengths, args.new, B)
            rows.append({"job": job, "batch": B, **r, **summarise(r, prompts, args.new, fl)})
    if "llama.cpp" in args.peers:
        try:
            llama, info = llama_cpp_rows(args, cache, ckpt, npp)
            record["llama_cpp"] = info
            for r in llama:
                fl = floor.seconds([npp] * r["batch"], args.new, r["batch"])
                rows.append({**r, **summarise(r, prompts, args.new, fl)})
            for B in info["missing_B"]:
                skipped.append({"contender": "llama.cpp", "batch": B, "reason": "no row from llama-batched-bench"})
        except Unavailable as e:
            skipped.append({"contender": "llama.cpp", "batch": None, "reason": str(e)})
            print(f"not measured: llama.cpp: {e}", flush=True)

    ref = next((r["tokens"] for r in rows if r["job"] == "loop"), None)
    labels = {"many": "tblock generate_many", "loop": "tblock generate loop", "transformers": "transformers generate",
              "llama.cpp": f"llama.cpp batched-bench (npp {npp})"}
    for r in rows:
        r.update(label=labels[r["job"]], agree="(the reference)" if r["job"] == "loop" else agreement(r, ref),
                 weights="fp32" if r["job"] == "transformers" else
                 (GGUF_KIND[args.weights] if r["job"] == "llama.cpp" else tblock_weights(args)))
    print_table(rows)
    if any(r["job"] == "llama.cpp" for r in rows):
        print(f"\nllama.cpp rows are llama-batched-bench's EQUAL-length analogue: B prompts of {npp} tokens each "
              f"(the workload's mean), {args.new} new each, one batch of B (not the {args.prompts}-prompt workload); "
              f"its rates (t/s):")
        for r in (r for r in rows if r["job"] == "llama.cpp"):
            print(f"  B {r['batch']}: PP {r['pp_tps']:.1f}, TG {r['tg_tps']:.1f}, total {r['total_tps_reported']:.1f} "
                  f"(flash_attn {r['flash_attn']})")
    record["ratios_total_tps"] = print_ratios(rows)
    if skipped:
        print("\nnot measured:")
        for s in skipped:
            print(f"  {s['contender']} B={s['batch']}: {s['reason']}")
    for r in rows:
        r.pop("tokens", None)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings["model"] = args.model.record()
    record.update(settings=settings, checkpoint=str(ckpt), lengths=lengths, bandwidth=bw, fma_peak_gflops=peak,
                  lscpu=lscpu(), tblock_isa=tblock.isa(), rows=rows, skipped=skipped)
    finish(record, args.json)
    return 0


def installed(dist: str) -> str | None:
    """A distribution's installed version, without importing it."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def lscpu() -> str | None:
    """lscpu's output, where there is one."""
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None


if __name__ == "__main__":
    sys.exit(main())
