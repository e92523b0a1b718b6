"""The backends: one module each, all behind one entry point.

Every backend module has ``forward_batch(H, weights, cfg, trace) -> (H_out, trace | None)``
(the contract is in tblock.api), ``CHECKS_FINITE``, and ``components(cfg, weights, dtype)``,
its pieces for separate timing (tblock.backends.components). A module may also have
``ensure_available()``, which raises BackendUnavailable with the reason it cannot run,
and ``prepare_call(weights, cfg) -> call``: after a checked plain call (no trace, no
cache), tblock.api.forward keeps ``call`` on the weights, and a repeat call under the
same cfg object runs ``call(H) -> H_out | None`` on H as the caller gave it; None hands
anything it does not take to the checked path.
Adding a backend is one module here plus one line below.

A language model (tblock.models) reaches a backend's kernels only through the hooks below,
``lm_hook(module, name)``; a backend without one gets the reference version defined here:

    prepare_head(E, dtype) -> head          the tied embedding E (vocab, d) made ready for
                                            lm_head (reference: E itself)
    lm_head(H, ln_f, eps, head, out, scratch=False, rms=False) -> out
                                            out (B, T, vocab) = LN_f(H) @ E^T for H (B, T, d),
                                            ln_f = [gamma | beta]; rms: LN_f is RMSNorm (gamma
                                            only, beta zeros) (reference: float64 NumPy)
    prepare_decode(blocks, cfg, caches, E, P, ln_f, eps, head, rms=False) -> step | None
                                            after a checked one-token step with these caches:
                                            step(ids, caches, out=None) gives the next step's
                                            logits (B, vocab) in one call and advances the
                                            caches, or returns None, with nothing changed,
                                            for a call it cannot serve (reference: no step);
                                            P (learned positions) is None with rotary ones
"""

import numpy as np

from ..formats import QuantizedMatrix, flush_subnormals, round_inputs

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


def reference_prepare_head(E: np.ndarray, dtype) -> np.ndarray:
    return E        # the head casts it per call: a float64 copy of a real vocabulary is large


def reference_lm_head(H: np.ndarray, ln_f: np.ndarray, eps: float, head: np.ndarray, out: np.ndarray,
                      scratch: bool = False, rms: bool = False):
    """LN_f (LayerNorm, or RMSNorm with rms) and the head in float64, the result written into out."""
    d = H.shape[-1]
    X = H.astype(np.float64)
    if rms:
        Xn = X / np.sqrt((X ** 2).mean(axis=-1, keepdims=True) + eps) * ln_f[:d]
    else:
        mu = X.mean(axis=-1, keepdims=True)
        var = ((X - mu) ** 2).mean(axis=-1, keepdims=True)
        Xn = (X - mu) / np.sqrt(var + eps) * ln_f[:d] + ln_f[d:]
    # head: E (vocab, d), or E^T stored (a QuantizedMatrix, dequantized exactly, its dot's
    # rounding of the rows first)
    if isinstance(head, QuantizedMatrix):
        E = head.dequantize(np.float64)
        out[...] = round_inputs(Xn, head.dot) @ (flush_subnormals(E) if head.dot == "bf16" else E)
    else:
        out[...] = Xn @ head.T.astype(np.float64)
    return out


def reference_prepare_decode(blocks, cfg, caches, E, P, ln_f, eps, head, rms=False):
    return None     # every step takes the checked path


_REFERENCE_HOOKS = {"prepare_head": reference_prepare_head, "lm_head": reference_lm_head,
                    "prepare_decode": reference_prepare_decode}


def lm_hook(module, name: str):
    """The backend module's language-model hook ``name``, or the reference one."""
    hook = getattr(module, name, None)
    return _REFERENCE_HOOKS[name] if hook is None else hook
