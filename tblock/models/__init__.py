"""Language models on tblock's blocks.

    checkpoint  a Hugging Face checkpoint folder: config.json, safetensors files and shards,
                every path and header checked before anything is read
    causal_lm   CausalLM: embeddings, a Stack of causal blocks, the tied head, KV caches,
                generate and stream; kernels only through the backend registry's hooks
    gpt2        GPT-2's config, its checkpoints' names, and GPT2 (a CausalLM)
    sampling    the next token: temperature, top-k, top-p and the seeded draw
    accuracy    a model against a reference on a token stream: perplexity, KL, top-1
"""

from .causal_lm import CausalLM
from .gpt2 import GPT2, GPT2Config
from .sampling import draw, next_token_probs

__all__ = ["CausalLM", "GPT2", "GPT2Config", "draw", "next_token_probs"]
