"""GPT-2: the lesson's block at real scale, loaded from Hugging Face checkpoints.

    model = tblock.GPT2.from_pretrained("path/to/gpt2")   # config.json + *.safetensors
    logits = model(ids)        # ids (T,) -> (T, vocab); (B, T) -> (B, T, vocab); float32
    out = model.generate(ids, 50, temperature=0)          # prompt + 50 greedy tokens
    for tok in model.stream(ids, 50, temperature=0.8, top_k=40, seed=1): ...

The model, as GPT-2 and Hugging Face's ``GPT2LMHeadModel`` compute it:

    h_0    = wte[ids] + wpe[0:T]              token embedding plus learned positions
    h_l    = Block_l(h_{l-1}), l = 1..n_layer  Pre-LN causal blocks, every bias present
    logits = LN_f(h_N) @ wte^T                 the vocabulary head, tied to the embedding

Each block is tblock's block with ``GPT2Config.block_config()``: BlockConfig(norm="pre",
causal=True, activation="gelu_tanh" (GPT-2's gelu_new), ffn_bias, ln_affine, attn_bias),
run by ``tblock.Stack`` on any backend.  The head is ``tblock.kernels.lm_head``: LN_f and
a parallel GEMM over wte packed once into the micro-kernel's panels.

Generation (``generate``, ``stream``): the prompt goes through the blocks as one chunk,
filling a KVCache per block, then each new token is one cached step: its embedding at
the next position, the 12 blocks over the cache, and the head on that one row (a GEMV
over wte).  On the numba backend a step after the first with the same caches is one
compiled call (``tblock.kernels.decode``), its arguments prepared once per list of
caches: a model is fixed once made (its arrays are read-only, and the packed head and
the prepared step are built from them once).  The next token is the argmax (temperature
0) or a draw from ``next_token_probs`` (temperature, then top-k, then top-p, as
transformers orders them).

Checkpoint names (``transformer.`` prefix optional).  GPT-2's Conv1D stores its weight as
(in, out), which is the lesson's row convention ``X @ W``, so nothing is transposed:

    h.{i}.ln_1.weight / .bias        ln1_gamma / ln1_beta
    h.{i}.attn.c_attn.weight (d, 3d) w_q | w_k | w_v, column blocks; .bias (3d,) b_q | b_k | b_v
    h.{i}.attn.c_proj.weight / .bias w_o / b_o
    h.{i}.ln_2.weight / .bias        ln2_gamma / ln2_beta
    h.{i}.mlp.c_fc.weight / .bias    w_ff1 (d, d_ff) / b_ff1
    h.{i}.mlp.c_proj.weight / .bias  w_ff2 (d_ff, d) / b_ff2
    wte.weight (vocab, d), wpe.weight (n_positions, d), ln_f.weight / .bias
    lm_head.weight                   optional: the tied head, equal to wte.weight
    h.{i}.attn.bias, .masked_bias    older checkpoints' causal-mask buffers: ignored
"""

from __future__ import annotations

import json
import math
import numbers
import os
import struct
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from .api import Stack, get_backend
from .backends import DEFAULT_BACKEND
from .config import BlockConfig, _check_bool, _check_int
from .kvcache import KVCache
from .weights import FLOAT_DTYPES, BlockWeights, as_float_array, check_finite

# Hugging Face's activation names -> BlockConfig's; gelu_new and gelu_pytorch_tanh are both
# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), HF's "gelu" is the exact erf form
HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu_erf", "relu": "relu"}


def _where(where: str) -> str:
    return f"{where}: " if where else ""


