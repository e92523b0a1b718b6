#!/usr/bin/env python3
"""tblock at every weight format against the CPU engines people run: llama.cpp, CTranslate2,
OpenVINO and transformers, decoding and prefilling a GPT-2-small-shaped model.

    python bench/bench_engines.py                # everything (the first run builds llama.cpp: ~30 min on 2 cores)
    python bench/bench_engines.py --quick        # 2 runs of 8 steps: checks the whole flow
    python bench/bench_engines.py --engines tblock,llama.cpp --json engines.json
    make bench-engines                           # installs the extras first; ENGINES_ARGS adds options

The model: GPT-2 small's shape (12 layers, d 768, 12 heads, vocab 50257, n_positions 1024) with
transformers' random initialisation (torch seed --seed), saved with save_pretrained, batch 1,
--threads threads everywhere (default 2).  Every engine reads that checkpoint through its own
converter:

  tblock        GPT2.from_pretrained(path, weights=fp32|bf16|int8|int4): the tied embedding/head
                in from_pretrained's default format for it (or --head-weights); with --dots the
                stored formats once more with dot= bf16 / int8 (inputs rounded, llama.cpp's
                arithmetic); KV caches in --kv's format; each row says what the model holds
  transformers  GPT2LMHeadModel.from_pretrained, fp32, torch at --threads
  llama.cpp     built from the llama-cpp-python source package (pip download --no-binary,
                its vendored llama.cpp; cmake Release, CPU only, -march=native); its
                convert_hf_to_gguf.py writes F32 and BF16 GGUF files (bench/child_gguf_convert.py
                says what it works around), llama-quantize makes Q8_0, Q4_0 and Q4_K_M from F32;
                timed by llama-bench (-t --threads, -r runs)
  CTranslate2   ct2-transformers-converter to int8_float32 and float32 (pip install ctranslate2
                when missing); timed in a child process (bench/child_engine.py)
  OpenVINO      optimum-intel's export (stateful, KV cache in the request) at fp32, and with
                nncf's int8 and int4 (symmetric, groups of 32) weight compression, made in a
                venv of its own (optimum-intel pins a transformers older than the project's);
                run by the project's openvino in a child process with the precision hint
                f32, bf16, or the CPU plugin's default (recorded)

Measured, one run, medians:
  decode    ms per new token after a --context-token prompt (128): the prompt goes in untimed,
            then --gen greedy steps are timed together (tokens at positions 128 .. 128+gen-1),
            one sample per run.  llama.cpp: llama-bench -p 0 -n GEN -d CONTEXT (its -d fills the
            cache with CONTEXT tokens untimed; its steps feed random tokens, no sampling).
  prefill   ms for --prefill tokens (512) into an empty cache up to the last row's logits.
            tblock: next_logits (the head on the last row only); transformers: logits_to_keep=1;
            llama.cpp: llama-bench -p 512 -n 0 (logits of the last token); CTranslate2:
            generate_batch with max_length 1; OpenVINO: one request (the rows of logits its
            export computes are recorded).
  floor     a decode step's weight bytes / read bandwidth (tblock.perf.peak.memory_bandwidth,
            measured in this run, at the start and at the end).  Bytes: tblock's blocks as
            stored plus the tied embedding the head reads; a GGUF file's tensors but the
            position embedding; CTranslate2's model.bin and OpenVINO's .bin as files.
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
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

import numpy as np
from child_engine import prompt_ids
from common import HERE, SMALL, add_json, add_threads, child_failure, finish, last_json, machine_line, \
    machine_record, parse_model, positive_int, rel_err

from tblock import peers, perf

LLAMA_CPP_PYTHON = "0.3.36"     # the llama-cpp-python release whose llama.cpp this script was checked with
OPTIMUM_INTEL = "2.2.0"
ENGINES = ("tblock", "transformers", "llama.cpp", "ctranslate2", "openvino")
TBLOCK_FORMATS = ("fp32", "bf16", "int8", "int4")
GGUF_TYPES = {"F32": "fp32", "BF16": "bf16", "Q8_0": "int8", "Q4_0": "int4", "Q4_K_M": "int4"}   # -> tblock's
CT2_TYPES = {"int8_float32": "int8", "float32": "fp32"}
# (label, tblock format it is set against, export's --weight-format and options, precision hint)
OV_CONFIGS = [("fp32, f32 hint", "fp32", ("fp32",), "f32"),
              ("fp32, bf16 hint", "bf16", ("fp32",), "bf16"),
              ("int8 weights (nncf), default hint", "int8", ("int8",), "default"),
              ("int4 weights (nncf sym g32), default hint", "int4",
               ("int4", "--sym", "--group-size", "32", "--ratio", "1.0"), "default")]


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


# ---------------------------------------------------------------------------------------
# the checkpoint: transformers' random GPT-2 with a tokenizer the converters accept

def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer of vocab_size ids (GPT-2's pre-tokenizer and decoder; the
    real merges cannot be had offline): the 256 byte symbols, then made-up merges of two
    symbols, then <|endoftext|> as the last id, as in GPT-2.  Converters need one; the
    measurements feed token ids."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    symbols = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)
    vocab = {s: i for i, s in enumerate(symbols)}
    merges = []
    for a in symbols:
        for b in symbols:
            if len(vocab) == vocab_size - 1:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    vocab["<|endoftext|>"] = vocab_size - 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    eot = "<|endoftext|>"
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot,
                                         unk_token=eot).save_pretrained(folder)


def checkpoint(cache: Path, shape: dict, seed: int) -> Path:
    """The model's folder (config.json, model.safetensors, tokenizer), made once per shape and seed."""
    key = "gpt2-L{n_layer}-d{n_embd}-h{n_head}-v{vocab_size}".format(**shape) + f"-seed{seed}"
    folder = cache / "models" / key / "hf"
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    import transformers
    log(f"writing the random GPT-2 checkpoint {folder}")
    tmp = fresh(folder)
    torch.manual_seed(seed)
    eot = shape["vocab_size"] - 1
    cfg = transformers.GPT2Config(**shape, bos_token_id=eot, eos_token_id=eot)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp)
    config = json.loads((tmp / "config.json").read_text())
    config["n_ctx"] = shape["n_positions"]      # llama.cpp's GPT-2 converter reads n_ctx, which transformers 5 no longer writes
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(tmp, shape["vocab_size"])
    tmp.rename(folder)
    return folder


