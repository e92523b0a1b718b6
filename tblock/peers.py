"""Peers: other CPU libraries running the same block, to compare tblock against.

    torch      nanoGPT's Block (bias=False), F.scaled_dot_product_attention, eager
    compile    the same module through torch.compile (inductor's CPU backend)
    ort        ONNX Runtime on a graph built with onnx.helper: com.microsoft Attention
               (fused QKV, causal), LayerNormalization, FastGelu, MatMul, Add
    openvino   the torch module through ov.convert_model, compiled for "CPU" in f32

Each builder takes tblock's weights and config and returns a callable that maps a numpy
(B, T, d_model) or (T, d_model) float32 array to a new numpy array of the same shape: the
same function as ``tblock.forward(H, weights, cfg)`` with the same weights.  Its ``isa`` is
(a tblock path name, the evidence): the widest vector instructions the peer's kernels run
here, so that a comparison with a forced narrower path can tell which peers kept to it.
Peers are float32 only (ONNX Runtime's Attention has no float64 kernel).

None of the libraries is a dependency (``pip install 'tblock-cpu[peers]'``): each is
imported inside the function that needs it, so ``import tblock`` never loads them.
"""

from __future__ import annotations

import collections
import functools
import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import warnings

import numpy as np

from .backends.torch import torch_module
from .config import BlockConfig
from .weights import BlockWeights

PEERS = ("torch", "compile", "ort", "openvino")
LABELS = {"torch": "torch", "compile": "torch.compile", "ort": "ONNX Runtime", "openvino": "OpenVINO"}
# the modules each peer imports; openvino converts the torch module, so it needs torch too
NEEDS = {"torch": ("torch",), "compile": ("torch",), "ort": ("onnx", "onnxruntime"),
         "openvino": ("openvino", "torch")}
DISTRIBUTIONS = ("torch", "onnx", "onnxruntime", "openvino")
# the distribution whose version names each peer
DISTRIBUTION = {"torch": "torch", "compile": "torch", "ort": "onnxruntime", "openvino": "openvino"}
# a float32 peer whose max |out - oracle| / max |oracle| exceeds this computes something else
TOLERANCE = 1e-3


# ---------------------------------------------------------------------------------------
# which peers can run here

@functools.cache
def _module_status(module: str) -> str:
    """'' when ``module`` imports, else why not (a broken install must not break a caller)."""
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed (pip install 'tblock-cpu[peers]')"
    try:
        importlib.import_module(module)
    except Exception as e:
        return f"{module} failed to import: {type(e).__name__}: {e}"
    return ""


def peer_status(name: str) -> tuple[bool, str]:
    """(can run here, why not) for one of PEERS."""
    if name not in PEERS:
        raise ValueError(f"peer must be one of {PEERS}, got {name!r}")
    for module in NEEDS[name]:
        why = _module_status(module)
        if why:
            return False, why
    if name == "compile" and not shutil.which(_cxx()):
        return False, f"torch.compile's inductor needs a C++ compiler ({_cxx()} is not on PATH)"
    return True, ""


def import_early(names) -> None:
    """Import torch now if a peer in ``names`` needs it: call this before Numba's thread pool
    starts (numba.set_num_threads, or tblock's first parallel call): imported after that pool
    and then given a thread count, torch runs its OpenMP regions many times slower.
    Import the other peers after the pool: OpenVINO
    loads TBB, which a Numba pool started after it takes for its threading layer."""
    if any("torch" in NEEDS[n] for n in names):
        _module_status("torch")


def _cxx() -> str:
    from torch._inductor import config
    return config.cpp.cxx[-1] or "g++"


def available_peers() -> list[str]:
    """The peers whose libraries import here, in PEERS order (imports them: seconds)."""
    return [p for p in PEERS if peer_status(p)[0]]


