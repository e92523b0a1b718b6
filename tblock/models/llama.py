"""The Llama family (Llama, Qwen2, Mistral, SmolLM): its config, its checkpoints' names, the model.

    model = tblock.Llama.from_pretrained("path/to/SmolLM2-135M")   # config.json + *.safetensors
    model = tblock.load("path/to/Qwen2.5-0.5B")                    # the class from config.json

The same two sublayers as the lesson's block with four changes, each a BlockConfig option:
RMSNorm for LayerNorm (norm_type), rotary positions on Q and K for the learned table
(positions), the gated FFN silu(X W_gate) * (X W_up) (ffn="gated", SwiGLU) and fewer K/V heads
than query heads (n_kv_heads).  Qwen2 adds biases to Q, K and V but not O (attn_bias="qkv").
The final norm is an RMSNorm; the head is tied to the embedding or its own matrix.

Checkpoint names (``model.`` prefix); a Linear's weight is (out, in), so each is transposed
into the lesson's row convention ``X @ W`` (a stored format keeps the (out, in) rows as they are):

    embed_tokens.weight (vocab, d)               wte
    layers.{i}.input_layernorm.weight            ln1_gamma
    layers.{i}.self_attn.q_proj.weight / .bias   w_q^T / b_q   (k_proj, v_proj: n_kv_heads * d_k rows)
    layers.{i}.self_attn.o_proj.weight / .bias   w_o^T / b_o
    layers.{i}.post_attention_layernorm.weight   ln2_gamma
    layers.{i}.mlp.gate_proj / up_proj / down_proj.weight (/ .bias)   w_gate^T, w_ff1^T, w_ff2^T
    norm.weight                                  LN_f's gamma
    lm_head.weight (vocab, d)                    the head (without model.); absent or equal to
                                                 embed_tokens when tie_word_embeddings
    layers.{i}.self_attn.rotary_emb.inv_freq     older checkpoints' buffer: ignored
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields

import numpy as np

from ..config import BlockConfig, check_bool, check_int
from ..formats import QuantizedMatrix
from ..weights import BlockWeights
from .causal_lm import CausalLM, check_dtype
from .checkpoint import Checkpoint
from .stored import from_checkpoint, head_format, stored_block, stored_head

MODEL_TYPES = ("llama", "qwen2", "mistral")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
# Hugging Face's activation names -> BlockConfig's (the gate's)
HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                  "gelu": "gelu_erf", "relu": "relu"}
# the keys of config.json this module reads; the rest change nothing in the forward pass
# (token ids, dropout rates, torch_dtype, ...) or are refused by name in LlamaConfig
BLOCK_TENSORS = 9                   # the fewest tensors a block has: a bound before names are listed


def _where(where: str) -> str:
    return f"{where}: " if where else ""


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-family model's hyper-parameters under Hugging Face's config.json names."""
    model_type: str = "llama"           # "llama", "qwen2" or "mistral"
    vocab_size: int = 32000
    hidden_size: int = 4096             # d_model
    intermediate_size: int = 11008      # d_ff
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None      # None: num_attention_heads (no grouping)
    head_dim: int | None = None         # must be hidden_size // num_attention_heads when given
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None    # None, or linear scaling {"rope_type": "linear", "factor": f}
    attention_bias: bool = False        # llama: b_q, b_k, b_v, b_o (qwen2 always has b_q, b_k, b_v only)
    mlp_bias: bool = False              # llama: biases on gate, up and down
    tie_word_embeddings: bool = False
    sliding_window: int | None = None   # mistral, qwen2 (with use_sliding_window): sequences are
    use_sliding_window: bool = False    # held to the window, inside which attention is exact
    initializer_range: float = 0.02     # Llama.init's std
    extra: dict = field(default_factory=dict, compare=False, repr=False)   # unread keys, kept for to_hf

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            got = repr(self.model_type)[:100] if isinstance(self.model_type, str) else type(self.model_type).__name__
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {got}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        heads = self.num_attention_heads
        if self.hidden_size % heads:
            raise ValueError(f"hidden_size must be divisible by num_attention_heads, got {self.hidden_size} "
                             f"and {heads}")
        if self.head_dim is not None and check_int("head_dim", self.head_dim, 1) != self.hidden_size // heads:
            raise ValueError(f"head_dim={self.head_dim} is not supported: tblock's heads are hidden_size // "
                             f"num_attention_heads = {self.hidden_size // heads} wide")
        if self.num_key_value_heads is not None:
            kv = check_int("num_key_value_heads", self.num_key_value_heads, 1)
            if heads % kv:
                raise ValueError(f"num_key_value_heads must divide num_attention_heads, got {kv} and {heads}")
        if self.hidden_act not in HF_ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {tuple(HF_ACTIVATIONS)}, got {str(self.hidden_act)[:100]!r}")
        for name in ("rms_norm_eps", "rope_theta", "initializer_range"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r:.100}")
            if not 0.0 < float(value) < math.inf:
                raise ValueError(f"{name} must be positive and finite, got {value!r}")
            object.__setattr__(self, name, float(value))
        for name in ("attention_bias", "mlp_bias", "tie_word_embeddings", "use_sliding_window"):
            check_bool(name, getattr(self, name))
        if self.sliding_window is not None:
            check_int("sliding_window", self.sliding_window, 1)
        self.rope_scale                 # checks rope_scaling

    @property
    def rope_scale(self) -> float:
        """Linear rope scaling's factor (1 without scaling); other scalings are refused."""
        s = self.rope_scaling
        if s is None:
            return 1.0
        if not isinstance(s, dict):
            raise TypeError(f"rope_scaling must be a JSON object or null, got {type(s).__name__}")
        kind = s.get("rope_type", s.get("type"))
        if kind in ("default", None) and "factor" not in s:
            return 1.0
        if kind != "linear":
            raise ValueError(f"rope_scaling type {str(kind)[:100]!r} is not supported: tblock computes rotary "
                             f"positions unscaled or with linear scaling only")
        factor = s.get("factor")
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real) or not 0.0 < factor < math.inf:
            raise ValueError(f"rope_scaling's factor must be a positive number, got {factor!r:.100}")
        return float(factor)

    @property
    def kv_heads(self) -> int:
        return self.num_attention_heads if self.num_key_value_heads is None else self.num_key_value_heads

    @property
    def n_positions(self) -> int:
        """The longest sequence computed exactly: max_position_embeddings, or the sliding
        window where one is on and shorter (past it the window would drop keys, which
        tblock's attention does not)."""
        window = self.sliding_window if (self.model_type == "mistral" or self.use_sliding_window) else None
        return self.max_position_embeddings if window is None else min(window, self.max_position_embeddings)

    def block_config(self) -> BlockConfig:
        """The BlockConfig of every block of this model."""
        qkv_bias = "qkv" if self.model_type == "qwen2" else self.attention_bias
        return BlockConfig(
            d_model=self.hidden_size, n_heads=self.num_attention_heads, d_ff=self.intermediate_size, causal=True,
            norm="pre", norm_type="rmsnorm", ffn="gated", activation=HF_ACTIVATIONS[self.hidden_act],
            eps=self.rms_norm_eps, ffn_bias=self.mlp_bias, ln_affine=True, attn_bias=qkv_bias,
            positions="rotary", rope_theta=self.rope_theta, rope_scale=self.rope_scale,
            n_kv_heads=self.num_key_value_heads)

    @classmethod
    def from_hf(cls, hf: dict, where: str = "") -> "LlamaConfig":
        """From the dict of a Hugging Face config.json; ``where`` prefixes the errors."""
        if not isinstance(hf, dict):
            raise TypeError(f"{_where(where)}the config must be a JSON object, got {type(hf).__name__}")
        names = {f.name for f in fields(cls)} - {"extra"}
        kw = {k: hf[k] for k in names if hf.get(k) is not None}       # null: the default
        rope = hf.get("rope_parameters")       # transformers 5's one dict for rope_theta and rope_scaling
        if isinstance(rope, dict):
            kw.update(rope_scaling=rope, **({"rope_theta": rope["rope_theta"]} if "rope_theta" in rope else {}))
        elif rope is not None:
            raise TypeError(f"{_where(where)}rope_parameters must be a JSON object, got {type(rope).__name__}")
        if isinstance(hf.get("layer_types"), list) and "sliding_attention" in hf["layer_types"]:
            kw["use_sliding_window"] = True
        if hf.get("qkv_bias") or hf.get("pretraining_tp", 1) not in (1, None):
            raise ValueError(f"{_where(where)}pretraining_tp and qkv_bias are not supported")
        try:
            return cls(**kw, extra={k: v for k, v in hf.items() if k not in names})
        except (TypeError, ValueError) as e:
            raise type(e)(f"{_where(where)}{str(e):.500}") from None

    def to_hf(self) -> dict:
        """The config.json dict transformers' Llama/Qwen2/Mistral config reads."""
        out = {**self.extra, **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}}
        out["architectures"] = [ARCHITECTURES[self.model_type]]
        return out