# ---------------------------------------------------------------------------------------
# tblock and transformers, in this process

def load_tblock(path: Path, fmt: str, head: str | None = None, dot: str = "fp32"):
    """tblock's GPT2 with its blocks in ``fmt`` (and its tied embedding in ``head``, where
    given; else GPT2's default for ``fmt``), products computed as ``dot`` says."""
    import tblock
    kw = {} if head is None else {"head_weights": head}
    if dot != "fp32":
        kw["dot"] = dot
    how = "GPT2.from_pretrained(path, weights=fmt" + "".join(f", {k}={v!r}" for k, v in kw.items()) + ")"
    return tblock.GPT2.from_pretrained(path, weights=fmt, **kw), how


ROUNDING_DOT = {"bf16": "bf16", "int8": "int8", "int4": "int8"}     # a stored format's faster dot


def tblock_variants(args) -> list:
    """(format, dot) of each tblock row: every format with dot fp32, and with --dots the
    stored ones again with the dot that rounds their inputs."""
    rows = [(f, "fp32") for f in args.formats]
    if args.dots:
        rows += [(f, ROUNDING_DOT[f]) for f in args.formats if f in ROUNDING_DOT]
    return rows


def tblock_bytes(m) -> int:
    """The weights one decode step reads: the blocks as stored and the tied embedding (the
    head); the issue's floor is these bytes over the read bandwidth."""
    return int(m.bytes_per_token(0))


def stored_as(a) -> str:
    """An array's dtype, or a stored matrix's format (tblock.formats)."""
    return getattr(a, "format", None) or str(a.dtype)