def peer_versions() -> dict[str, str | None]:
    """Installed version of each peer library (None when absent), without importing it."""
    out = {}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def max_rel_error(out, ref) -> float:
    """max |out - ref| / max |ref|: one number for how far a peer is from the oracle
    (infinite for a wrong shape)."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if out.shape != ref.shape:
        return float("inf")
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), np.finfo(np.float64).tiny))


def _float32(w: BlockWeights, cfg: BlockConfig) -> dict:
    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
    w.check(cfg)
    return w.float_arrays(np.float32)


def _batched(run):
    """run takes and returns (B, T, d); the callable also takes (T, d), as tblock.forward does."""
    def call(H):
        return run(H) if H.ndim == 3 else run(H[None])[0]
    return call


# ---------------------------------------------------------------------------------------
# which vector instructions a peer's kernels run, in the names of tblock's paths
#
# A forced narrower path (TBLOCK_ISA=avx2 on an AVX-512 machine) is only compared fairly
# with peers held to the same instructions; the variables that hold them
# (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS) do not reach every
# kernel: ONNX Runtime's MLAS, and OpenVINO's when it calls MLAS, choose by CPUID alone.

def host_isa() -> str:
    """The widest of tblock's paths this machine runs (what CPUID-dispatched kernels use)."""
    from .kernels import isa
    return isa.PATH.runnable[0]


def widest(*names: str) -> str:
    """The widest of the paths ``names`` (tblock.kernels.isa.NAMES, widest first)."""
    from .kernels.isa import NAMES
    return min(names, key=NAMES.index)


def isa_of_token(text: str, host: str) -> str | None:
    """The path a kernel name or a library's ISA setting stands for: "avx512" for AVX-512
    and AMX ("brgemm_avx512_core", "AVX512_CORE_AMX", "jit_avx512_f32"), "avx2" for AVX and
    AVX2 ("jit_avx2_f32", "AVX2", "AVX2_VNNI"), "generic" for SSE, the host's for MLAS
    (which dispatches on CPUID); None when the text names no ISA ("ALL", "gemm_ref_f32")."""
    t = text.lower()
    if "avx512" in t or "amx" in t or "avx10" in t:
        return "avx512"
    if "avx" in t:                          # avx, avx2, avx2_vnni, avx_vnni
        return "avx2"
    if "sse" in t:
        return "generic"
    if "mlas" in t:
        return host
    return None


def _env_cap(variable: str, host: str) -> str:
    """The cap a library's ISA variable sets (the host's when it is unset or names none)."""
    return isa_of_token(os.environ.get(variable, ""), host) or host