@dataclass(frozen=True)
class GPT2Config:
    """GPT-2's hyper-parameters under Hugging Face's config.json names.  The flags after
    ``initializer_range`` are the GPT-2 variants tblock's block does not compute; they are
    kept so that a config that sets them is refused by name rather than run wrongly."""
    vocab_size: int = 50257
    n_positions: int = 1024             # the longest sequence: wpe has this many rows
    n_embd: int = 768                   # d_model
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None          # d_ff; None means 4 * n_embd
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02     # the std of GPT2.init's normal draws
    scale_attn_weights: bool = True     # scores / sqrt(d_k): must be True
    scale_attn_by_inverse_layer_idx: bool = False   # scores / (layer + 1) too: must be False
    reorder_and_upcast_attn: bool = False   # HF computes attention in float32: tblock always does
    add_cross_attention: bool = False   # an encoder-decoder's cross attention: must be False
    tie_word_embeddings: bool = True    # the head is wte^T: must be True

    def __post_init__(self):
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            object.__setattr__(self, name, _check_int(name, getattr(self, name), 1))
        if self.n_inner is not None:
            object.__setattr__(self, "n_inner", _check_int("n_inner", self.n_inner, 1))
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd must be divisible by n_head, got n_embd={self.n_embd}, n_head={self.n_head}")
        if self.activation_function not in HF_ACTIVATIONS:
            raise ValueError(f"activation_function must be one of {tuple(HF_ACTIVATIONS)}, "
                             f"got {self.activation_function!r}")
        for name in ("layer_norm_epsilon", "initializer_range"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
            if not 0.0 < float(value) < math.inf:
                raise ValueError(f"{name} must be positive and finite, got {value!r}")
            object.__setattr__(self, name, float(value))
        for name in ("scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
                     "add_cross_attention", "tie_word_embeddings"):
            _check_bool(name, getattr(self, name))
        unsupported = {
            "scale_attn_weights": (False, "tblock's attention always divides the scores by sqrt(d_k)"),
            "scale_attn_by_inverse_layer_idx": (True, "tblock's attention does not divide the scores "
                                                      "by the layer index"),
            "add_cross_attention": (True, "tblock's block has no cross attention"),
            "tie_word_embeddings": (False, "tblock's head is the tied embedding wte^T; an untied "
                                           "lm_head is not supported"),
        }
        for name, (bad, why) in unsupported.items():
            if getattr(self, name) == bad:
                raise ValueError(f"{name}={bad} is not supported: {why}")

    @property
    def d_ff(self) -> int:
        return 4 * self.n_embd if self.n_inner is None else self.n_inner

    def block_config(self) -> BlockConfig:
        """The BlockConfig of every block of this model."""
        return BlockConfig(d_model=self.n_embd, n_heads=self.n_head, d_ff=self.d_ff, causal=True, norm="pre",
                           activation=HF_ACTIVATIONS[self.activation_function], eps=self.layer_norm_epsilon,
                           ffn_bias=True, ln_affine=True, attn_bias=True)

    def param_count(self) -> int:
        """Parameters of the model, the tied head counted once (GPT-2 small: 124,439,808)."""
        d, f = self.n_embd, self.d_ff
        block = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d   # attention, FFN, two LayerNorms
        return self.vocab_size * d + self.n_positions * d + self.n_layer * block + 2 * d

    @classmethod
    def from_hf(cls, hf: dict, where: str = "") -> "GPT2Config":
        """From the dict of a Hugging Face config.json.  Keys that do not change the
        forward pass (dropout rates, token ids, summary_* of the double-heads model, ...)
        are ignored, as transformers ignores them; ``where`` prefixes the errors."""
        if not isinstance(hf, dict):
            raise TypeError(f"{_where(where)}the config must be a JSON object, got {type(hf).__name__}")
        model_type = hf.get("model_type", "gpt2")
        if model_type != "gpt2":
            raise ValueError(f"{_where(where)}model_type must be 'gpt2', got {model_type!r}")
        kw = {f.name: hf[f.name] for f in fields(cls) if f.name in hf}
        try:
            return cls(**kw)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{_where(where)}{e}") from None

    def to_hf(self) -> dict:
        """The config.json dict transformers' GPT2Config reads."""
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], **asdict(self)}


# ----------------------------------------------------------------------------- checkpoints


def hf_tensor_shapes(cfg: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every tensor a GPT-2 checkpoint must hold, by its name without ``transformer.``."""
    d, f = cfg.n_embd, cfg.d_ff
    shapes = {"wte.weight": (cfg.vocab_size, d), "wpe.weight": (cfg.n_positions, d),
              "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (d, f), p + "mlp.c_fc.bias": (f,),
            p + "mlp.c_proj.weight": (f, d), p + "mlp.c_proj.bias": (d,),
        })
    return shapes


HEAD_NAME = "lm_head.weight"        # optional; when present it must equal wte.weight
PREFIX = "transformer."
# safetensors dtypes a checkpoint may hold, all computed in float32 (or float64)
FLOAT_CODES = {"F16": np.float16, "BF16": None, "F32": np.float32, "F64": np.float64}


def _is_mask_buffer(name: str) -> bool:
    # h.{i}.attn.bias (the causal mask) and h.{i}.attn.masked_bias, saved by older transformers
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "h" and parts[2] == "attn" and parts[3] in ("bias", "masked_bias")


def _canonical(name: str) -> str:
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def _weight_files(root: Path) -> dict[str, Path]:
    """{tensor name as stored: the file that holds it}, from model.safetensors or a sharded
    checkpoint's model.safetensors.index.json."""
    single, index = root / "model.safetensors", root / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: not a safetensors index (a JSON object with a 'weight_map'): {e}") from None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: 'weight_map' must map tensor names to file names")
        files = {}
        for name, file in weight_map.items():
            path = root / str(file)
            if not path.is_file():
                raise ValueError(f"{index}: tensor {name!r} is in {file!r}, which does not exist")
            files[name] = path
        return files
    if single.is_file():
        from safetensors import safe_open
        with safe_open(single, framework="np") as f:
            return {name: single for name in f.keys()}
    others = sorted(p.name for p in root.iterdir() if p.suffix in (".bin", ".pt", ".h5", ".msgpack"))
    hint = f" (found {', '.join(others)}: only safetensors checkpoints are read)" if others else ""
    raise FileNotFoundError(f"{root}: neither model.safetensors nor model.safetensors.index.json{hint}")