def tblock_rows(ctx) -> list:
    rows = []
    kv = ctx.args.kv
    for fmt, dot in tblock_variants(ctx.args):
        t0 = time.perf_counter()
        # the fp32 row stays all float32: the reference the other rows' logits are set against
        m, how = load_tblock(ctx.ckpt, fmt, ctx.args.head_weights if fmt != "fp32" else None, dot)
        load_s = time.perf_counter() - t0
        V = m.config.vocab_size
        buf = np.empty((1, V), np.float32)
        cache = m.make_cache(ctx.args.context + ctx.args.gen, format=kv)
        first = m.next_logits(ctx.prompt, cache, out=buf)
        logits = buf[0].copy()
        start = int(first.argmax())
        tok = np.empty(1, np.int64)

        def decode():
            for c in cache:
                c.length = ctx.args.context
            tok[0] = start
            t = time.perf_counter()
            for _ in range(ctx.args.gen):
                m.next_logits(tok, cache, out=buf)
                tok[0] = buf[0].argmax()
            return (time.perf_counter() - t) / ctx.args.gen

        long_cache = m.make_cache(len(ctx.long), format=kv)

        def prefill():
            for c in long_cache:
                c.reset()
            t = time.perf_counter()
            m.next_logits(ctx.long, long_cache, out=buf)
            return time.perf_counter() - t

        d, p = timed(decode, prefill, ctx.args.reps)
        holds = (f"blocks {m.blocks[0].format} (dot {dot}), tied embedding/head {stored_as(m.wte)}, "
                 f"wpe {stored_as(m.wpe)}, KV cache {kv}")
        info = {"loaded_with": how, "holds": holds, "load_s": load_s, "first_token": start}
        if fmt == "fp32":
            ctx.tblock_fp32_logits, ctx.first_token = logits, start
        elif ctx.tblock_fp32_logits is not None:
            info["prompt_logits_rel_err_vs_fp32"] = rel_err(logits, ctx.tblock_fp32_logits)
        label = fmt if dot == "fp32" else f"{fmt} dot {dot}"
        info["kv_cache_bytes"] = int(m.bytes_per_token(ctx.args.context, kv)) - tblock_bytes(m)
        rows.append(row("tblock", label, fmt, d, p, tblock_bytes(m), "blocks as stored + tied head", info))
        if fmt == "fp32":
            ctx.fp32_row = rows[-1]
        print(f"tblock {fmt}: {holds}; loaded with {how}", flush=True)
        del m, cache, long_cache
        gc.collect()
    return rows


def transformers_rows(ctx) -> list:
    import torch
    import transformers
    hf = transformers.GPT2LMHeadModel.from_pretrained(ctx.ckpt).eval()
    prompt = torch.from_numpy(ctx.prompt[None])
    long = torch.from_numpy(ctx.long[None])
    # transformers 5.x names the cache argument and output "cache", 4.x "past_key_values"
    cache_kw = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    with torch.inference_mode():
        out = hf(prompt, use_cache=True)
    kv = getattr(out, cache_kw)
    start = out.logits[:, -1].argmax(-1, keepdim=True)
    info = {"version": transformers.__version__, "torch": torch.__version__, "first_token": int(start)}
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
    nbytes = sum(v.numel() * v.element_size() for k, v in hf.state_dict().items()
                 if "wpe" not in k and "lm_head" not in k)      # the head is tied to wte: counted once
    return [row("transformers", "fp32", "fp32", d, p, nbytes, "parameters but wpe", info)]


def timed(decode, prefill, reps: int) -> tuple[list, list]:
    """One untimed call of each (compiles, first touches), then ``reps`` of each, interleaved."""
    decode(), prefill()
    d, p = [], []
    for _ in range(reps):
        d.append(decode())
        p.append(prefill())
    return d, p


def row(engine, weights, matches, decode_s, prefill_s, nbytes, bytes_what, info) -> dict:
    return {"engine": engine, "weights": weights, "matches": matches, "decode_s": list(decode_s),
            "prefill_s": list(prefill_s), "decode_median_s": float(np.median(decode_s)),
            "prefill_median_s": float(np.median(prefill_s)), "bytes": int(nbytes), "bytes_counted": bytes_what,
            "loadavg": os.getloadavg()[0], "info": info}


