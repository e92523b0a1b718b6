"""llama.cpp for bench_engines.py: built from the llama-cpp-python source package (its vendored
llama.cpp; cmake Release, CPU only, -march=native), its converter's F32 and BF16 GGUF files,
llama-quantize's Q8_0, Q4_0 and Q4_K_M, timed by llama-bench.  Everything lives in the run's
cache; a second run reuses it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from common import HERE, child_failure, positive_int
from engine_util import Unavailable, fresh, log, read_beside, row, run_logged

LLAMA_CPP_PYTHON = "0.3.36"     # the llama-cpp-python release whose llama.cpp this script was checked with
GGUF_TYPES = {"F32": "fp32", "BF16": "bf16", "Q8_0": "int8", "Q4_0": "int4", "Q4_K_M": "int4"}   # -> tblock's
# llama-bench's type_k / type_v -> bytes a stored value (a Q8_0 block: 34 bytes for 32, Q4_0: 18)
KV_VALUE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32}


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
    """A row per GGUF type of GGUF_TYPES whose tblock format is in --formats; with --prepare,
    the files made and nothing timed."""
    tree = llama_cpp_tree(ctx)
    tools = llama_cpp_build(ctx, tree)
    rows = []
    for kind, fmt in GGUF_TYPES.items():
        if fmt not in ctx.args.formats:
            continue
        try:
            path = gguf_file(ctx, tree, tools, kind)
            if ctx.args.prepare:
                log(f"llama.cpp {kind}: {path} ({path.stat().st_size / 1e6:.1f} MB)")
                continue
            nbytes, types = gguf_bytes(path)
            (d, info), read_bw = read_beside(nbytes, ctx.args.threads, lambda: llama_bench(
                ctx, tools["llama-bench"], path, ["-p", 0, "-n", ctx.args.gen, "-d", ctx.args.context]))
            p, info_p = llama_bench(ctx, tools["llama-bench"], path, ["-p", len(ctx.long), "-n", 0])
            info["command_prefill"] = info_p["command"]
        except Unavailable as e:
            ctx.skip("llama.cpp", kind, str(e))
            continue
        info.update(types, file=str(path))
        # its KV cache at the timed steps' middle context, in the types llama-bench reports
        kv = [KV_VALUE_BYTES.get(str(info.get(t)).lower()) for t in ("type_k", "type_v")]
        kv_bytes = None if None in kv else ctx.args.model.kv_bytes(ctx.mid_context, sum(kv) / 2)
        rows.append(row("llama.cpp", kind, fmt, [s / ctx.args.gen for s in d], p, nbytes,
                        "GGUF tensors but position_embd", info, kv_bytes, read_bw))
    return rows


def add_engine_args(ap, what: str) -> None:
    """The options of a bench that builds llama.cpp into the engines cache: --cache (``what``
    goes there), --llama-cpp-python, --build-jobs, --no-install."""
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TBLOCK_ENGINES_CACHE",
                                                                      Path.home() / ".cache" / "tblock-engines")),
                    help=f"where {what} go (default $TBLOCK_ENGINES_CACHE or ~/.cache/tblock-engines)")
    ap.add_argument("--llama-cpp-python", default=LLAMA_CPP_PYTHON, metavar="VERSION",
                    help=f"the llama-cpp-python source package whose llama.cpp is built (default {LLAMA_CPP_PYTHON})")
    ap.add_argument("--build-jobs", type=positive_int, default=os.cpu_count() or 2, help="cmake's -j (default: every core)")
    ap.add_argument("--no-install", action="store_true", help="build and download nothing: report what is missing")