def _torch_isa() -> tuple[str, str]:
    """ATen's vector code follows ATEN_CPU_CAPABILITY (torch reports it), its GEMMs the
    BLAS's own caps: MKL_ENABLE_INSTRUCTIONS and oneDNN's ONEDNN_MAX_CPU_ISA."""
    import torch
    host = host_isa()
    aten = torch.backends.cpu.get_cpu_capability()
    blas = ("MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
    caps = [isa_of_token(aten, host) or "generic"] + [_env_cap(var, host) for var in blas]
    evidence = f"ATen {aten}; " + ", ".join(f"{var}={os.environ.get(var, 'unset')}" for var in blas)
    return widest(*caps), evidence


def _openvino_isa(compiled) -> tuple[str, str]:
    """The widest ISA among the kernels OpenVINO's CPU plugin chose (their primitive types,
    e.g. brgemm_avx2_f32, gemm_mlas_f32, jit_avx512_f32)."""
    host = host_isa()
    kinds = collections.Counter(op.get_rt_info()["primitiveType"].astype(str)
                                for op in compiled.get_runtime_model().get_ops())
    isas = {k: isa_of_token(k, host) for k in sorted(kinds)}
    named = [k for k, isa in isas.items() if isa]
    # none names an x86 ISA (an ARM build's primitives): all of them are the evidence
    evidence = ", ".join(f"{k} x{kinds[k]}" if kinds[k] > 1 else k for k in (named or isas))
    return (widest(*(isas[k] for k in named)) if named else "generic"), evidence


def _mark_isa(fn, isa: tuple[str, str]):
    """fn with .isa = (path name, evidence): what bench/compare_peers.py reports."""
    fn.isa = isa
    return fn


# ---------------------------------------------------------------------------------------
# torch: nanoGPT's model.py modules, the "torch" backend's (tblock.backends.torch)

def _torch_threads(threads):
    import torch
    if threads is not None:
        torch.set_num_threads(threads)       # process-wide: torch has one intra-op pool


def _torch_call(module):
    import torch

    @torch.inference_mode()
    def run(H):                              # (B, T, d) -> (B, T, d)
        return module(torch.from_numpy(H)).numpy()      # from_numpy shares memory: no copy in
    return _batched(run)


def torch_block(w: BlockWeights, cfg: BlockConfig, threads: int | None = None, shape=None):
    """PyTorch eager: nanoGPT's Block under inference_mode."""
    _torch_threads(threads)
    return _mark_isa(_torch_call(torch_module(w, cfg)), _torch_isa())


def torch_compiled(w: BlockWeights, cfg: BlockConfig, threads: int | None = None, shape=None,
                   reset: bool = True):
    """torch.compile of the same module (inductor, default mode); it compiles on the first
    call. With ``shape`` given the graph is specialised to it (dynamic=False), else torch's
    default: static first, dynamic T after a second shape.

    Every Block shares one forward, and dynamo compiles a function at most 8 times per
    process, then runs it eagerly without a word; ``reset`` forgets earlier compilations
    (of every function) first, so a benchmark that builds one block per size times
    compiled code at each."""
    import torch
    _torch_threads(threads)
    if reset:
        torch._dynamo.reset()
    fn = _torch_call(torch.compile(torch_module(w, cfg), dynamic=False if shape is not None else None))
    return _mark_isa(fn, _torch_isa())      # inductor's C++ vectorises to ATen's capability


# ---------------------------------------------------------------------------------------
# ONNX Runtime: the block as an ONNX graph

def onnx_model(w: BlockWeights, cfg: BlockConfig):
    """The block as an ONNX ModelProto (opset 20 + com.microsoft), input "x", output "y",
    both (B, T, d_model) float32 with symbolic B and T."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    a = _float32(w, cfg)
    d = cfg.d_model
    inits = {"w_qkv": np.concatenate([a["w_q"], a["w_k"], a["w_v"]], axis=1),   # (d, 3d): [W_q W_k W_v]
             # Attention's bias input (zeros without cfg.attn_bias)
             "b_qkv": (np.concatenate([a["b_q"], a["b_k"], a["b_v"]]) if cfg.attn_bias
                       else np.zeros(3 * d, np.float32)),
             "w_o": a["w_o"], "w_1": a["w_ff1"], "w_2": a["w_ff2"]}
    for n in ("ln1", "ln2"):
        inits[f"{n}_g"] = a.get(f"{n}_gamma", np.ones(d, np.float32))
        inits[f"{n}_b"] = a.get(f"{n}_beta", np.zeros(d, np.float32))
    nodes = []

    def node(op, ins, out, domain="", **attrs):
        nodes.append(helper.make_node(op, ins, [out], domain=domain, **attrs))
        return out

    def ln(x, n, out=None):
        return node("LayerNormalization", [x, f"{n}_g", f"{n}_b"], out or f"{n}_{x}", axis=-1, epsilon=cfg.eps)

    def mha(x):
        # fused QKV projection, per-head scores, causal mask (unidirectional) and AV
        att = node("Attention", [x, "w_qkv", "b_qkv"], f"att_{x}", domain="com.microsoft",
                   num_heads=cfg.n_heads, unidirectional=int(cfg.causal))
        out = node("MatMul", [att, "w_o"], f"mha_{x}")
        if cfg.attn_bias:
            inits["b_o"] = a["b_o"]
            out = node("Add", [out, "b_o"], f"mhab_{x}")
        return out

    def ffn(x):
        f = node("MatMul", [x, "w_1"], f"up_{x}")
        if cfg.ffn_bias:
            inits["b_1"], inits["b_2"] = a["b_ff1"], a["b_ff2"]
            f = node("Add", [f, "b_1"], f"upb_{x}")
        # FastGelu: com.microsoft's tanh GELU (opset 20's Gelu(approximate="tanh") is no faster)
        f = {"gelu_tanh": lambda: node("FastGelu", [f], f"act_{x}", domain="com.microsoft"),
             "gelu_erf": lambda: node("Gelu", [f], f"act_{x}"),
             "relu": lambda: node("Relu", [f], f"act_{x}")}[cfg.activation]()
        f = node("MatMul", [f, "w_2"], f"down_{x}")
        return node("Add", [f, "b_2"], f"downb_{x}") if cfg.ffn_bias else f

    if cfg.norm == "pre":
        mid = node("Add", ["x", mha(ln("x", "ln1"))], "mid")
        node("Add", [mid, ffn(ln(mid, "ln2"))], "y")
    else:
        mid = ln(node("Add", ["x", mha("x")], "res1"), "ln1")
        ln(node("Add", [mid, ffn(mid)], "res2"), "ln2", out="y")

    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "T", d]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "tblock", io[:1], io[1:],
                              [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.checker.check_model(model)
    return model


def onnxruntime_block(w: BlockWeights, cfg: BlockConfig, threads: int | None = None, shape=None):
    """ONNX Runtime's CPU provider on onnx_model(w, cfg), every graph optimisation on."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3               # its warnings are about unused initialisers
    if threads is not None:
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(onnx_model(w, cfg).SerializeToString(), so, providers=["CPUExecutionProvider"])

    def run(H):                              # (B, T, d) -> (B, T, d)
        return sess.run(None, {"x": H})[0]
    return _mark_isa(_batched(run), (host_isa(), "MLAS dispatches on CPUID (no variable caps it)"))


# ---------------------------------------------------------------------------------------
# OpenVINO: the torch module converted

def openvino_block(w: BlockWeights, cfg: BlockConfig, threads: int | None = None, shape=None,
                   precision: str = "f32"):
    """OpenVINO's CPU plugin on ov.convert_model(torch_module(w, cfg)), f32 (not the bf16 it
    picks by itself on AVX-512 BF16 machines) or ``precision`` "bf16", latency hint.
    ``shape`` fixes the input shape."""
    import openvino as ov
    import torch

    example = torch.zeros(tuple(shape) if shape is not None else (1, 8, cfg.d_model))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # convert_model traces with TorchScript, which torch deprecates
        model = ov.convert_model(torch_module(w, cfg), example_input=example)
    if shape is not None:
        model.reshape(list(shape))          # static: the plugin can plan every buffer once
    config = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY"}
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = threads
    compiled = ov.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()

    def run(H):                              # (B, T, d) -> (B, T, d), the output copied out
        return request.infer({0: H}, share_inputs=True)[0]
    return _mark_isa(_batched(run), _openvino_isa(compiled))


BUILDERS = {"torch": torch_block, "compile": torch_compiled, "ort": onnxruntime_block,
            "openvino": openvino_block}


# the peers that can compute in another precision than float32 (the keyword they take it by)
PRECISIONS = {"openvino": ("f32", "bf16")}


def build(name: str, w: BlockWeights, cfg: BlockConfig, threads: int | None = None, shape=None,
          precision: str = "f32"):
    """The peer ``name``'s callable; ``shape`` (B, T, d_model), when the caller knows it, lets
    the compiling peers specialise to it; ``precision`` "bf16" asks for bf16 arithmetic
    (OpenVINO's precision hint), where the peer has it."""
    ok, why = peer_status(name)
    if not ok:
        raise RuntimeError(f"peer {name!r} cannot run here: {why}")
    if precision == "f32":
        return BUILDERS[name](w, cfg, threads=threads, shape=shape)
    if precision not in PRECISIONS.get(name, ()):
        raise ValueError(f"peer {name!r} has no {precision} mode here (only {sorted(PRECISIONS)} do)")
    return BUILDERS[name](w, cfg, threads=threads, shape=shape, precision=precision)
