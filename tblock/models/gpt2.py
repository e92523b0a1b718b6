"""GPT-2: its config, its Hugging Face checkpoints' names, and the model built from them.

    model = tblock.GPT2.from_pretrained("path/to/gpt2")   # config.json + *.safetensors
    logits = model(ids)        # ids (T,) -> (T, vocab); (B, T) -> (B, T, vocab); float32
    out = model.generate(ids, 50, temperature=0)          # prompt + 50 greedy tokens
    for tok in model.stream(ids, 50, temperature=0.8, top_k=40, seed=1): ...

GPT-2 is models.causal_lm's model exactly, as transformers' ``GPT2LMHeadModel`` computes
it: learned positions, Pre-LN causal blocks with every bias, LN_f and the head tied to
wte.  Each block is tblock's block with ``GPT2Config.block_config()``: BlockConfig(
norm="pre", causal=True, activation="gelu_tanh" (GPT-2's gelu_new), ffn_bias, ln_affine,
attn_bias).

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

import math
import numbers
from dataclasses import asdict, dataclass, fields

import numpy as np

from ..config import BlockConfig, check_bool, check_int
from ..formats import QuantizedMatrix
from ..weights import BlockWeights, check_finite
from .causal_lm import CausalLM, check_dtype
from .checkpoint import Checkpoint
from .gguf import split_outputs
from .stored import from_checkpoint, head_format, stored_block, stored_head

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
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        if self.n_inner is not None:
            object.__setattr__(self, "n_inner", check_int("n_inner", self.n_inner, 1))
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
            check_bool(name, getattr(self, name))
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
            got = repr(model_type)[:100] if isinstance(model_type, str) else f"a {type(model_type).__name__}"
            raise ValueError(f"{_where(where)}model_type must be 'gpt2', got {got}")
        kw = {f.name: hf[f.name] for f in fields(cls) if f.name in hf}
        for name, value in kw.items():
            if value is not None and not isinstance(value, (bool, int, float, str)):
                raise TypeError(f"{_where(where)}{name} must be a number, a string or a bool, "
                                f"got {type(value).__name__}")
        try:
            return cls(**kw)
        except (TypeError, ValueError) as e:
            # a value is quoted in the message; a file's may be long
            raise type(e)(f"{_where(where)}{str(e):.500}") from None

    def to_hf(self) -> dict:
        """The config.json dict transformers' GPT2Config reads."""
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], **asdict(self)}


# ----------------------------------------------------------------------------- checkpoint names

HEAD_NAME = "lm_head.weight"        # optional; when present it must equal wte.weight
PREFIX = "transformer."
BLOCK_TENSORS = 12                  # the tensors of one block


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


def _is_mask_buffer(name: str) -> bool:
    # h.{i}.attn.bias (the causal mask) and h.{i}.attn.masked_bias, saved by older transformers
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "h" and parts[2] == "attn" and parts[3] in ("bias", "masked_bias")


def _canonical(name: str) -> str:
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def read_gpt2(ckpt: Checkpoint, cfg: GPT2Config, dtype=np.float32) -> dict[str, np.ndarray]:
    """The tensors of a GPT-2 checkpoint, by their names without ``transformer.``, checked
    against ``cfg`` (every tensor present, none extra, shapes, float dtypes, finite values)
    and converted to ``dtype``.  The config's sizes are checked against the files' headers
    before any tensor is read.  Every error names the tensor."""
    root = ckpt.root
    names = {}                                  # canonical name -> stored name
    for s in ckpt.tensors:
        c = _canonical(s)
        if _is_mask_buffer(c):
            continue
        if c in names:
            raise ValueError(f"{root}: tensor {c!r} is stored twice, as {names[c]!r} and {s!r}")
        names[c] = s
    if cfg.n_layer > len(names):
        # checked before the expected names are listed, so that their number is bounded by the files
        raise ValueError(f"{root}: config.json has n_layer={cfg.n_layer}, but the checkpoint holds only "
                         f"{len(names)} tensors ({BLOCK_TENSORS} a block)")
    want = hf_tensor_shapes(cfg)
    if HEAD_NAME in names:
        want[HEAD_NAME] = want["wte.weight"]
    what = (f"a GPT-2 LM with n_layer={cfg.n_layer} (n_embd={cfg.n_embd}, d_ff={cfg.d_ff}, "
            f"vocab_size={cfg.vocab_size}, n_positions={cfg.n_positions})")
    out = ckpt.read_all(names, want, dtype, what)
    if HEAD_NAME in out:
        if not np.array_equal(out.pop(HEAD_NAME), out["wte.weight"]):
            raise ValueError(f"{root}: tensor {names[HEAD_NAME]!r} differs from {names['wte.weight']!r}: "
                             f"tblock's head is tied to the token embedding (tie_word_embeddings)")
    return out


