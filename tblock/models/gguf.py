"""A GGUF model file as a Hugging Face checkpoint: its config.json dict and its tensors by
Hugging Face name, for the ``gpt2``, ``llama`` and ``qwen2`` architectures.

    hf, tensors = read_gguf_model("SmolLM2-135M-Q8_0.gguf")
    hf["model_type"], hf["num_key_value_heads"]          # 'llama', 3
    tensors["model.layers.0.self_attn.q_proj.weight"]    # QuantizedMatrix("int8", (576, 576))

The file is read by models.gguf_file (every size checked against the file).  The config
comes from the architecture's metadata ({arch}.block_count, .embedding_length, ...); the
vocabulary size from the token embedding's rows (the token list, when present, must agree,
as llama.cpp requires).  Every tensor the architecture needs must be present, no other one,
each of the shape the metadata implies: a mismatch is refused naming the tensor.

Tensor values, as the names' Hugging Face tensors are:

- a float tensor (F32, F16, a 1-D BF16) is a float32 array equal to the Hugging Face tensor:
  a Linear's weight (out, in), an embedding (vocab, d), GPT-2's Conv1D weight (in, out)
  (llama.cpp's converter transposed it to (out, in); it is transposed back, a view);
- a 2-D BF16, Q8_0 or Q4_0 tensor is a QuantizedMatrix W of shape (in, out), the matrix the
  layer multiplies by (X @ W): a Linear's weight^T, GPT-2's Conv1D weight itself, an
  embedding's transpose (a row a token, as tblock stores a head).  Its bytes are the file's,
  never dequantized; tblock's stored formats hold a matrix as GGUF does, a row per output.

llama.cpp's converter reorders the rows of a Llama's Q and K projections (LlamaModel.permute
in convert_hf_to_gguf.py) so that its rotary code, which turns adjacent pairs (x[2j],
x[2j+1]), turns the pairs Hugging Face's rotate-half turns (x[j], x[j + d_k/2]): within
each head, HF row j * d_k/2 + i becomes GGUF row 2i + j (i < d_k/2, j in 0, 1); K uses the
K/V head count.  Here that is undone (q_proj and k_proj weights and biases), a reordering of
whole rows, so a quantized matrix's rows are moved as they are.  Qwen2 is converted by the
converter's Qwen2Model, which does not permute (llama.cpp runs qwen2 with the rotate-half
"NEOX" rotary), so its tensors are taken as stored.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..formats import QuantizedMatrix
from .gguf_file import GGUFFile

ARCHS = ("gpt2", "llama", "qwen2")
HF_ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
DEFAULT_ROPE_THETA = 10000.0        # llama.cpp's default freq_base when the key is absent

# GGUF tensor name (after blk.{i}.) -> Hugging Face name (after model.layers.{i}.)
LLAMA_BLOCK = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}
LLAMA_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# GPT-2: HF names without "transformer." (models.gpt2's canonical names)
GPT2_BLOCK = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2",
              "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
GPT2_TOP = {"token_embd": "wte", "position_embd": "wpe", "output_norm": "ln_f", "output": "lm_head"}
GPT2_CONV1D = ("attn_qkv", "attn_output", "ffn_up", "ffn_down")     # stored (in, out) by Hugging Face


class _Meta:
    """The architecture's metadata, each value checked for its kind; errors name file and key."""

    def __init__(self, g: GGUFFile, arch: str):
        self.g, self.arch = g, arch

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.g.path}: {what}")

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.g.metadata

    def int(self, key: str, default=None) -> int:
        full = f"{self.arch}.{key}"
        v = self.g.metadata.get(full, default)
        if v is None:
            raise self.fail(f"metadata {full!r} is missing (a {self.arch} model needs it)")
        if type(v) is not int or v < 1:
            raise self.fail(f"metadata {full!r} must be a positive integer, got {v!r:.80}")
        return v

    def float(self, key: str, default=None) -> float:
        full = f"{self.arch}.{key}"
        v = self.g.metadata.get(full, default)
        if v is None:
            raise self.fail(f"metadata {full!r} is missing (a {self.arch} model needs it)")
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < v < math.inf:
            raise self.fail(f"metadata {full!r} must be a positive finite number, got {v!r:.80}")
        if self.g.value_types.get(full) == "f32":
            # the shortest decimal that is this float32: the converter's 1e-05 comes back as
            # config.json's 1e-05, not as 9.99999974e-06 (the same float32 either way)
            return float(np.format_float_positional(np.float32(v), unique=True, trim="-"))
        return float(v)


