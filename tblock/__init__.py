"""tblock: a fast, verified transformer block for the CPU (Lesson 13).

    import numpy as np, tblock
    cfg = tblock.BlockConfig(d_model=8, n_heads=2)
    w = tblock.init_weights(cfg, seed=0)
    H_out = tblock.forward(np.random.randn(4, 8).astype(np.float32), w, cfg)
"""

from .api import (BACKEND_MODULES, BackendUnavailable, Block, Stack, Trace, available_backends,
                  forward)
from .config import BlockConfig
from .counting import FlopCount, crossover_T, flops, param_breakdown, param_count
from .weights import BlockWeights, init_weights
from .worked_example import LESSON_PRINTED, load_worked_example

__version__ = "0.1.0"


def warmup() -> None:
    """Compile (or load from Numba's cache) every kernel of the default "numba" backend
    for float32 and float64, so that no later call pays for compilation.  Numba is only
    imported here (and on first use of the backend), so `import tblock` stays light."""
    from ._numba_backend import warmup as _warmup
    _warmup()

__all__ = [
    "BACKEND_MODULES", "BackendUnavailable", "Block", "BlockConfig", "BlockWeights", "FlopCount",
    "LESSON_PRINTED", "Stack", "Trace", "available_backends", "crossover_T", "flops", "forward",
    "init_weights", "load_worked_example", "param_breakdown", "param_count", "warmup",
]

# The lesson's lenses, its sidebars, the demo's model and the walk-through: loaded on first
# use (tblock.analysis, ...), so that `import tblock` stays as light as the block itself.
_LAZY_SUBMODULES = ("analysis", "demo", "dropout", "encdec", "lesson")
__all__ += list(_LAZY_SUBMODULES)


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
