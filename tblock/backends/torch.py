"""Backend "torch": nanoGPT's Block (model.py; biases as the config says) in PyTorch eager, as a reference.

It is an outside reference, not one of tblock's implementations: ``forward(..., backend="torch")``
runs it when torch is installed (BackendUnavailable otherwise), the report times its
components, and tblock.peers builds its eager and compiled peers from ``torch_module``.
torch is imported on first use only, so ``import tblock`` never loads it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

import numpy as np

from ..api import BackendUnavailable
from ..config import BlockConfig
from ..weights import BlockWeights

# tblock.api checks H for NaN/Inf before calling forward_batch
CHECKS_FINITE = False


def status() -> str:
    """'' when torch imports here, else why not (a broken install must not break a caller)."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (it is an optional peer: pip install torch)"
    try:
        importlib.import_module("torch")
    except Exception as e:
        return f"torch failed to import: {e}"
    return ""


def ensure_available() -> None:
    why = status()
    if why:
        raise BackendUnavailable(f"backend 'torch' cannot run: {why}")


@functools.cache
def _torch_classes():
    """nanoGPT's Block and its parts, defined on first use (torch is imported only then)."""
    import torch.nn as nn
    import torch.nn.functional as F

    class LayerNorm(nn.Module):
        """nanoGPT's LayerNorm; weight and bias None without affine (the lesson's default)."""

        def __init__(self, d, eps):
            super().__init__()
            self.d, self.eps = d, eps
            self.weight = self.bias = None

        def forward(self, x):
            return F.layer_norm(x, (self.d,), self.weight, self.bias, self.eps)

    class CausalSelfAttention(nn.Module):

        def __init__(self, cfg):
            super().__init__()
            self.d, self.n_head, self.causal = cfg.d_model, cfg.n_heads, cfg.causal
            # key, query, value projections for all heads, in one batch
            self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.attn_bias)
            self.c_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.attn_bias)

        def heads(self, x):
            B, T, C = x.size()                       # (B, T, C) -> (B, nh, T, hs)
            return x.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

        def core(self, q, k, v):
            # the flash kernel skips masked tiles when causal
            B, T, C = q.size()
            y = F.scaled_dot_product_attention(self.heads(q), self.heads(k), self.heads(v),
                                               attn_mask=None, dropout_p=0.0, is_causal=self.causal)
            return y.transpose(1, 2).contiguous().view(B, T, C)     # re-assemble all head outputs

        def forward(self, x):
            q, k, v = self.c_attn(x).split(self.d, dim=2)
            return self.c_proj(self.core(q, k, v))

    class MLP(nn.Module):

        def __init__(self, cfg):
            super().__init__()
            self.c_fc = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.ffn_bias)
            self.act = {"gelu_tanh": nn.GELU(approximate="tanh"), "gelu_erf": nn.GELU(),
                        "relu": nn.ReLU()}[cfg.activation]
            self.c_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.ffn_bias)

        def forward(self, x):
            return self.c_proj(self.act(self.c_fc(x)))

    class Block(nn.Module):

        def __init__(self, cfg):
            super().__init__()
            self.pre = cfg.norm == "pre"
            self.ln_1, self.attn = LayerNorm(cfg.d_model, cfg.eps), CausalSelfAttention(cfg)
            self.ln_2, self.mlp = LayerNorm(cfg.d_model, cfg.eps), MLP(cfg)

        def forward(self, x):
            if self.pre:
                x = x + self.attn(self.ln_1(x))
                return x + self.mlp(self.ln_2(x))
            x = self.ln_1(x + self.attn(x))
            return self.ln_2(x + self.mlp(x))

    return Block


def torch_module(w: BlockWeights, cfg: BlockConfig, dtype=np.float32):
    """nanoGPT's Block for ``cfg`` holding ``w`` (in ``dtype``), in eval mode.
    ``block.attn.core``, ``block.mlp``, ``block.ln_1`` are its parts (timed by ``components``)."""
    import torch
    import torch.nn as nn

    if not isinstance(cfg, BlockConfig):
        raise TypeError(f"cfg must be a BlockConfig, got {type(cfg).__name__}")
    if not cfg.lesson_block:
        raise ValueError("the torch backend is nanoGPT's Block, the lesson's block only: it computes no "
                         "RMSNorm, gated FFN, rotary positions, grouped K/V heads or attn_bias='qkv'")
    w.check(cfg)
    dtype = np.dtype(dtype)
    a = w.float_arrays()

    def t(x):
        # a private C-ordered copy: torch tensors must not share BlockWeights' read-only arrays
        return torch.from_numpy(np.array(x, dtype=dtype, order="C", copy=True))

    block = _torch_classes()(cfg).to(getattr(torch, dtype.name))       # float32 or float64
    for ln, n in ((block.ln_1, "ln1"), (block.ln_2, "ln2")):
        if f"{n}_gamma" in a:
            ln.weight, ln.bias = nn.Parameter(t(a[f"{n}_gamma"])), nn.Parameter(t(a[f"{n}_beta"]))
    with torch.no_grad():
        # nn.Linear computes x @ W.T: it stores our row-convention (in, out) matrices transposed
        block.attn.c_attn.weight.copy_(t(np.concatenate([a["w_q"], a["w_k"], a["w_v"]], axis=1).T))
        block.attn.c_proj.weight.copy_(t(a["w_o"].T))
        block.mlp.c_fc.weight.copy_(t(a["w_ff1"].T))
        block.mlp.c_proj.weight.copy_(t(a["w_ff2"].T))
        if cfg.attn_bias:
            block.attn.c_attn.bias.copy_(t(np.concatenate([a["b_q"], a["b_k"], a["b_v"]])))
            block.attn.c_proj.bias.copy_(t(a["b_o"]))
        if cfg.ffn_bias:
            block.mlp.c_fc.bias.copy_(t(a["b_ff1"]))
            block.mlp.c_proj.bias.copy_(t(a["b_ff2"]))
    return block.eval()


