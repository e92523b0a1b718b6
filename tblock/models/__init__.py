"""Language models on tblock's blocks.

    checkpoint  a Hugging Face checkpoint folder: config.json, safetensors files and shards,
                every path and header checked before anything is read
    causal_lm   CausalLM: embeddings, a Stack of causal blocks, the tied head, KV caches,
                generate and stream; kernels only through the backend registry's hooks
    gpt2        GPT-2's config, its checkpoints' names, and GPT2 (a CausalLM)
    llama       the Llama family (Llama, Qwen2, Mistral): LlamaConfig and Llama (a CausalLM)
    gguf        llama.cpp's GGUF files: a reader and the tensors under Hugging Face's names
    auto        load(path): the class a checkpoint's config.json (or GGUF file) names
    sampling    the next token: temperature, top-k, top-p and the seeded draw
    accuracy    a model against a reference on a token stream: perplexity, KL, top-1
"""

from .causal_lm import CausalLM
from .gpt2 import GPT2, GPT2Config
from .llama import Llama, LlamaConfig
from .sampling import draw, next_token_probs

__all__ = ["CausalLM", "GPT2", "GPT2Config", "Llama", "LlamaConfig", "draw", "next_token_probs"]