def read_gguf_model(path) -> tuple[dict, dict]:
    """(config.json dict, {Hugging Face name: float32 array or QuantizedMatrix}) of the
    gpt2, llama or qwen2 model in GGUF file ``path`` (module docstring).  Every error is a
    ValueError naming the file (and the tensor or key)."""
    g = GGUFFile(path)
    arch = g.metadata.get("general.architecture")
    if arch not in ARCHS:
        got = repr(arch)[:80] if isinstance(arch, str) else "missing" if arch is None else type(arch).__name__
        raise ValueError(f"{g.path}: general.architecture must be one of {ARCHS}, got {got}")
    meta = _Meta(g, arch)
    n_layer = meta.int("block_count")
    if n_layer > len(g.tensors):       # bounds the names listed below by what the file holds
        raise ValueError(f"{g.path}: {arch}.block_count is {n_layer}, but the file holds only "
                         f"{len(g.tensors)} tensors")
    vocab = _vocab_size(g, meta)
    if arch == "gpt2":
        hf, want, optional = _gpt2_config(meta, n_layer, vocab)
    else:
        hf, want, optional = _llama_config(meta, n_layer, vocab)
    _check_tensors(g, want, optional, hf)
    hf["tie_word_embeddings"] = "output.weight" not in g.tensors
    rename = _gpt2_name if arch == "gpt2" else _llama_name
    tensors = {}
    for name in g.tensors:
        value = g.read(name)
        if arch == "llama":
            value = _unpermute(name, value, hf)
        elif arch == "gpt2" and name.split(".")[-2] in GPT2_CONV1D and name.endswith(".weight"):
            value = value if isinstance(value, QuantizedMatrix) else value.T
        tensors[rename(name)] = value
    return hf, tensors


def _vocab_size(g: GGUFFile, meta: _Meta) -> int:
    """The token embedding's rows, checked against {arch}.vocab_size and the token list."""
    e = g.tensors.get("token_embd.weight")
    if e is None or len(e.shape) != 2:
        raise ValueError(f"{g.path}: the token embedding 'token_embd.weight' must be a 2-D tensor, "
                         f"got {'none' if e is None else f'shape {e.shape}'}")
    vocab = e.shape[0]
    if meta.has("vocab_size") and meta.int("vocab_size") != vocab:
        raise ValueError(f"{g.path}: metadata '{meta.arch}.vocab_size' is {meta.int('vocab_size')}, but "
                         f"'token_embd.weight' has {vocab} rows")
    tokens = g.metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and (not isinstance(tokens, list) or len(tokens) != vocab):
        got = f"{len(tokens)} tokens" if isinstance(tokens, list) else f"a {type(tokens).__name__}"
        raise ValueError(f"{g.path}: metadata 'tokenizer.ggml.tokens' must list one token per row of "
                         f"'token_embd.weight' ({vocab}), got {got}")
    return vocab


