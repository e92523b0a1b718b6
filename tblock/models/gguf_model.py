"""A model from a GGUF file: ``tblock.load("model.gguf")``.

The file's tensors come from models.gguf (tblock's own reader) under Hugging Face's names;
its stored matrices (BF16, Q8_0, Q4_0) become the blocks' and the head's formats (bf16,
int8, int4) byte for byte, never widened; float files (F32, F16) load as float32 and may be
quantized on loading like a safetensors checkpoint (``weights=``).
"""

from __future__ import annotations

import numpy as np

from ..formats import QuantizedMatrix
from .causal_lm import check_dtype
from .gguf import read_gguf_model
from .gpt2 import GPT2, GPT2Config
from .llama import BLOCK_NAMES, Llama, LlamaConfig

# the block matrices by Hugging Face name, after model.layers.{i}. / h.{i}.
LLAMA_MATRICES = tuple(hf + ".weight" for hf in BLOCK_NAMES.values())
GPT2_MATRICES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def stored_format(t: dict, names: list[str], path, what: str) -> str:
    """The one format the tensors ``names`` are stored in ("fp32" for float arrays); a file
    mixing formats is refused naming two tensors (a model's blocks share one format)."""
    kinds = {n: t[n].format if isinstance(t[n], QuantizedMatrix) else "fp32" for n in names}
    formats = sorted(set(kinds.values()))
    if len(formats) > 1:
        a, b = (next(n for n in names if kinds[n] == f) for f in formats[:2])
        raise ValueError(f"{path}: the {what} mix formats ({a!r} is {kinds[a]}, {b!r} is {kinds[b]}): tblock "
                         f"loads a model whose blocks share one format (llama-quantize --pure writes one)")
    return formats[0]


def from_gguf(path, dtype=np.float32, *, weights: str | None = None, head_weights: str | None = None,
              dot: str = "fp32"):
    """The GPT2 or Llama of GGUF file ``path``.  ``weights``/``head_weights``: None keeps the
    file's formats; a float file's may be given (quantized on loading), a stored one's must
    be the file's.  ``dot`` as from_pretrained's."""
    dtype = check_dtype(dtype)
    hf, t = read_gguf_model(path)
    gpt2 = hf["model_type"] == "gpt2"
    cfg = GPT2Config.from_hf(hf, where=str(path)) if gpt2 else LlamaConfig.from_hf(hf, where=str(path))
    n_layer = cfg.n_layer if gpt2 else cfg.num_hidden_layers
    prefix, names = ("h.", GPT2_MATRICES) if gpt2 else ("model.layers.", LLAMA_MATRICES)
    held = stored_format(t, [f"{prefix}{i}.{n}" for i in range(n_layer) for n in names], path, "blocks' matrices")
    head_name = "wte.weight" if gpt2 else "model.embed_tokens.weight"
    heads = [head_name] + ([] if gpt2 or cfg.tie_word_embeddings else ["lm_head.weight"])
    held_head = stored_format(t, heads, path, "embedding and head")
    weights = held if weights is None else weights
    head_weights = held_head if head_weights is None else head_weights
    if held != "fp32" and dtype != np.float32:
        raise ValueError(f"{path}: its blocks are stored as {held}, which computes in float32: dtype must be "
                         f"float32, got {dtype}")
    if gpt2:
        return GPT2.from_tensors(cfg, _cast(t, dtype), dtype, weights=weights, head_weights=head_weights,
                                 dot=dot, where=str(path))
    return Llama.from_tensors(cfg, _cast(t, dtype), dtype, weights=weights, head_weights=head_weights, dot=dot,
                              where=str(path))


def _cast(t: dict, dtype) -> dict:
    # the reader gives float32; a float64 model computes on the same values widened
    return {n: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype != dtype else v for n, v in t.items()}