# ---------------------------------------------------------------------------------------
# llama.cpp: built from llama-cpp-python's source package, timed by llama-bench

def llama_cpp_tree(ctx) -> Path:
    ver = ctx.args.llama_cpp_python
    tree = ctx.cache / "src" / f"llama_cpp_python-{ver}" / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    dl = ctx.cache / "dl"
    sdist = dl / f"llama_cpp_python-{ver}.tar.gz"
    if not sdist.is_file():
        if ctx.args.no_install:
            raise Unavailable(f"no llama.cpp source in {ctx.cache} (and --no-install)")
        log(f"downloading the llama-cpp-python {ver} source package")
        run_logged([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                    f"llama-cpp-python=={ver}", "-d", dl], ctx.cache / "logs" / "pip-download-llama.log",
                   "pip download llama-cpp-python", timeout=1800)
    log(f"unpacking {sdist.name}")
    with tarfile.open(sdist) as tar:    # the "data" filter (no links out, no devices) where Python has it
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(ctx.cache / "src", **kw)
    if not (tree / "CMakeLists.txt").is_file():
        raise Unavailable(f"{sdist} holds no vendor/llama.cpp/CMakeLists.txt")
    return tree


def llama_cpp_build(ctx, tree: Path) -> dict:
    """llama-bench and llama-quantize, built once (CPU only, Release, -march=native)."""
    build = ctx.cache / "build" / f"llama.cpp-{ctx.args.llama_cpp_python}"
    tools = {n: build / "bin" / n for n in ("llama-bench", "llama-quantize")}
    if all(p.is_file() for p in tools.values()):
        return tools
    if ctx.args.no_install:
        raise Unavailable(f"no llama.cpp build in {build} (and --no-install)")
    if shutil.which("cmake") is None:
        raise Unavailable("cmake is not on PATH (Debian: apt-get install cmake)")
    jobs = ctx.args.build_jobs
    log(f"building llama.cpp into {build} with {jobs} jobs (tens of minutes on 2 cores)")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    off = ["LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES", "LLAMA_BUILD_SERVER", "LLAMA_BUILD_APP", "LLAMA_BUILD_UI",
           "LLAMA_USE_PREBUILT_UI", "LLAMA_OPENSSL", "LLAMA_CURL", "BUILD_SHARED_LIBS",
           "GGML_CUDA", "GGML_VULKAN", "GGML_METAL", "GGML_HIP", "GGML_SYCL", "GGML_OPENCL"]
    run_logged(["cmake", "-S", tree, "-B", build, *gen, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                *(f"-D{o}=OFF" for o in off)], ctx.cache / "logs" / "llama-cmake.log", "cmake configure of llama.cpp")
    run_logged(["cmake", "--build", build, "-j", jobs, "--target", *tools], ctx.cache / "logs" / "llama-build.log",
               "cmake build of llama.cpp", timeout=4 * 3600)
    missing = [str(p) for p in tools.values() if not p.is_file()]
    if missing:
        raise Unavailable(f"the llama.cpp build left no {', '.join(missing)}")
    return tools


def gguf_file(ctx, tree: Path, tools: dict, kind: str) -> Path:
    """The checkpoint as GGUF of ``kind``, converted once: F32 and BF16 by the converter,
    the quantized types by llama-quantize from F32."""
    folder = ctx.ckpt.parent / f"gguf-{ctx.args.llama_cpp_python}"
    path = folder / f"{kind}.gguf"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    tmp = fresh(path)
    logs = ctx.cache / "logs"
    if kind in ("F32", "BF16"):
        log(f"converting the checkpoint to {kind} GGUF")
        run_logged([sys.executable, HERE / "child_gguf_convert.py", tree, ctx.ckpt, "--outtype", kind.lower(),
                    "--outfile", tmp], logs / f"gguf-{kind}.log", f"convert_hf_to_gguf.py --outtype {kind.lower()}")
    else:
        src = gguf_file(ctx, tree, tools, "F32")
        log(f"llama-quantize {kind}")
        run_logged([tools["llama-quantize"], src, tmp, kind, ctx.args.build_jobs], logs / f"gguf-{kind}.log",
                   f"llama-quantize {kind}")
    tmp.rename(path)
    return path


