"""A model's weights in a stored format (tblock.formats): the checks and conversions every
model family's loader shares, whether its tensors come as floats (a safetensors checkpoint,
quantized here) or already stored (a GGUF file's blocks, kept byte for byte)."""

from __future__ import annotations

import numpy as np

from ..formats import QuantizedMatrix, check_dot, check_format, quantize_matrix
from ..weights import BlockWeights, quantize
from .causal_lm import check_dtype
from .checkpoint import Checkpoint


def head_format(weights: str, head_weights: str | None, dot: str, dtype) -> str:
    """head_weights resolved (None: the blocks', int8 under int4: a 4-bit head cost a trained
    model ten times what 4-bit blocks did, docs/formats.md), every format argument checked."""
    check_format(weights, "weights")
    head_weights = ("int8" if weights == "int4" else weights) if head_weights is None else head_weights
    check_format(head_weights, "head_weights")
    if dot != "fp32":
        check_dot(dot, weights)
        check_dot(dot, head_weights, f"dot (with head_weights={head_weights!r})")
    for name, fmt in (("weights", weights), ("head_weights", head_weights)):
        if fmt != "fp32" and np.dtype(dtype) != np.float32:
            raise ValueError(f"{name}={fmt!r} computes in float32: dtype must be float32, got {np.dtype(dtype)}")
    return head_weights


def stored_block(w: BlockWeights, fmt: str, dot: str, i: int, where) -> BlockWeights:
    """Block i's weights with its matrices in format ``fmt``: float ones quantized, stored
    ones kept as they are (they must be of that format already)."""
    if w.quantized:
        if (w.format, w.dot) != (fmt, dot):
            raise ValueError(f"{where}: block {i} is stored as {w.format} (dot {w.dot}), not {fmt} (dot {dot}): "
                             f"a stored file's blocks load in their own format")
        return w
    if fmt == "fp32":
        return w
    try:
        return quantize(w, fmt, dot)
    except ValueError as e:         # a d_in the 32-input blocks do not divide, a value too large
        raise ValueError(f"{where}: block {i} cannot be stored as {fmt}: {e}") from None


def stored_head(E, fmt: str, dot: str, name: str, where):
    """An embedding or head (vocab, d) in format ``fmt``: its transpose stored (a row a token),
    or the float array; a stored one must be of that format already."""
    if isinstance(E, QuantizedMatrix):
        if (E.format, E.dot) != (fmt, dot):
            raise ValueError(f"{where}: {name} is stored as {E.format} (dot {E.dot}), not {fmt} (dot {dot})")
        return E
    if fmt == "fp32":
        return E
    try:
        return quantize_matrix(E.T, fmt, name=name, dot=dot)
    except ValueError as e:
        raise ValueError(f"{where}: {name} cannot be stored as {fmt}: {e}") from None


def from_checkpoint(cls, config_cls, read, path, dtype, weights: str, head_weights: str | None, dot: str):
    """``cls.from_tensors`` of the checkpoint folder ``path``: its config.json through
    ``config_cls.from_hf``, its tensors through ``read(ckpt, cfg, dtype)``, every format
    argument checked before a tensor is read (a model family's from_pretrained)."""
    ckpt = Checkpoint(path)
    cfg = config_cls.from_hf(ckpt.config(), where=str(ckpt.root / "config.json"))
    dtype = check_dtype(dtype)
    head_format(weights, head_weights, dot, dtype)
    return cls.from_tensors(cfg, read(ckpt, cfg, dtype), dtype, weights=weights, head_weights=head_weights,
                            dot=dot, where=str(ckpt.root))
