"""The models bench_engines.py measures: their shapes, and the random checkpoint each engine
converts (transformers' initialisation, saved with save_pretrained, with a tokenizer the
converters accept).

    gpt2            GPT-2 small (12 layers, d 768, 12 heads, vocab 50257); or L:D:H:V, GPT-2 at another shape
    smollm2-135m    SmolLM2-135M's shape: LlamaForCausalLM, d 576, 30 layers, 9 heads, 3 KV heads,
                    d_ff 1536, vocab 49152, tied, rope_theta 1e5, rms_norm_eps 1e-5
    qwen2.5-0.5b    Qwen2.5-0.5B's shape: Qwen2ForCausalLM, d 896, 24 layers, 14 heads, 2 KV heads,
                    d_ff 4864, vocab 151936, tied, rope_theta 1e6, rms_norm_eps 1e-6 (Q/K/V biases)

and, for smoke tests of the flow only (not listed in --help), tiny-llama and tiny-qwen2:
2 layers, d 64, 4 heads, 2 KV heads, d_ff 128, vocab 512.

The real checkpoints' hyper-parameters (as their config.json files give them); the weights
are random, seeded (torch.manual_seed), so every engine reads the same numbers.  Nothing is
measured here.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from engine_util import fresh

# GPT-2 small's shape (GPT2Config keywords), as common.SMALL
GPT2_SMALL = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)


@dataclass(frozen=True)
class Shape:
    """One model of the benchmark: its name, its transformers class and config keywords."""
    name: str                   # what --model takes
    family: str                 # "gpt2", "llama" or "qwen2": transformers' model_type
    hf: dict = field(hash=False)            # the transformers config's keywords
    label: str = ""             # how the run's header names it

    @property
    def is_gpt2(self) -> bool:
        return self.family == "gpt2"

    def _get(self, gpt2_key: str, llama_key: str) -> int:
        return self.hf[gpt2_key if self.is_gpt2 else llama_key]

    @property
    def vocab_size(self) -> int:
        return self.hf["vocab_size"]

    @property
    def n_layer(self) -> int:
        return self._get("n_layer", "num_hidden_layers")

    @property
    def d_model(self) -> int:
        return self._get("n_embd", "hidden_size")

    @property
    def n_heads(self) -> int:
        return self._get("n_head", "num_attention_heads")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.is_gpt2 else self.hf.get("num_key_value_heads") or self.n_heads

    @property
    def n_positions(self) -> int:
        return self._get("n_positions", "max_position_embeddings")

    @property
    def d_kv(self) -> int:
        """Columns of K (and of V) per token: kv_heads * d_k."""
        return self.kv_heads * (self.d_model // self.n_heads)

    def kv_bytes(self, tokens: int, value_bytes: float) -> int:
        """Bytes of keys and values a decode step reads with ``tokens`` in every block's cache,
        at ``value_bytes`` per stored value (4 float32, 2 fp16/bf16)."""
        return int(self.n_layer * tokens * 2 * self.d_kv * value_bytes)

    @property
    def key(self) -> str:
        """The checkpoint's folder name in the cache: the shape, not the name, so a GPT-2
        given as L:D:H:V and by name share one."""
        if self.is_gpt2:
            return "gpt2-L{n_layer}-d{n_embd}-h{n_head}-v{vocab_size}".format(**self.hf)
        return (f"{self.family}-L{self.n_layer}-d{self.d_model}-h{self.n_heads}-kv{self.kv_heads}"
                f"-ff{self.hf['intermediate_size']}-v{self.vocab_size}")

    def record(self) -> dict:
        """The run's JSON record of the model."""
        return {"name": self.name, "family": self.family, "config": dict(self.hf)}

    def __str__(self) -> str:
        return self.label or self.name


def _llama(d, layers, heads, kv, d_ff, vocab, **kw) -> dict:
    return dict(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                intermediate_size=d_ff, vocab_size=vocab, hidden_act="silu", tie_word_embeddings=True, **kw)