def _bf16_raw(path: Path, name: str) -> np.ndarray:
    """A bfloat16 tensor as float32, read from the file itself (NumPy has no bfloat16, so
    safetensors' NumPy API refuses it).  The format: an 8-byte little-endian header length,
    a JSON header {name: {dtype, shape, data_offsets}}, then the data; a bfloat16 is the top
    16 bits of a float32, so shifting it left 16 bits is the float32 it stands for, exactly."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        info = json.loads(f.read(n))[name]
    start, end = info["data_offsets"]
    count = int(np.prod(info["shape"], dtype=np.int64))
    if end - start != 2 * count:
        raise ValueError(f"{path}: tensor {name!r} has {end - start} bytes for shape {info['shape']} in bfloat16")
    bits = np.fromfile(path, dtype="<u2", count=count, offset=8 + n + start)
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


def read_checkpoint(root, cfg: GPT2Config, dtype=np.float32) -> dict[str, np.ndarray]:
    """The tensors of a GPT-2 safetensors checkpoint in ``root``, by their names without
    ``transformer.``, checked against ``cfg`` (every tensor present, none extra, shapes,
    float dtypes, finite values) and converted to ``dtype``.  Every error names the tensor."""
    from safetensors import safe_open

    root = Path(root)
    want = hf_tensor_shapes(cfg)
    stored = _weight_files(root)                # stored name -> file
    names = {}                                  # canonical name -> stored name
    for s in stored:
        c = _canonical(s)
        if _is_mask_buffer(c):
            continue
        if c in names:
            raise ValueError(f"{root}: tensor {c!r} is stored twice, as {names[c]!r} and {s!r}")
        names[c] = s
    missing = [n for n in want if n not in names]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError(f"{root}: the checkpoint lacks {', '.join(repr(n) for n in missing[:5])}{more} "
                         f"(for n_layer={cfg.n_layer})")
    extra = [names[n] for n in names if n not in want and n != HEAD_NAME]
    if extra:
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        raise ValueError(f"{root}: unexpected tensor {', '.join(repr(n) for n in extra[:5])}{more} "
                         f"(a GPT-2 LM with n_layer={cfg.n_layer} has no such weight)")
    if HEAD_NAME in names:
        want = {**want, HEAD_NAME: want["wte.weight"]}

    by_file: dict[Path, list[str]] = {}
    for c in want:
        by_file.setdefault(stored[names[c]], []).append(c)
    out = {}
    for path, group in by_file.items():
        with safe_open(path, framework="np") as f:
            held = set(f.keys())
            for c in group:
                s = names[c]
                if s not in held:
                    raise ValueError(f"{path}: tensor {s!r} is listed in the index but not in this file")
                info = f.get_slice(s)
                code, shape = info.get_dtype(), tuple(info.get_shape())
                if shape != want[c]:
                    raise ValueError(f"{root}: tensor {s!r} must have shape {want[c]} for the config "
                                     f"(n_embd={cfg.n_embd}, d_ff={cfg.d_ff}, vocab_size={cfg.vocab_size}, "
                                     f"n_positions={cfg.n_positions}), got {shape}")
                if code not in FLOAT_CODES:
                    raise TypeError(f"{root}: tensor {s!r} must be F32, F16 or BF16 (or F64), got {code}")
                a = _bf16_raw(path, s) if code == "BF16" else f.get_tensor(s)
                a = np.asarray(a, dtype=dtype)
                try:
                    check_finite(f"tensor {s!r}", a)
                except ValueError as e:
                    raise ValueError(f"{root}: {e}") from None
                out[c] = a
    if HEAD_NAME in out:
        if not np.array_equal(out.pop(HEAD_NAME), out["wte.weight"]):
            raise ValueError(f"{root}: tensor {names[HEAD_NAME]!r} differs from {names['wte.weight']!r}: "
                             f"tblock's head is tied to the token embedding (tie_word_embeddings)")
    return out


def _block_from_hf(t: dict, i: int, d: int) -> BlockWeights:
    """Block i's BlockWeights from the checkpoint's tensors (Conv1D weights are (in, out))."""
    p = f"h.{i}."
    w_qkv, b_qkv = t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"]   # (d, 3d): [q | k | v]
    return BlockWeights(
        w_q=w_qkv[:, :d], w_k=w_qkv[:, d:2 * d], w_v=w_qkv[:, 2 * d:],
        b_q=b_qkv[:d], b_k=b_qkv[d:2 * d], b_v=b_qkv[2 * d:],
        w_o=t[p + "attn.c_proj.weight"], b_o=t[p + "attn.c_proj.bias"],
        w_ff1=t[p + "mlp.c_fc.weight"], b_ff1=t[p + "mlp.c_fc.bias"],
        w_ff2=t[p + "mlp.c_proj.weight"], b_ff2=t[p + "mlp.c_proj.bias"],
        ln1_gamma=t[p + "ln_1.weight"], ln1_beta=t[p + "ln_1.bias"],
        ln2_gamma=t[p + "ln_2.weight"], ln2_beta=t[p + "ln_2.bias"],
    )


def _check_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


# ----------------------------------------------------------------------------- the model


class GPT2:
    """A GPT-2 language model on tblock's blocks.  Build it with ``from_pretrained``,
    ``from_config`` or ``init``; ``model(ids)`` gives the logits, ``model.hidden_states(ids)``
    the residual stream after each block."""

    def __init__(self, config: GPT2Config, wte, wpe, blocks, ln_f_gamma, ln_f_beta, dtype=np.float32):
        if not isinstance(config, GPT2Config):
            raise TypeError(f"config must be a GPT2Config, got {type(config).__name__}")
        dtype = _check_dtype(dtype)
        d = config.n_embd

        def own(name, value, shape):
            a = as_float_array(name, value, len(shape))
            if a.shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
            check_finite(name, a)
            a = np.array(a, dtype=dtype, order="C")     # a private copy, as BlockWeights keeps
            a.flags.writeable = False
            return a

        self.config, self.dtype = config, dtype
        self.wte = own("wte", wte, (config.vocab_size, d))      # (vocab, d): row v is token v
        self.wpe = own("wpe", wpe, (config.n_positions, d))     # (n_positions, d): row t is position t
        self.ln_f = np.concatenate([own("ln_f_gamma", ln_f_gamma, (d,)),
                                    own("ln_f_beta", ln_f_beta, (d,))])     # (2d,): [gamma | beta]
        self.ln_f.flags.writeable = False       # like every array of the model: edits cannot go stale
        if isinstance(blocks, BlockWeights) or not isinstance(blocks, (list, tuple)):
            raise TypeError(f"blocks must be a list of BlockWeights, got {type(blocks).__name__}")
        if len(blocks) != config.n_layer:
            raise ValueError(f"blocks must hold n_layer={config.n_layer} BlockWeights, got {len(blocks)}")
        self.stack = Stack(config.block_config(), [self._cast(b, i) for i, b in enumerate(blocks)])
        self._head = None                                       # wte packed for the head, on first use
        self._step = None                                       # a prepared decode step (_prepare_step)

    def _cast(self, w, i: int) -> BlockWeights:
        # every block in the model's dtype, so the blocks run in the dtype the logits have
        if not isinstance(w, BlockWeights):
            raise TypeError(f"blocks[{i}] must be a BlockWeights, got {type(w).__name__}")
        if w.dtype == self.dtype:
            return w
        return BlockWeights(**{k: v.astype(self.dtype) for k, v in w.arrays().items()})

    # --------------------------------------------------------------- constructors

    @classmethod
    def from_pretrained(cls, path, dtype=np.float32) -> "GPT2":
        """Load a Hugging Face GPT-2 checkpoint directory: config.json plus model.safetensors,
        or shards listed in model.safetensors.index.json.  Tensors may be float32, float16
        or bfloat16; they are converted to ``dtype`` (float32, or float64), the compute dtype."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
        dtype = _check_dtype(dtype)
        root = Path(path)
        if not root.is_dir():
            raise FileNotFoundError(f"path must be a checkpoint directory, got {str(root)!r}, "
                                    f"which {'is a file' if root.exists() else 'does not exist'}")
        config_file = root / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"{root}: no config.json")
        try:
            hf = json.loads(config_file.read_text())
        except ValueError as e:
            raise ValueError(f"{config_file}: not valid JSON: {e}") from None
        cfg = GPT2Config.from_hf(hf, where=str(config_file))
        t = read_checkpoint(root, cfg, dtype)
        blocks = [_block_from_hf(t, i, cfg.n_embd) for i in range(cfg.n_layer)]
        return cls(cfg, t["wte.weight"], t["wpe.weight"], blocks, t["ln_f.weight"], t["ln_f.bias"], dtype)

    @classmethod
    def init(cls, config: GPT2Config, seed, dtype=np.float32) -> "GPT2":
        """A random model with GPT-2's initialisation (as transformers' GPT2 does it): every
        weight matrix and both embeddings N(0, initializer_range), the two c_proj matrices
        (w_o, w_ff2) with the std divided by sqrt(2 n_layer), biases 0, LayerNorms gamma=1,
        beta=0.  Drawn in float32 from one numpy default_rng(seed), in the order wte, wpe,
        then per block c_attn (w_q | w_k | w_v), attn.c_proj, c_fc, mlp.c_proj."""
        if not isinstance(config, GPT2Config):
            raise TypeError(f"config must be a GPT2Config, got {type(config).__name__}")
        dtype = _check_dtype(dtype)
        rng = np.random.default_rng(seed)
        d, f, std = config.n_embd, config.d_ff, config.initializer_range
        proj_std = std / math.sqrt(2 * config.n_layer)

        def normal(shape, s):
            # float32 draws: GPT-2 small's 38.6M-entry wte needs no float64 scratch
            return rng.standard_normal(shape, dtype=np.float32) * np.float32(s)

        wte, wpe = normal((config.vocab_size, d), std), normal((config.n_positions, d), std)
        blocks = []
        for _ in range(config.n_layer):
            w_qkv = normal((d, 3 * d), std)
            w_o, w_ff1, w_ff2 = normal((d, d), proj_std), normal((d, f), std), normal((f, d), proj_std)
            zeros = np.zeros(d, np.float32)
            blocks.append(BlockWeights(
                w_q=w_qkv[:, :d], w_k=w_qkv[:, d:2 * d], w_v=w_qkv[:, 2 * d:], w_o=w_o, w_ff1=w_ff1, w_ff2=w_ff2,
                b_q=zeros, b_k=zeros, b_v=zeros, b_o=zeros, b_ff1=np.zeros(f, np.float32), b_ff2=zeros,
                ln1_gamma=np.ones(d, np.float32), ln1_beta=zeros, ln2_gamma=np.ones(d, np.float32), ln2_beta=zeros))
        return cls(config, wte, wpe, blocks, np.ones(d, np.float32), np.zeros(d, np.float32), dtype)

    @classmethod
    def from_config(cls, config: GPT2Config | None = None, *, seed=0, dtype=np.float32, **kw) -> "GPT2":
        """A random model (``init``) from a GPT2Config, or from GPT2Config's keywords:
        ``GPT2.from_config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, seed=1)``."""
        if config is None:
            config = GPT2Config(**kw)
        elif kw:
            raise TypeError(f"give a GPT2Config or its keywords, not both (got config and {sorted(kw)})")
        return cls.init(config, seed, dtype)

    # --------------------------------------------------------------- forward

    def __repr__(self):
        c = self.config
        return (f"GPT2(n_layer={c.n_layer}, n_embd={c.n_embd}, n_head={c.n_head}, vocab_size={c.vocab_size}, "
                f"n_positions={c.n_positions}, dtype={self.dtype})")

    @property
    def blocks(self) -> list[BlockWeights]:
        return [b.weights for b in self.stack.blocks]

    def _check_ids(self, ids) -> np.ndarray:
        """ids as an integer (B, T) array, B=1 for 1-D ids, after every check."""
        if isinstance(ids, (list, tuple)):
            ids = np.asarray(ids)
        if not isinstance(ids, np.ndarray):
            raise TypeError(f"ids must be an integer numpy array (T,) or (B, T), got {type(ids).__name__}")
        if ids.ndim not in (1, 2):
            raise ValueError(f"ids must be (T,) or (B, T), got shape {ids.shape}")
        if ids.shape[-1] == 0 or ids.shape[0] == 0:
            raise ValueError(f"ids must hold at least one token (T >= 1) and one sequence, got shape {ids.shape}")
        if ids.dtype.kind not in "iu":
            raise TypeError(f"ids must have an integer dtype, got {ids.dtype}")
        c = self.config
        T = ids.shape[-1]
        if T > c.n_positions:
            raise ValueError(f"ids has T={T} tokens, more than n_positions={c.n_positions}: GPT-2 has no "
                             f"position embedding past position {c.n_positions - 1}")
        bad = (ids < 0) | (ids >= c.vocab_size)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"ids must be token ids in [0, vocab_size={c.vocab_size}), found {ids[at]} at index {at}")
        return ids if ids.ndim == 2 else ids[None]

    def _embed(self, ids2: np.ndarray) -> np.ndarray:
        """h_0 = wte[ids] + wpe[0:T]: (B, T) ids -> (B, T, d)."""
        return self.wte[ids2] + self.wpe[:ids2.shape[1]]

    def hidden_states(self, ids, backend: str | None = None) -> np.ndarray:
        """The residual stream h_0 (the embeddings), h_1, ..., h_{n_layer} (after each block),
        stacked: (n_layer + 1, T, d) for ids (T,), (n_layer + 1, B, T, d) for ids (B, T).
        No LN_f is applied (transformers' last hidden state is LN_f(h_{n_layer}))."""
        ids2 = self._check_ids(ids)
        H = self._embed(ids2)
        states = [H]
        for block in self.stack.blocks:
            H = block(H, backend=backend)
            states.append(H)
        out = np.stack(states)                      # (n_layer + 1, B, T, d)
        return out if np.ndim(ids) == 2 else out[:, 0]

    def __call__(self, ids, backend: str | None = None, cache: list[KVCache] | None = None) -> np.ndarray:
        """Logits: (T, vocab) for ids (T,), (B, T, vocab) for ids (B, T), in the model's dtype
        (float32 unless loaded as float64).  ``backend`` runs the blocks as in tblock.forward;
        the head is the numba kernel on the numba backend, NumPy in float64 on the others.

        With ``cache`` (``make_cache``), ids are the next tokens of sequences whose first
        ``cache[0].length`` tokens the cache holds: they sit at the positions after those,
        their keys and values are appended, and their logits are those of a call on the
        whole sequence."""
        name = self._cached_backend(backend) if cache is not None else self._backend(backend)
        ids2 = self._check_ids(ids)
        if cache is None:
            H = self.stack(self._embed(ids2), backend=name)
        else:
            H = self._forward_cached(ids2, cache, name)
        logits = self._logits(H, name)           # (B, T, vocab)
        return logits if np.ndim(ids) == 2 else logits[0]

    @staticmethod
    def _backend(backend: str | None) -> str:
        name = DEFAULT_BACKEND if backend is None else backend
        get_backend(name)                       # a bad backend fails before any work
        return name

    @classmethod
    def _cached_backend(cls, backend: str | None) -> str:
        name = cls._backend(backend)
        if getattr(get_backend(name), "forward_cached", None) is None:
            raise ValueError(f"backend {name!r} has no KV-cache path: generation needs one "
                             f"(numba and numpy have it)")
        return name

    # --------------------------------------------------------------- cached forward

    def make_cache(self, max_T: int | None = None, batch: int = 1) -> list[KVCache]:
        """Empty KV caches, one per block, for ``batch`` sequences of up to ``max_T`` tokens
        (default n_positions) in the model's dtype: 2 * n_layer * max_T * n_embd values per
        sequence, allocated here once."""
        max_T = self.config.n_positions if max_T is None else _check_int("max_T", max_T, 1)
        if max_T > self.config.n_positions:
            raise ValueError(f"max_T must be <= n_positions={self.config.n_positions} (GPT-2 has no "
                             f"position past that), got {max_T}")
        return self.stack.make_cache(max_T, batch, self.dtype)

    def _forward_cached(self, ids2: np.ndarray, cache: list[KVCache], backend: str) -> np.ndarray:
        """h_N of the new tokens ids2 (B, T_new) after the cache's ``past`` ones: (B, T_new, d).
        The stack checks every block's cache (config, dtype, batch, room) before writing any."""
        if isinstance(cache, KVCache) or not isinstance(cache, (list, tuple)) or not cache:
            raise TypeError(f"cache must be the list of KVCaches of model.make_cache(), got {type(cache).__name__}")
        past = getattr(cache[0], "length", 0)
        T_new = ids2.shape[1]
        if past + T_new > self.config.n_positions:
            raise ValueError(f"the cache holds {past} tokens; {T_new} more would pass n_positions="
                             f"{self.config.n_positions}")
        H = self.wte[ids2] + self.wpe[past:past + T_new]       # (B, T_new, d): positions past..past+T_new-1
        # the rows may be the cache's scratch: read them before the next call
        return self.stack.run_cached(H, backend, cache, fresh=False)

    def next_logits(self, ids, cache: list[KVCache], backend: str | None = None, out=None) -> np.ndarray:
        """The logits after the last of the new tokens ``ids`` only: (vocab,) for ids (T_new,),
        (B, vocab) for (B, T_new).  As ``model(ids, cache=cache)[..., -1, :]``, with the head
        run on that one row (a GEMV over wte).  ``out``: a (B, vocab) array of the model's
        dtype to write them into, so a decoding loop allocates none per token.  One token
        a sequence with the caches of the previous such call: one compiled call
        (_step_logits); otherwise, or on any error, the checked path."""
        logits = self._step_logits(ids, cache, backend, out)
        if logits is not None:
            return logits
        name = self._cached_backend(backend)
        ids2 = self._check_ids(ids)
        B = ids2.shape[0]
        if out is not None and (not isinstance(out, np.ndarray) or out.shape != (B, self.config.vocab_size)
                                or out.dtype != self.dtype or not out.flags.c_contiguous):
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of shape "
                             f"{(B, self.config.vocab_size)}, got {getattr(out, 'shape', type(out).__name__)}")
        H = self._forward_cached(ids2, cache, name)
        logits = self._logits(H[:, -1:], name, None if out is None else out[:, None], scratch=True)  # (B, 1, vocab)
        if name == "numba" and ids2.shape[1] == 1:
            self._prepare_step(cache)
        return logits[:, 0] if np.ndim(ids) == 2 else logits[0, 0]

    def _prepare_step(self, cache: list[KVCache]) -> None:
        """After a checked decode step with these caches: the next steps with them take
        the backend's prepared step (one compiled call), where it has one."""
        from .backends import numba as backend
        self._step = backend.prepare_decode([b.weights for b in self.stack.blocks], self.stack.cfg, cache,
                                            self.wte, self.wpe, self.ln_f, self.config.layer_norm_epsilon,
                                            self._packed_head())

    def _step_logits(self, ids, cache, backend, out):
        """next_logits of one token a sequence through the prepared step, when the caches
        are those it was prepared for; None otherwise, with nothing changed."""
        if self._step is None or (backend is not None and backend != "numba") or DEFAULT_BACKEND != "numba":
            return None
        return self._step(ids, cache, out)

    def _packed_head(self):
        if self._head is None:
            from .backends import numba as backend
            self._head = backend.prepare_head(self.wte, self.dtype)
        return self._head

    def _logits(self, H: np.ndarray, backend: str, out: np.ndarray | None = None, scratch: bool = False) -> np.ndarray:
        """LN_f(H) @ wte^T for H (B, T, d), into ``out`` (B, T, vocab) when given.
        scratch: H is the caller's to overwrite (LN_f goes over it)."""
        B, T, d = H.shape
        vocab = self.config.vocab_size
        eps = self.config.layer_norm_epsilon
        if out is None:
            out = np.empty((B, T, vocab), dtype=self.dtype)
        if backend != "numba":
            # the reference head for the reference backends, in float64
            X = H.astype(np.float64)
            mu = X.mean(axis=-1, keepdims=True)
            var = ((X - mu) ** 2).mean(axis=-1, keepdims=True)
            Xn = (X - mu) / np.sqrt(var + eps) * self.ln_f[:d] + self.ln_f[d:]
            out[...] = Xn @ self.wte.T.astype(np.float64)
            return out
        from .backends import numba as backend
        return backend.lm_head(H, self.ln_f, eps, self._packed_head(), out, scratch)

    def param_count(self) -> int:
        """Parameters, the tied head counted once (as config.param_count())."""
        blocks = sum(a.size for b in self.blocks for a in b.arrays().values())
        return self.wte.size + self.wpe.size + blocks + self.ln_f.size

    # --------------------------------------------------------------- generation

    def generate(self, ids, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed=None, eos_token_id: int | None = None,
                 backend: str | None = None) -> np.ndarray:
        """The prompt followed by up to ``max_new_tokens`` new tokens, as transformers'
        generate returns them: (T + n,) for ids (T,), (B, T + n) for ids (B, T), int64.

        temperature 0 is greedy (the argmax; top_k and top_p do not apply); otherwise each
        token is drawn from ``next_token_probs(logits, temperature, top_k, top_p)`` with
        ``np.random.default_rng(seed)``, so a seed repeats a run.  A sequence that produces
        ``eos_token_id`` emits it from then on (transformers pads with pad_token_id, GPT-2's
        being its eos), and generation stops once every sequence has (n < max_new_tokens).
        The prompt runs through the blocks as one chunk, then each token is one cached step."""
        out, T, steps = self._start(ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id, backend)
        n = 0
        for n in steps:
            pass
        out = out[:, :T + n]
        return out if np.ndim(ids) == 2 else out[0]

    def stream(self, ids, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, seed=None, eos_token_id: int | None = None,
               backend: str | None = None):
        """``generate`` one token at a time: an iterator yielding each new token as an int
        for ids (T,), or the (B,) array of the step's tokens for ids (B, T).  The arguments
        are checked here, before the first token is asked for."""
        out, T, steps = self._start(ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id, backend)
        if np.ndim(ids) == 2:
            return (out[:, T + n - 1].copy() for n in steps)
        return (int(out[0, T + n - 1]) for n in steps)

    def _start(self, ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id, backend):
        """Every argument checked, the output buffer (B, T + max_new_tokens) holding the prompt,
        and the decoding loop (not started): (out, T, steps)."""
        ids2 = self._check_ids(ids)
        B, T = ids2.shape
        name = self._cached_backend(backend)
        c = self.config
        max_new = _check_int("max_new_tokens", max_new_tokens, 0)
        if T + max_new > c.n_positions:
            raise ValueError(f"max_new_tokens={max_new} after T={T} prompt tokens passes n_positions="
                             f"{c.n_positions} (GPT-2's context): at most {c.n_positions - T}")
        temperature = _check_temperature(temperature)
        top_k, top_p = _check_filters(top_k, top_p)
        if eos_token_id is not None:
            eos_token_id = _check_int("eos_token_id", eos_token_id, 0)
            if eos_token_id >= c.vocab_size:
                raise ValueError(f"eos_token_id must be a token id in [0, vocab_size={c.vocab_size}), "
                                 f"got {eos_token_id}")
        rng = _rng(seed)
        if temperature == 0.0:
            def pick(logits):               # (B, vocab) -> (B,): the first of equal maxima
                return logits.argmax(axis=-1)
        else:
            def pick(logits):
                return draw(next_token_probs(logits, temperature, top_k, top_p), rng)
        out = np.empty((B, T + max_new), dtype=np.int64)    # prompt + new tokens, allocated once
        out[:, :T] = ids2
        return out, T, self._decode(out, T, max_new, pick, eos_token_id, name)

    def _decode(self, out: np.ndarray, T: int, max_new: int, pick, eos: int | None, backend: str):
        """The decoding loop: fills out[:, T + n] for n = 0, 1, ... and yields n + 1 after
        each.  The prompt out[:, :T] is one chunk through the blocks; every later step feeds
        the token just chosen.  Caches and logits are allocated once, before the loop."""
        if max_new == 0:
            return
        B = out.shape[0]
        cache = self.make_cache(T + max_new - 1, B)     # the last new token is never fed back
        logits = np.empty((B, self.config.vocab_size), dtype=self.dtype)
        done = np.zeros(B, dtype=bool)
        chunk = out[:, :T]                  # (B, T): the prompt, then (B, 1) per step
        for n in range(max_new):
            self.next_logits(chunk, cache, backend, out=logits)
            tok = pick(logits)              # (B,)
            if eos is not None:
                tok = np.where(done, eos, tok)      # a finished sequence keeps emitting eos
                done |= tok == eos
            out[:, T + n] = tok
            yield n + 1
            if eos is not None and done.all():
                return
            chunk = out[:, T + n:T + n + 1]