def _heads(meta: _Meta, d: int) -> tuple[int, int, int]:
    """(query heads, K/V heads, head width) from the metadata, checked against each other."""
    n_head = meta.int("attention.head_count")
    n_kv = meta.int("attention.head_count_kv", n_head)
    if n_head % n_kv:
        raise meta.fail(f"{meta.arch}.attention.head_count_kv ({n_kv}) must divide head_count ({n_head})")
    if d % n_head and not meta.has("attention.key_length"):
        raise meta.fail(f"{meta.arch}.embedding_length ({d}) must be divisible by attention.head_count ({n_head})")
    d_k = meta.int("attention.key_length", d // n_head or None)
    d_v = meta.int("attention.value_length", d_k)
    if d_v != d_k:
        raise meta.fail(f"{meta.arch}.attention.value_length ({d_v}) differs from key_length ({d_k}): "
                        f"a Hugging Face {meta.arch} model's heads have one width")
    return n_head, n_kv, d_k


def _llama_config(meta: _Meta, n_layer: int, vocab: int) -> tuple[dict, dict, dict]:
    """(config.json dict, {GGUF name: shape} required, {GGUF name: shape} optional)."""
    arch = meta.arch
    d, ff = meta.int("embedding_length"), meta.int("feed_forward_length")
    n_head, n_kv, d_k = _heads(meta, d)
    rope_dim = meta.int("rope.dimension_count", d_k)
    if rope_dim != d_k:
        raise meta.fail(f"{arch}.rope.dimension_count is {rope_dim}, but the heads are {d_k} wide: partial "
                        f"rotary embeddings are not a {arch} model's")
    if d_k % 2:
        raise meta.fail(f"the heads are {d_k} wide: rotary embeddings turn pairs, so the width must be even")
    hf = {"architectures": [HF_ARCHITECTURES[arch]], "model_type": arch, "vocab_size": vocab,
          "hidden_size": d, "intermediate_size": ff, "num_hidden_layers": n_layer, "num_attention_heads": n_head,
          "num_key_value_heads": n_kv, "head_dim": d_k, "hidden_act": "silu",
          "max_position_embeddings": meta.int("context_length"),
          "rms_norm_eps": meta.float("attention.layer_norm_rms_epsilon"),
          "rope_theta": meta.float("rope.freq_base", DEFAULT_ROPE_THETA), "rope_scaling": _rope_scaling(meta)}
    if meta.has("attention.sliding_window"):
        hf["sliding_window"] = meta.int("attention.sliding_window")
    q, kv = n_head * d_k, n_kv * d_k
    block = {"attn_norm.weight": (d,), "attn_q.weight": (q, d), "attn_k.weight": (kv, d),
             "attn_v.weight": (kv, d), "attn_output.weight": (d, q), "ffn_norm.weight": (d,),
             "ffn_gate.weight": (ff, d), "ffn_up.weight": (ff, d), "ffn_down.weight": (d, ff)}
    qkv_bias = {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
    extra = {"attn_output.bias": (d,)} if arch == "llama" else {}
    mlp_bias = {"ffn_gate.bias": (ff,), "ffn_up.bias": (ff,), "ffn_down.bias": (d,)}
    if arch == "qwen2":                 # Qwen2: Q/K/V biases always, none on O or the FFN
        block.update(qkv_bias)
    else:
        # Llama's attention_bias puts biases on Q, K, V and O, mlp_bias on the FFN: optional,
        # each group all or nothing (checked in _check_tensors)
        hf["attention_bias"] = hf["mlp_bias"] = False
        extra.update(qkv_bias | {"attn_output.bias": (d,)} | mlp_bias)
    if arch == "qwen2":
        hf["use_sliding_window"] = False
    required = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,)}
    optional = {"output.weight": (vocab, d)}
    for i in range(n_layer):
        required.update({f"blk.{i}.{k}": s for k, s in block.items()})
        optional.update({f"blk.{i}.{k}": s for k, s in extra.items()})
    return hf, required, optional


def _rope_scaling(meta: _Meta) -> dict | None:
    """Hugging Face's rope_scaling from {arch}.rope.scaling.* (or the older rope.scale_linear)."""
    kind = meta.g.metadata.get(f"{meta.arch}.rope.scaling.type")
    if kind is None:
        return {"rope_type": "linear", "factor": meta.float("rope.scale_linear")} if meta.has("rope.scale_linear") \
            else None
    if not isinstance(kind, str):
        raise meta.fail(f"metadata '{meta.arch}.rope.scaling.type' must be a string, got {type(kind).__name__}")
    if kind == "none":
        return None
    out = {"rope_type": kind}
    if meta.has("rope.scaling.factor"):
        out["factor"] = meta.float("rope.scaling.factor")
    if meta.has("rope.scaling.original_context_length"):
        out["original_max_position_embeddings"] = meta.int("rope.scaling.original_context_length")
    return out


def _gpt2_config(meta: _Meta, n_layer: int, vocab: int) -> tuple[dict, dict, dict]:
    d = meta.int("embedding_length")
    ff = meta.int("feed_forward_length", 4 * d)
    n_head, n_kv, d_k = _heads(meta, d)
    if n_kv != n_head or d_k * n_head != d:
        raise meta.fail(f"gpt2's heads must be {n_head} of width embedding_length / head_count "
                        f"(got {n_kv} K/V heads of width {d_k})")
    n_pos = meta.int("context_length")
    hf = {"architectures": [HF_ARCHITECTURES["gpt2"]], "model_type": "gpt2", "vocab_size": vocab,
          "n_positions": n_pos, "n_ctx": n_pos, "n_embd": d, "n_layer": n_layer, "n_head": n_head, "n_inner": ff,
          "activation_function": "gelu_new", "layer_norm_epsilon": meta.float("attention.layer_norm_epsilon")}
    block = {"attn_norm.weight": (d,), "attn_norm.bias": (d,), "attn_qkv.weight": (3 * d, d),
             "attn_qkv.bias": (3 * d,), "attn_output.weight": (d, d), "attn_output.bias": (d,),
             "ffn_norm.weight": (d,), "ffn_norm.bias": (d,), "ffn_up.weight": (ff, d), "ffn_up.bias": (ff,),
             "ffn_down.weight": (d, ff), "ffn_down.bias": (d,)}
    required = {"token_embd.weight": (vocab, d), "position_embd.weight": (n_pos, d),
                "output_norm.weight": (d,), "output_norm.bias": (d,)}
    for i in range(n_layer):
        required.update({f"blk.{i}.{k}": s for k, s in block.items()})
    return hf, required, {"output.weight": (vocab, d)}