def gguf_bytes(path: Path) -> tuple[int, dict]:
    """Bytes of the tensors a decode step reads (all but the position embedding) and the
    tensor types' byte counts; the file's size where gguf cannot read it."""
    try:
        from gguf import GGUFReader
        tensors = GGUFReader(path).tensors
    except Exception as e:                      # an older gguf than the file: say so, count the file
        return path.stat().st_size, {"unread": f"{type(e).__name__}: {e}"}
    kinds = {}
    total = 0
    for t in tensors:
        if t.name.startswith("position_embd"):
            continue
        kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + int(t.n_bytes)
        total += int(t.n_bytes)
    embd = [t.tensor_type.name for t in tensors if t.name.startswith("token_embd")]
    return total, {"types_bytes": kinds, "token_embd": embd[0] if embd else None}


def llama_bench(ctx, bench: Path, model: Path, extra: list) -> tuple[list, dict]:
    cmd = [bench, "-m", model, "-t", ctx.args.threads, "-r", ctx.args.reps, "-o", "json", *extra]
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=3600)
    if p.returncode:
        raise Unavailable(f"llama-bench {' '.join(map(str, extra))} failed: {child_failure(p)}")
    (test,) = json.loads(p.stdout)
    keep = ("build_commit", "build_number", "cpu_info", "backends", "n_threads", "type_k", "type_v",
            "flash_attn", "n_batch", "n_ubatch", "model_type", "model_size")
    info = {k: test.get(k) for k in keep}
    info["command"] = " ".join(str(c) for c in cmd)
    return [ns * 1e-9 for ns in test["samples_ns"]], info


def llama_cpp_rows(ctx) -> list:
    tree = llama_cpp_tree(ctx)
    tools = llama_cpp_build(ctx, tree)
    rows = []
    for kind, fmt in GGUF_TYPES.items():
        if fmt not in ctx.args.formats:
            continue
        try:
            path = gguf_file(ctx, tree, tools, kind)
            d, info = llama_bench(ctx, tools["llama-bench"], path,
                                  ["-p", 0, "-n", ctx.args.gen, "-d", ctx.args.context])
            p, info_p = llama_bench(ctx, tools["llama-bench"], path, ["-p", len(ctx.long), "-n", 0])
            info["command_prefill"] = info_p["command"]
        except Unavailable as e:
            ctx.skip("llama.cpp", kind, str(e))
            continue
        nbytes, types = gguf_bytes(path)
        info.update(types, file=str(path))
        rows.append(row("llama.cpp", kind, fmt, [s / ctx.args.gen for s in d], p, nbytes,
                        "GGUF tensors but position_embd", info))
    return rows


# ---------------------------------------------------------------------------------------
# CTranslate2 and OpenVINO: converted here, timed in child processes

def child_rows(ctx, engine: str, model: Path, config: str, label: str, fmt: str, nbytes: int, what: str) -> dict:
    a = ctx.args
    cmd = [sys.executable, HERE / "child_engine.py", engine, model, config, "--threads", a.threads, "--context",
           a.context, "--gen", a.gen, "--prefill", len(ctx.long), "--reps", a.reps, "--seed", a.seed]
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=3600)
    if p.returncode:
        raise Unavailable(f"{engine} {label}: {child_failure(p)}")
    r = last_json(p)
    d, pf = r.pop("decode_s"), r.pop("prefill_s")
    return row({"ctranslate2": "CTranslate2", "openvino": "OpenVINO"}[engine], label, fmt, d, pf, nbytes, what, r)