def _block_from_hf(t: dict, i: int, d: int) -> BlockWeights:
    """Block i's BlockWeights from the checkpoint's tensors (Conv1D weights are (in, out),
    float arrays or stored QuantizedMatrix)."""
    p = f"h.{i}."
    w_q, w_k, w_v = split_outputs(t[p + "attn.c_attn.weight"], (d, d, d))   # (d, 3d): [q | k | v]
    b_qkv = t[p + "attn.c_attn.bias"]
    return BlockWeights(
        w_q=w_q, w_k=w_k, w_v=w_v, b_q=b_qkv[:d], b_k=b_qkv[d:2 * d], b_v=b_qkv[2 * d:],
        w_o=t[p + "attn.c_proj.weight"], b_o=t[p + "attn.c_proj.bias"],
        w_ff1=t[p + "mlp.c_fc.weight"], b_ff1=t[p + "mlp.c_fc.bias"],
        w_ff2=t[p + "mlp.c_proj.weight"], b_ff2=t[p + "mlp.c_proj.bias"],
        ln1_gamma=t[p + "ln_1.weight"], ln1_beta=t[p + "ln_1.bias"],
        ln2_gamma=t[p + "ln_2.weight"], ln2_beta=t[p + "ln_2.bias"],
    )


# ----------------------------------------------------------------------------- the model


class GPT2(CausalLM):
    """A GPT-2 language model on tblock's blocks.  Build it with ``from_pretrained``,
    ``from_config`` or ``init``; ``model(ids)`` gives the logits, ``model.hidden_states(ids)``
    the residual stream after each block."""

    def __init__(self, config: GPT2Config, wte, wpe, blocks, ln_f_gamma, ln_f_beta, dtype=np.float32):
        if not isinstance(config, GPT2Config):
            raise TypeError(f"config must be a GPT2Config, got {type(config).__name__}")
        if isinstance(blocks, (list, tuple)) and len(blocks) != config.n_layer:
            raise ValueError(f"blocks must hold n_layer={config.n_layer} BlockWeights, got {len(blocks)}")
        self.config = config
        super().__init__(config.block_config(), config.vocab_size, config.n_positions, (wte, wpe), blocks,
                         (ln_f_gamma, ln_f_beta), dtype)

    def __repr__(self):
        c = self.config
        return (f"GPT2(n_layer={c.n_layer}, n_embd={c.n_embd}, n_head={c.n_head}, vocab_size={c.vocab_size}, "
                f"n_positions={c.n_positions}, dtype={self.dtype}, weights={self.weight_format}, "
                f"head_weights={self.head_format})")

    @classmethod
    def from_pretrained(cls, path, dtype=np.float32, *, weights: str = "fp32", head_weights: str | None = None,
                        dot: str = "fp32") -> "GPT2":
        """Load a Hugging Face GPT-2 checkpoint directory: config.json plus model.safetensors,
        or shards listed in model.safetensors.index.json.  Tensors may be float32, float16
        or bfloat16; they are converted to ``dtype`` (float32, or float64), the compute dtype.

        ``weights``: how each block's six matrices are stored, one of tblock.FORMATS: "fp32"
        (the default) keeps them as loaded, in ``dtype``; "bf16", "int8" and "int4" quantize
        the float32 matrices with tblock.quantize (biases and LayerNorms stay float32) and
        need dtype float32, the dtype a stored format computes in.

        ``head_weights``: how the tied embedding wte (the head's matrix, GPT-2 small's largest)
        is stored, another of tblock.FORMATS; None (the default) follows ``weights``, except
        that int4 blocks get an int8 head: the head in 4 bits cost a trained model ten times
        the perplexity the blocks in 4 bits did (docs/formats.md), and llama.cpp keeps its
        output matrix above 4 bits too.  A stored wte is read in place by the head and by
        the embedding's lookups.  wpe and LN_f stay in ``dtype``.

        ``dot``: how products with the stored matrices (blocks and head) are computed,
        tblock.formats' "fp32" (the default) or "int8" (inputs rounded to int8 blocks, as
        llama.cpp computes; int8 and int4 matrices only)."""
        return from_checkpoint(cls, GPT2Config, read_gpt2, path, dtype, weights, head_weights, dot)

    @classmethod
    def from_tensors(cls, cfg: GPT2Config, t: dict, dtype=np.float32, *, weights: str = "fp32",
                     head_weights: str | None = None, dot: str = "fp32", where: str = "") -> "GPT2":
        """The model from tensors by their names without ``transformer.`` (float arrays, or
        stored QuantizedMatrix: a GGUF file's, kept as stored; a stored wpe is widened)."""
        head_weights = head_format(weights, head_weights, dot, dtype)
        blocks = [stored_block(_block_from_hf(t, i, cfg.n_embd), weights, dot, i, where) for i in range(cfg.n_layer)]
        wte = stored_head(t["wte.weight"], head_weights, dot, "wte", where)
        wpe = t["wpe.weight"]
        if isinstance(wpe, QuantizedMatrix):            # positions are added, not multiplied: floats
            wpe = wpe.dequantize(np.float32).T
        return cls(cfg, wte, wpe, blocks, t["ln_f.weight"], t["ln_f.bias"], dtype)

    @classmethod
    def init(cls, config: GPT2Config, seed, dtype=np.float32) -> "GPT2":
        """A random model with GPT-2's initialisation (as transformers' GPT2 does it): every
        weight matrix and both embeddings N(0, initializer_range), the two c_proj matrices
        (w_o, w_ff2) with the std divided by sqrt(2 n_layer), biases 0, LayerNorms gamma=1,
        beta=0.  Drawn in float32 from one numpy default_rng(seed), in the order wte, wpe,
        then per block c_attn (w_q | w_k | w_v), attn.c_proj, c_fc, mlp.c_proj."""
        if not isinstance(config, GPT2Config):
            raise TypeError(f"config must be a GPT2Config, got {type(config).__name__}")
        dtype = check_dtype(dtype)
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
