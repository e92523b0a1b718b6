"""Backend "numba": the fast path (tblock.kernels), one module a job.

    packing     the weights packed once per dtype, and a call's plan (scalars, FLOPs)
    parallel    parallel_call: tblock's thread count, one parallel region at a time
    forward     one block's forward pass (and the plain call's lane for small blocks)
    cached      blocks with KV caches, a stack in one call, a model's prepared decode step
    lm          a language model's vocabulary head
    trace       every intermediate materialised
    warmup      compile everything ahead of the first call
    components  the block's pieces one at a time, for the report

Validation happens in tblock.api; here the weights are prepared once (kept on the
BlockWeights) and a forward pass is a single call into compiled code.  All parallel work
runs in Numba's pool on tblock's thread count; no BLAS is called on that path, so BLAS
threads never compete with it.  The serial builds (small blocks, one thread, and a child
forked after an OpenMP region: tblock._runtime) take no lock and release the GIL; they
compute the same sums in the same order.
"""

from .cached import DecodeStep, forward_cached, forward_stack_cached
from .components import components
from .forward import forward_batch, prepare_call
from .lm import lm_head, prepare_head
from .warmup import warmup

# tblock.api leaves the check that H is finite to this backend: the compiled block does it
# in the same call (forward_batch)
CHECKS_FINITE = True


def prepare_decode(blocks, cfg, caches, E, P, ln_f, eps, head, rms=False):
    """A model's decode step for these caches (cached.DecodeStep; head: prepare_head(E); P
    None without learned positions; rms: LN_f is RMSNorm), or None where one compiled step
    cannot serve them (caches of several sizes)."""
    if len({c.max_T for c in caches}) != 1:
        return None
    return DecodeStep(blocks, cfg, caches, E, P, ln_f, eps, head, rms)


__all__ = ["CHECKS_FINITE", "DecodeStep", "components", "forward_batch", "forward_cached", "forward_stack_cached",
           "prepare_call", "lm_head", "prepare_decode", "prepare_head", "warmup"]