def ensure_ctranslate2(ctx) -> Path:
    """The converter's path; ctranslate2 pip-installed into this venv when missing."""
    conv = Path(sys.executable).parent / "ct2-transformers-converter"
    if conv.is_file():
        return conv
    if ctx.args.no_install:
        raise Unavailable("ctranslate2 is not installed (and --no-install)")
    log("pip install ctranslate2")
    run_logged([sys.executable, "-m", "pip", "install", "ctranslate2"], ctx.cache / "logs" / "pip-ctranslate2.log",
               "pip install ctranslate2", timeout=1800)
    if not conv.is_file():
        raise Unavailable(f"pip installed ctranslate2 but {conv} is not there")
    return conv


def ctranslate2_rows(ctx) -> list:
    conv = ensure_ctranslate2(ctx)
    rows = []
    for q, fmt in CT2_TYPES.items():
        if fmt not in ctx.args.formats:
            continue
        out = ctx.ckpt.parent / f"ct2-{q}"
        try:
            if not (out / "model.bin").is_file():
                log(f"ct2-transformers-converter --quantization {q}")
                tmp = fresh(out)
                run_logged([conv, "--model", ctx.ckpt, "--output_dir", tmp, "--quantization", q],
                           ctx.cache / "logs" / f"ct2-{q}.log", f"ct2-transformers-converter --quantization {q}")
                tmp.rename(out)
            rows.append(child_rows(ctx, "ctranslate2", out, q, q, fmt, (out / "model.bin").stat().st_size,
                                   "model.bin (file)"))
        except Unavailable as e:
            ctx.skip("CTranslate2", q, str(e))
    return rows


def ov_venv(ctx) -> Path:
    """optimum-cli in a venv of its own (optimum-intel pins transformers below the project's),
    made once: a venv without its marker file is an interrupted one, made again."""
    venv = ctx.cache / f"ov-venv-{OPTIMUM_INTEL}"
    cli, done = venv / "bin" / "optimum-cli", venv / "tblock-complete"
    if cli.is_file() and done.is_file():
        return cli
    if ctx.args.no_install:
        raise Unavailable(f"optimum-intel's venv {venv} is not there (and --no-install)")
    import openvino
    import torch
    ov_version = openvino.get_version().split("-")[0]
    log(f"making {venv} with optimum-intel {OPTIMUM_INTEL} (openvino {ov_version}, torch {torch.__version__})")
    if venv.exists():
        shutil.rmtree(venv)
    logs = ctx.cache / "logs"
    run_logged([sys.executable, "-m", "venv", venv], logs / "ov-venv.log", "python -m venv")
    pip = [venv / "bin" / "python", "-m", "pip"]
    # the torch release this venv has (pip prefers the local CPU build where one is offered),
    # and the openvino that runs the exported model here
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    run_logged([*pip, "install", f"optimum-intel[openvino]=={OPTIMUM_INTEL}", torch_pin, f"openvino=={ov_version}"],
               logs / "ov-venv-pip.log", "pip install optimum-intel into its venv", timeout=3600)
    # torchvision comes along, built for another torch than a CPU one: transformers then fails
    # to import (torchvision::nms missing); exporting a GPT-2 needs none of it
    run_logged([*pip, "uninstall", "-y", "torchvision"], logs / "ov-venv-pip-uninstall.log", "pip uninstall torchvision")
    done.write_text(f"optimum-intel {OPTIMUM_INTEL}, openvino {ov_version}, {torch_pin}\n")
    return cli


def openvino_rows(ctx) -> list:
    try:
        import openvino  # noqa: F401  the runtime that runs the model: the project's peers extra
    except ImportError as e:
        raise Unavailable(f"openvino is not importable ({e}): make bench-engines installs the peers extra") from None
    cli = ov_venv(ctx)
    rows = []
    for label, fmt, export, hint in OV_CONFIGS:
        if fmt not in ctx.args.formats:
            continue
        out = ctx.ckpt.parent / f"ov-{export[0]}"
        try:
            if not (out / "openvino_model.xml").is_file():
                log(f"optimum-cli export openvino --weight-format {' '.join(export)}")
                tmp = fresh(out)
                run_logged([cli, "export", "openvino", "--model", ctx.ckpt, "--task", "text-generation-with-past",
                            "--disable-convert-tokenizer", "--weight-format", *export, tmp],
                           ctx.cache / "logs" / f"ov-{export[0]}.log", f"optimum-cli export --weight-format {export[0]}")
                tmp.rename(out)
            what = "openvino_model.bin (file)" + ("; the bf16 hint makes bf16 copies of its fp32 weights when compiling"
                                                  if hint == "bf16" else "")
            rows.append(child_rows(ctx, "openvino", out, hint, label, fmt,
                                   (out / "openvino_model.bin").stat().st_size, what))
        except Unavailable as e:
            ctx.skip("OpenVINO", label, str(e))
    return rows


