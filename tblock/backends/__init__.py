"""The backends: one module each, all behind one entry point.

Every backend module has ``forward_batch(H, weights, cfg, trace) -> (H_out, trace | None)``
(the contract is in tblock.api), ``CHECKS_FINITE``, and ``components(cfg, weights, dtype)``,
its pieces for separate timing (tblock.backends.components). A module may also have
``ensure_available()``, which raises BackendUnavailable with the reason it cannot run,
and ``forward_small(H, weights, cfg) -> H_out | None``, a lane for a plain call (no
trace, no cache) on weights already checked against cfg, which takes H as the caller
gave it and returns None for anything it leaves to the checked path (tblock.api.forward).
Adding a backend is one module here plus one line below.
"""

# name -> module, imported on first use; the order is the order of available_backends()
BACKEND_MODULES = {
    "numpy": "tblock.backends.numpy",      # the oracle: the lesson's equations in float64
    "numba": "tblock.backends.numba",      # the fast path: tblock.kernels
    "c": "tblock.backends.c",              # the C99 reference through cffi
    "torch": "tblock.backends.torch",      # nanoGPT's block in PyTorch, when torch is installed
}
DEFAULT_BACKEND = "numba"

# outside references: reachable by name, but not one of tblock's own implementations,
# so available_backends() leaves them out
REFERENCES = ("torch",)
