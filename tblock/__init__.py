"""tblock: a fast, verified transformer block for the CPU (Lesson 13).

    import numpy as np, tblock
    cfg = tblock.BlockConfig(d_model=8, n_heads=2)
    w = tblock.init_weights(cfg, seed=0)
    H_out = tblock.forward(np.random.randn(4, 8).astype(np.float32), w, cfg)
"""

from ._runtime import get_num_threads, set_num_threads, threads
from .api import (BACKEND_MODULES, BackendUnavailable, Block, Stack, Trace, available_backends,
                  forward)
from .config import BlockConfig
from .kvcache import KVCache
from .counting import FlopCount, crossover_T, flops, param_breakdown, param_count
from .formats import FORMATS, QuantizedMatrix
from .weights import BlockWeights, init_weights, quantize
from .worked_example import LESSON_PRINTED, load_worked_example

__version__ = "0.1.0"


# The default backend, and with it Numba, is imported with tblock: nearly every use loads
# it anyway (BlockWeights checks finiteness with a compiled kernel, even for the numpy
# oracle), so a process that has imported tblock holds the runtime its forward pass runs
# on, as one that has imported torch does.  Compiling happens on first use or in
# warmup(), never at import.
try:
    from .backends import numba as _default_backend
except Exception:                   # Numba missing or broken, or a bad TBLOCK_ISA: the numpy
    _default_backend = None         # and c backends still run; forward(backend="numba") says why


def isa() -> str:
    """The vector path the numba backend's kernels are compiled for in this process:
    "avx512", "avx2" or "generic" (the widest the CPU runs, or TBLOCK_ISA's choice).
    Details (vector bytes, micro-tile, CPU name): ``tblock.kernels.isa.PATH``."""
    from .kernels.isa import PATH
    return PATH.name


def warmup() -> None:
    """Compile (or load from Numba's cache) every kernel of the default "numba" backend
    for float32 and float64 on float weights, the lesson's and GPT-2's blocks and the
    Llama family's (rotary, RMSNorm, gated FFN, grouped K/V), so that no later call on
    them pays for compilation.  Stored weights (bf16, int8, int4) and KV caches (bf16,
    int8) compile their own kernels on their first call: each format is a build of its
    own, which a user of another never compiles."""
    from .warm import warm_all
    warm_all()

__all__ = [
    "BACKEND_MODULES", "BackendUnavailable", "Block", "BlockConfig", "BlockWeights", "FORMATS", "FlopCount", "KVCache",
    "LESSON_PRINTED", "Stack", "Trace", "available_backends", "crossover_T", "flops", "forward",
    "get_num_threads", "init_weights", "isa", "load_worked_example", "param_breakdown", "param_count",
    "QuantizedMatrix", "quantize", "set_num_threads", "threads", "warmup",
]

# The lesson's lenses, its sidebars, the demo's model and the walk-through (tblock.lesson):
# loaded on first use, so that `import tblock` stays as light as the block itself.
_LAZY_SUBMODULES = ("lesson",)
__all__ += list(_LAZY_SUBMODULES)
# the language models and their checkpoint loaders (tblock.models): loaded on first use too
_LAZY_NAMES = {"GPT2": "models.gpt2", "GPT2Config": "models.gpt2", "Llama": "models.llama",
               "LlamaConfig": "models.llama", "load": "models.auto"}
__all__ += list(_LAZY_NAMES)


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY_NAMES:
        import importlib
        value = globals()[name] = getattr(importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