MEASURE = {"tblock": tblock_rows, "transformers": transformers_rows, "llama.cpp": llama_cpp_rows,
           "ctranslate2": ctranslate2_rows, "openvino": openvino_rows}


# ---------------------------------------------------------------------------------------
# the tables

def print_tables(rows: list, floor_bw: float, args) -> None:
    ours = [r for r in rows if r["engine"] == "tblock"]

    def ratios(r, key):
        # tblock's fastest row at the matching format (either dot), and its fp32 row
        same = min((t for t in ours if t["matches"] == r["matches"]), key=lambda t: t[key], default=None)
        fp32 = next((t for t in ours if t["weights"] == "fp32"), None)
        a = f"{same[key] / r[key]:.2f} ({same['weights']})" if same else "-"
        b = f"{fp32[key] / r[key]:.2f}" if fp32 else "-"
        return a, b

    print(f"\ndecode: ms per new token after a {args.context}-token prompt, {args.gen} greedy steps timed together, "
          f"median of {args.reps} runs; floor = weight bytes / {floor_bw / 1e9:.1f} GB/s read")
    print(f"{'engine':<13} {'weights':<42} {'ms/token':>8} {'weight MB':>9} {'floor ms':>8} {'x floor':>7} "
          f"{'tblock same / this':>24} {'tblock fp32 / this':>18}")
    for r in rows:
        ms, floor = r["decode_median_s"] * 1e3, r["bytes"] / floor_bw * 1e3
        a, b = ratios(r, "decode_median_s")
        print(f"{r['engine']:<13} {r['weights']:<42} {ms:>8.2f} {r['bytes'] / 1e6:>9.1f} {floor:>8.2f} "
              f"{ms / floor:>7.2f} {a:>24} {b:>18}")
    print(f"\nprefill: ms for {args.prefill} tokens into an empty cache, the last row's logits, "
          f"median of {args.reps} runs")
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
        return i["holds"] + f"; KV cache float32; loaded with {i['loaded_with']}{err}"
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
    return f"transformers {i.get('version')}, torch {i.get('torch')}{err}"