# ----------------------------------------------------------------------------- sampling


def next_token_probs(logits, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None) -> np.ndarray:
    """The distribution the next token is drawn from, in float64, for logits (vocab,) or
    (B, vocab), in transformers' order:

      1. temperature: logits / temperature;
      2. top_k: only the k largest logits stay (ties with the k-th stay too);
      3. softmax over what stays;
      4. top_p: only the smallest set of most probable tokens whose probability sums to at
         least top_p stays (a token stays if the tokens more probable than it hold less
         than top_p; the most probable always stays), renormalised."""
    temperature = _check_temperature(temperature)
    if temperature == 0.0:
        raise ValueError("temperature must be > 0 for a distribution (temperature 0 is greedy: the argmax)")
    top_k, top_p = _check_filters(top_k, top_p)
    z = np.asarray(logits, dtype=np.float64) / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[..., -top_k, None]      # (..., 1): the k-th largest
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")                 # most probable first
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p               # mass of the more probable ones
        drop = np.empty(p.shape, dtype=bool)
        np.put_along_axis(drop, order, before >= top_p, axis=-1)
        p = np.where(drop, 0.0, p)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def draw(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row of p (B, vocab), by inverse CDF with one uniform draw per row:
    the first token whose cumulative probability passes u * total (a token of probability 0
    is never drawn)."""
    c = np.cumsum(p, axis=-1)                               # (B, vocab)
    u = rng.random(p.shape[0]) * c[:, -1]                   # (B,) in [0, total)
    return np.minimum((c <= u[:, None]).sum(axis=-1), p.shape[-1] - 1)


def _check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number, got {type(temperature).__name__} {temperature!r}")
    if not 0.0 <= float(temperature) < math.inf:
        raise ValueError(f"temperature must be >= 0 and finite (0 is greedy), got {temperature!r}")
    return float(temperature)


def _check_filters(top_k, top_p) -> tuple[int | None, float | None]:
    if top_k is not None:
        top_k = _check_int("top_k", top_k, 1)
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):
            raise TypeError(f"top_p must be a real number in (0, 1], got {type(top_p).__name__} {top_p!r}")
        if not 0.0 < float(top_p) <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        top_p = float(top_p)
    return top_k, top_p


def _rng(seed) -> np.random.Generator:
    """np.random.default_rng(seed) for seed None (fresh entropy) or an integer >= 0; a
    Generator is used as it is (its stream goes on)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None:
        _check_int("seed", seed, 0)
    return np.random.default_rng(seed)