def _check_tensors(g: GGUFFile, required: dict, optional: dict, hf: dict) -> None:
    """Every required tensor present, no unknown one, every shape the metadata's, and the
    optional bias groups all or nothing (hf's attention_bias / mlp_bias set from them)."""
    missing = [n for n in required if n not in g.tensors]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError(f"{g.path}: the file lacks tensor {', '.join(map(repr, missing[:5]))}{more} "
                         f"(a {hf['model_type']} model with {hf.get('num_hidden_layers', hf.get('n_layer'))} blocks)")
    extra = [n for n in g.tensors if n not in required and n not in optional]
    if extra:
        why = (": llama3-style rope frequency factors, which tblock does not compute"
               if "rope_freqs.weight" in extra else f" (a {hf['model_type']} model has no such tensor)")
        raise ValueError(f"{g.path}: unexpected tensor {', '.join(map(repr, extra[:5]))}{why}")
    for name, t in g.tensors.items():
        shape = required.get(name, optional.get(name))
        if t.shape != shape:
            raise ValueError(f"{g.path}: tensor {name!r} has shape {t.shape} (rows, values a row), but the "
                             f"metadata makes it {shape}")
    for key, suffixes in (("attention_bias", ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias")),
                          ("mlp_bias", ("ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"))):
        if key not in hf:
            continue
        names = [n for n in optional if n.endswith(suffixes)]
        present = [n for n in names if n in g.tensors]
        if present and len(present) != len(names):
            absent = next(n for n in names if n not in g.tensors)
            raise ValueError(f"{g.path}: tensor {present[0]!r} is present but {absent!r} is not: a "
                             f"{hf['model_type']} model has all of its {key} tensors or none")
        hf[key] = bool(present)


def _llama_name(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{LLAMA_BLOCK[parts[2]]}.{parts[3]}"
    return f"{LLAMA_TOP[parts[0]]}.{parts[1]}"


def _gpt2_name(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "blk":
        return f"h.{parts[1]}.{GPT2_BLOCK[parts[2]]}.{parts[3]}"
    return f"{GPT2_TOP[parts[0]]}.{parts[1]}"


def unpermute_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """The row order that undoes llama.cpp's converter's Q/K permutation: hf = gguf[order]
    for a (n_heads * d_k, ...) projection (module docstring)."""
    d_k = n_rows // n_heads
    # gguf row h*d_k + 2i + j holds HF row h*d_k + j*d_k/2 + i
    return np.arange(n_rows).reshape(n_heads, d_k // 2, 2).transpose(0, 2, 1).reshape(-1)


def _unpermute(name: str, value, hf: dict):
    """A llama tensor with the converter's Q/K row order undone (other tensors as they are)."""
    kind = name.split(".")[-2]
    if kind not in ("attn_q", "attn_k"):
        return value
    heads = hf["num_attention_heads"] if kind == "attn_q" else hf["num_key_value_heads"]
    if isinstance(value, QuantizedMatrix):      # rows of stored blocks, one per output
        order = unpermute_rows(value.shape[1], heads)
        return QuantizedMatrix(value.format, value.shape, value.data[order], value.dot)
    return value[unpermute_rows(value.shape[0], heads)]


def split_outputs(W, sizes):
    """W (d_in, d_out) cut into column blocks of the given widths (summing to d_out): an array
    (a view each) or a QuantizedMatrix (its rows, one per output): e.g. GPT-2's c_attn into
    w_q, w_k, w_v."""
    if sum(sizes) != W.shape[1]:
        raise ValueError(f"sizes {tuple(sizes)} must sum to the matrix's {W.shape[1]} outputs")
    edges = np.cumsum([0, *sizes])
    if isinstance(W, QuantizedMatrix):
        return [QuantizedMatrix(W.format, (W.shape[0], b - a), W.data[a:b], W.dot) for a, b in zip(edges, edges[1:])]
    return [W[:, a:b] for a, b in zip(edges, edges[1:])]