class Run:
    """What the measurements share: the options, the cache, the checkpoint, the prompts,
    and the list of what could not be measured."""

    def __init__(self, args, cache: Path, ckpt: Path):
        self.args, self.cache, self.ckpt = args, cache, ckpt
        V = args.model["vocab_size"]
        self.prompt = prompt_ids(args.context, V, args.seed)
        self.long = prompt_ids(args.prefill, V, args.seed + 1)
        self.tblock_fp32_logits = self.first_token = self.fp32_row = None      # tblock fp32's, when it ran first
        self.skipped = []

    def skip(self, engine: str, what: str, reason: str) -> None:
        self.skipped.append({"engine": engine, "weights": what, "reason": reason})
        print(f"not measured: {engine} {what}: {reason}", flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"a subset of {','.join(ENGINES)} (default all)")
    ap.add_argument("--formats", default=",".join(TBLOCK_FORMATS),
                    help="tblock formats, and the engines' formats matching them (default fp32,bf16,int8,int4)")
    ap.add_argument("--head-weights", choices=TBLOCK_FORMATS, default=None,
                    help="tblock's tied embedding/head format in the bf16, int8 and int4 rows (default: "
                         "GPT2.from_pretrained's for each format; the fp32 row stays float32)")
    ap.add_argument("--dots", action="store_true",
                    help="time the stored formats once more with the dot that rounds their inputs (bf16 for "
                         "bf16, int8 for int8 and int4: llama.cpp's arithmetic)")
    ap.add_argument("--kv", choices=("fp32", "bf16", "int8"), default="fp32",
                    help="the KV cache format of tblock's rows (default fp32)")
    ap.add_argument("--context", type=positive_int, default=128, help="the prompt before the timed decode steps")
    ap.add_argument("--gen", type=positive_int, default=32, help="decode steps timed together (default 32)")
    ap.add_argument("--prefill", type=positive_int, default=512, help="prefill length (default 512)")
    ap.add_argument("--reps", type=positive_int, default=10, help="timed runs per engine and format (default 10)")
    ap.add_argument("--quick", action="store_true", help="2 runs of 8 decode steps: checks the flow, measures little")
    ap.add_argument("--seed", type=int, default=0, help="torch's seed for the weights, numpy's for the prompts")
    ap.add_argument("--model", type=parse_model, default=SMALL, metavar="L:D:H:V",
                    help="another shape, n_layer:n_embd:n_head:vocab_size (default GPT-2 small: 12:768:12:50257)")
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TBLOCK_ENGINES_CACHE",
                                                                      Path.home() / ".cache" / "tblock-engines")),
                    help="where builds, downloads and converted models go (default $TBLOCK_ENGINES_CACHE or "
                         "~/.cache/tblock-engines)")
    ap.add_argument("--llama-cpp-python", default=LLAMA_CPP_PYTHON, metavar="VERSION",
                    help=f"the llama-cpp-python source package whose llama.cpp is built (default {LLAMA_CPP_PYTHON})")
    ap.add_argument("--build-jobs", type=positive_int, default=os.cpu_count() or 2, help="cmake's -j (default: every core)")
    ap.add_argument("--no-install", action="store_true", help="pip-install and build nothing: report what is missing")
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
    n_pos = args.model["n_positions"]
    if args.context + args.gen > n_pos or args.prefill > n_pos:
        ap.error(f"--context + --gen and --prefill must be at most n_positions={n_pos}")
    if args.model["vocab_size"] < 257:
        ap.error("the tokenizer the converters need has 256 byte symbols and an end of text: vocab_size >= 257")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    peers.import_early(["torch"])           # torch before Numba's pool (tblock.peers says why)
    threads, _ = perf.pin_threads(args.threads, with_torch=True)
    from tblock.perf.peak import memory_bandwidth
    record = machine_record(threads)
    print(machine_line(record) + f"; {args.threads} threads for every engine")
    cache = args.cache.expanduser().resolve()
    cache.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint(cache, args.model, args.seed)
    ctx = Run(args, cache, ckpt)
    shape = "GPT-2 small shape" if args.model == SMALL else f"shape {args.model}"
    print(f"{shape}, random weights (transformers' init, torch seed {args.seed}), batch 1; checkpoint {ckpt}")
    bw = memory_bandwidth(threads["numba"])
    print(f"memory: read {bw['read_GBs']:.1f} GB/s on {threads['numba']} threads (best of {bw['runs']})", flush=True)
    rows = []
    for engine in args.engines:
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
    bw_end = memory_bandwidth(threads["numba"])
    print(f"memory at the end: read {bw_end['read_GBs']:.1f} GB/s")
    print_tables(rows, bw["read_GBs"] * 1e9, args)
    print("\nwhat each holds (weight MB: the bytes counted for the floor):")
    for r in rows:
        tok = r["info"].get("first_token")
        same = ("" if tok is None or ctx.first_token is None or r is ctx.fp32_row else
                f"; first greedy token after the prompt {'equals' if tok == ctx.first_token else 'differs from'} "
                f"tblock fp32's")
        print(f"  {r['engine']} {r['weights']}: {r['bytes'] / 1e6:.1f} MB ({r['bytes_counted']}); {holds(r)}{same}")
    if ctx.skipped:
        print("\nnot measured:")
        for s in ctx.skipped:
            print(f"  {s['engine']} {s['weights']}: {s['reason']}")
    record.update(settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  checkpoint=str(ckpt), bandwidth=bw, bandwidth_end=bw_end, rows=rows, skipped=ctx.skipped)
    finish(record, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