# ----------------------------------------------------------------------------- checkpoint names

def hf_tensor_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the checkpoint must hold, by its Hugging Face name."""
    d, f, kv = cfg.hidden_size, cfg.intermediate_size, cfg.kv_heads * (cfg.hidden_size // cfg.num_attention_heads)
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, d), "model.norm.weight": (d,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, d)
    qkv_bias = cfg.model_type == "qwen2" or cfg.attention_bias
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
                       p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
                       p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                       p + "mlp.down_proj.weight": (d, f)})
        if qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (d,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if cfg.attention_bias and cfg.model_type != "qwen2":
            shapes[p + "self_attn.o_proj.bias"] = (d,)
        if cfg.mlp_bias:
            shapes.update({p + "mlp.gate_proj.bias": (f,), p + "mlp.up_proj.bias": (f,), p + "mlp.down_proj.bias": (d,)})
    return shapes


# block field -> (its Hugging Face module under layers.{i}., transposed)
BLOCK_NAMES = {"w_q": "self_attn.q_proj", "w_k": "self_attn.k_proj", "w_v": "self_attn.v_proj",
               "w_o": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_ff1": "mlp.up_proj",
               "w_ff2": "mlp.down_proj"}
BIAS_NAMES = {"b_q": "self_attn.q_proj", "b_k": "self_attn.k_proj", "b_v": "self_attn.v_proj",
              "b_o": "self_attn.o_proj", "b_gate": "mlp.gate_proj", "b_ff1": "mlp.up_proj", "b_ff2": "mlp.down_proj"}


def block_from_hf(t: dict, i: int) -> BlockWeights:
    """Block i's BlockWeights from tensors by Hugging Face name: float (out, in) arrays are
    transposed, stored ones (QuantizedMatrix, shape (in, out) already) taken as they are."""
    p = f"model.layers.{i}."
    w = {n: (lambda m: m if isinstance(m, QuantizedMatrix) else m.T)(t[p + hf + ".weight"])
         for n, hf in BLOCK_NAMES.items()}
    w.update({n: t[p + hf + ".bias"] for n, hf in BIAS_NAMES.items() if p + hf + ".bias" in t})
    return BlockWeights(**w, ln1_gamma=t[p + "input_layernorm.weight"], ln2_gamma=t[p + "post_attention_layernorm.weight"])


def read_llama(ckpt: Checkpoint, cfg: LlamaConfig, dtype) -> dict[str, np.ndarray]:
    """The checkpoint's tensors by Hugging Face name, checked against ``cfg`` (tblock's
    Checkpoint.read_all); a tied head stored anyway must equal the embedding."""
    names = {n: n for n in ckpt.tensors if not n.endswith("rotary_emb.inv_freq")}
    if cfg.num_hidden_layers * BLOCK_TENSORS > len(names):
        raise ValueError(f"{ckpt.root}: config.json has num_hidden_layers={cfg.num_hidden_layers}, but the "
                         f"checkpoint holds only {len(names)} tensors (at least {BLOCK_TENSORS} a block)")
    want = hf_tensor_shapes(cfg)
    tied_copy = cfg.tie_word_embeddings and "lm_head.weight" in names
    if tied_copy:
        want["lm_head.weight"] = want["model.embed_tokens.weight"]
    what = f"a {ARCHITECTURES[cfg.model_type]} with num_hidden_layers={cfg.num_hidden_layers}"
    t = ckpt.read_all(names, want, dtype, what)
    if tied_copy and not np.array_equal(t.pop("lm_head.weight"), t["model.embed_tokens.weight"]):
        raise ValueError(f"{ckpt.root}: tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' "
                         f"although config.json sets tie_word_embeddings")
    return t


# ----------------------------------------------------------------------------- the model


class Llama(CausalLM):
    """A Llama-family language model (Llama, Qwen2, Mistral, SmolLM) on tblock's blocks.
    Build it with ``from_pretrained``, ``from_tensors`` or ``from_config``."""

    def __init__(self, config: LlamaConfig, wte, blocks, norm_gamma, head=None, dtype=np.float32):
        """wte (vocab, d) (stored: its transpose, a QuantizedMatrix); blocks: one BlockWeights a
        block; norm_gamma (d,): the final RMSNorm's; head: the untied head like wte, or None."""
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        if isinstance(blocks, (list, tuple)) and len(blocks) != config.num_hidden_layers:
            raise ValueError(f"blocks must hold num_hidden_layers={config.num_hidden_layers} BlockWeights, "
                             f"got {len(blocks)}")
        if (head is None) != config.tie_word_embeddings:
            raise ValueError(f"head must be {'None' if config.tie_word_embeddings else 'given'} with "
                             f"tie_word_embeddings={config.tie_word_embeddings}")
        self.config = config
        super().__init__(config.block_config(), config.vocab_size, config.n_positions, (wte, None), blocks,
                         (norm_gamma, None), dtype, head)

    def __repr__(self):
        c = self.config
        return (f"Llama(model_type={c.model_type!r}, num_hidden_layers={c.num_hidden_layers}, "
                f"hidden_size={c.hidden_size}, heads={c.num_attention_heads}/{c.kv_heads}, "
                f"vocab_size={c.vocab_size}, dtype={self.dtype}, weights={self.weight_format}, "
                f"head_weights={self.head_format})")

    @classmethod
    def from_pretrained(cls, path, dtype=np.float32, *, weights: str = "fp32", head_weights: str | None = None,
                        dot: str = "fp32") -> "Llama":
        """Load a Hugging Face checkpoint directory (config.json and safetensors) of a
        LlamaForCausalLM, Qwen2ForCausalLM or MistralForCausalLM.  ``weights``,
        ``head_weights`` and ``dot`` as GPT2.from_pretrained's: the blocks' matrices and the
        head stored in a tblock format (head default: the blocks', int8 under int4)."""
        return from_checkpoint(cls, LlamaConfig, read_llama, path, dtype, weights, head_weights, dot)

    @classmethod
    def from_tensors(cls, cfg: LlamaConfig, t: dict, dtype=np.float32, *, weights: str = "fp32",
                     head_weights: str | None = None, dot: str = "fp32", where: str = "") -> "Llama":
        """The model from tensors by Hugging Face name (float (out, in) arrays, or stored
        QuantizedMatrix of shape (in, out): a GGUF file's blocks, kept as stored)."""
        head_weights = head_format(weights, head_weights, dot, dtype)
        blocks = [stored_block(block_from_hf(t, i), weights, dot, i, where) for i in range(cfg.num_hidden_layers)]
        wte = stored_head(t["model.embed_tokens.weight"], head_weights, dot, "embed_tokens", where)
        head = None if cfg.tie_word_embeddings else stored_head(t["lm_head.weight"], head_weights, dot,
                                                                "lm_head", where)
        return cls(cfg, wte, blocks, t["model.norm.weight"], head, dtype)

    @classmethod
    def init(cls, config: LlamaConfig, seed, dtype=np.float32) -> "Llama":
        """A random model as transformers initialises one: every matrix and the embedding
        N(0, initializer_range), biases 0, norms 1; drawn in float32 from default_rng(seed)."""
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        rng = np.random.default_rng(seed)
        std = np.float32(config.initializer_range)
        t = {n: (rng.standard_normal(s, dtype=np.float32) * std if n.endswith("weight") and len(s) == 2
                 else np.ones(s, np.float32) if n.endswith("norm.weight") else np.zeros(s, np.float32))
             for n, s in hf_tensor_shapes(config).items()}
        return cls.from_tensors(config, t, check_dtype(dtype))

    @classmethod
    def from_config(cls, config: LlamaConfig | None = None, *, seed=0, dtype=np.float32, **kw) -> "Llama":
        """A random model (``init``) from a LlamaConfig or its keywords."""
        if config is None:
            config = LlamaConfig(**kw)
        elif kw:
            raise TypeError(f"give a LlamaConfig or its keywords, not both (got config and {sorted(kw)})")
        return cls.init(config, seed, dtype)