MODELS = {
    "gpt2": Shape("gpt2", "gpt2", GPT2_SMALL, "GPT-2 small shape"),
    "smollm2-135m": Shape("smollm2-135m", "llama", _llama(576, 30, 9, 3, 1536, 49152, max_position_embeddings=8192,
                                                          rope_theta=100000.0, rms_norm_eps=1e-5,
                                                          initializer_range=0.041666666666666664),
                          "SmolLM2-135M shape (LlamaForCausalLM: d 576, 30 layers, 9/3 heads, d_ff 1536, "
                          "vocab 49152, tied)"),
    "qwen2.5-0.5b": Shape("qwen2.5-0.5b", "qwen2", _llama(896, 24, 14, 2, 4864, 151936,
                                                          max_position_embeddings=32768, rope_theta=1000000.0,
                                                          rms_norm_eps=1e-6, use_sliding_window=False,
                                                          sliding_window=32768, initializer_range=0.02),
                          "Qwen2.5-0.5B shape (Qwen2ForCausalLM: d 896, 24 layers, 14/2 heads, d_ff 4864, "
                          "vocab 151936, tied)"),
}
# the flow's smoke tests: seconds to convert and run (kept out of --help)
TINY = {
    "tiny-llama": Shape("tiny-llama", "llama", _llama(64, 2, 4, 2, 128, 512, max_position_embeddings=1024,
                                                      rope_theta=10000.0, rms_norm_eps=1e-5),
                        "tiny Llama (smoke test)"),
    "tiny-qwen2": Shape("tiny-qwen2", "qwen2", _llama(64, 2, 4, 2, 128, 512, max_position_embeddings=1024,
                                                      rope_theta=10000.0, rms_norm_eps=1e-6,
                                                      use_sliding_window=False), "tiny Qwen2 (smoke test)"),
}


def parse_model(text: str) -> Shape:
    """An argparse type: a name of MODELS (or TINY), or n_layer:n_embd:n_head:vocab_size, a
    GPT-2 of that shape (n_positions stays 1024)."""
    if text in MODELS or text in TINY:
        return {**MODELS, **TINY}[text]
    try:
        n_layer, n_embd, n_head, vocab = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(MODELS)} or n_layer:n_embd:n_head:vocab_size, "
                                         f"got {text!r}") from None
    hf = dict(GPT2_SMALL, n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab)
    return MODELS["gpt2"] if hf == GPT2_SMALL else Shape(text, "gpt2", hf, f"GPT-2 shape {text}")


# ---------------------------------------------------------------------------------------
# the checkpoint: transformers' random model with a tokenizer the converters accept

EOT = "<|endoftext|>"


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer of vocab_size ids (GPT-2's pre-tokenizer and decoder; real
    merges cannot be had offline): the 256 byte symbols, then made-up merges of a token and a
    byte symbol (every pair of bytes first, then longer tokens), then <|endoftext|> as the
    last id, as in GPT-2.  Converters need one; the measurements feed token ids."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    symbols = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)
    vocab = {s: i for i, s in enumerate(symbols)}
    tokens, merges = list(symbols), []
    for a in tokens:                   # grows as it goes: pairs of bytes, then a pair and a byte, ...
        if len(vocab) == vocab_size - 1:
            break
        for b in symbols:
            if len(vocab) == vocab_size - 1:
                break
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                tokens.append(a + b)
                merges.append((a, b))
    vocab[EOT] = vocab_size - 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT,
                                         unk_token=EOT).save_pretrained(folder)


def _model(shape: Shape):
    """transformers' randomly initialised model of ``shape`` (torch's seed set by the caller)."""
    import transformers
    eot = shape.vocab_size - 1
    ids = dict(bos_token_id=eot, eos_token_id=eot)
    if shape.is_gpt2:
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape.hf, **ids))
    if shape.family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape.hf, **ids))
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape.hf, **ids))


def checkpoint(cache: Path, shape: Shape, seed: int, log=lambda msg: print(msg, file=sys.stderr)) -> Path:
    """The model's folder (config.json, model.safetensors, tokenizer), made once per shape and seed."""
    folder = cache / "models" / f"{shape.key}-seed{seed}" / "hf"
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    log(f"writing the random {shape} checkpoint {folder}")
    tmp = fresh(folder)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    _model(shape).float().save_pretrained(tmp)
    config = json.loads((tmp / "config.json").read_text())
    if shape.is_gpt2:
        # llama.cpp's GPT-2 converter reads n_ctx, which transformers 5 no longer writes
        config["n_ctx"] = shape.n_positions
    elif "rope_theta" in shape.hf:
        config["rope_theta"] = shape.hf["rope_theta"]   # where transformers 4 (CTranslate2's, optimum-intel's) reads it
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(tmp, shape.vocab_size)
    tmp.rename(folder)
    return folder