def _module(weights, cfg, dtype):
    """The module for these weights, this config and dtype, built once."""
    return weights.prepared(("torch", cfg, np.dtype(dtype).char), lambda w: torch_module(w, cfg, dtype))


def _traced(block, x, cfg):
    """The block step by step, keeping every intermediate under its lesson name."""
    import torch
    tr = {}
    attn, mlp = block.attn, block.mlp

    def attention(X):
        q, k, v = attn.c_attn(X).split(cfg.d_model, dim=2)
        S = attn.heads(q) @ attn.heads(k).transpose(-2, -1) / cfg.d_k ** 0.5
        if cfg.causal:
            S = S.masked_fill(~torch.ones(S.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
        tr.update(Q=q, K=k, V=v, A=torch.softmax(S, dim=-1), out_concat=attn.core(q, k, v))
        tr["A_out"] = attn.c_proj(tr["out_concat"])
        return tr["A_out"]

    def ffn(X):
        tr["F_pre"] = mlp.c_fc(X)
        tr["F_post"] = mlp.act(tr["F_pre"])
        tr["F_out"] = mlp.c_proj(tr["F_post"])
        return tr["F_out"]

    if block.pre:
        tr["H_norm1"] = block.ln_1(x)
        tr["H_mid"] = x + attention(tr["H_norm1"])
        tr["H_norm2"] = block.ln_2(tr["H_mid"])
        tr["H_out"] = tr["H_mid"] + ffn(tr["H_norm2"])
    else:
        tr["H_norm1"] = tr["H_mid"] = block.ln_1(x + attention(x))
        tr["H_norm2"] = tr["H_out"] = block.ln_2(tr["H_mid"] + ffn(tr["H_mid"]))
    return {k: v.numpy() for k, v in tr.items()}


def forward_batch(H, weights, cfg, trace):
    """Backend entry point: H (B, T, d_model) float32/float64, computed in its dtype."""
    import torch
    block = _module(weights, cfg, H.dtype)
    with torch.inference_mode():
        x = torch.from_numpy(np.array(H))           # a writable copy: H is read-only
        if trace:
            tr = _traced(block, x, cfg)
            return tr["H_out"], tr
        return block(x).numpy(), None


def components(cfg, weights, dtype):
    """nanoGPT's modules, the one module the peers benchmark runs too (tblock.peers)."""
    import torch

    from .components import ComponentSet

    block = torch_module(weights, cfg, dtype)
    masks = {}

    def keep(T):
        if T not in masks:      # built on the warm-up call, never inside a timed one
            masks[T] = torch.ones(T, T, dtype=torch.bool).tril()
        return masks[T]

    # from_numpy shares memory, so handing numpy inputs over costs nothing; a batch of one
    @torch.inference_mode()
    def layernorm(X):
        return block.ln_1(torch.from_numpy(X))

    @torch.inference_mode()
    def softmax(S):
        S = torch.from_numpy(S)
        if cfg.causal:
            S = S.masked_fill(~keep(S.shape[-1]), float("-inf"))
        return torch.softmax(S, dim=-1)

    @torch.inference_mode()
    def attention_core(Q, K, V):
        return block.attn.core(torch.from_numpy(Q)[None], torch.from_numpy(K)[None], torch.from_numpy(V)[None])[0]

    @torch.inference_mode()
    def attention(X):
        return block.attn(torch.from_numpy(X)[None])[0]

    @torch.inference_mode()
    def ffn(X):
        return block.mlp(torch.from_numpy(X)[None])[0]

    @torch.inference_mode()
    def whole(X):
        return block(torch.from_numpy(X)[None])[0].numpy()

    cs = ComponentSet("torch", cfg, dtype, dtype, square="causal")   # SDPA's CPU flash kernel skips masked tiles
    cs.fns.update(layernorm=layernorm, softmax=softmax, attention_core=attention_core,
                  attention=attention, ffn=ffn, block=whole)
    cs.notes.append("torch: nanoGPT-style modules under torch.inference_mode, "
                    "F.scaled_dot_product_attention(is_causal=cfg.causal); "
                    "its block is the module, not tblock.forward")
    return cs
