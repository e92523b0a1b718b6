"""``tblock.load(path)``: the model class a checkpoint needs, picked from its config.json.

    model = tblock.load("path/to/gpt2")               # GPT2
    model = tblock.load("path/to/Qwen2.5-0.5B")       # Llama (qwen2)
    model = tblock.load("model.gguf")                 # a GGUF file: its general.architecture
"""

from __future__ import annotations

import os
from pathlib import Path

from .checkpoint import Checkpoint
from .gpt2 import GPT2
from .llama import MODEL_TYPES, Llama

# config.json's model_type -> the class that loads it
CLASSES = {"gpt2": GPT2, **{t: Llama for t in MODEL_TYPES}}


def load(path, dtype="float32", **kw):
    """The model of a Hugging Face checkpoint directory (its config.json's model_type:
    one of CLASSES) or of a GGUF file; keywords as the class's from_pretrained."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    if Path(path).is_file():
        from .gguf_model import from_gguf
        return from_gguf(path, dtype, **kw)
    ckpt = Checkpoint(path)
    model_type = ckpt.config().get("model_type")
    cls = CLASSES.get(model_type) if isinstance(model_type, str) else None
    if cls is None:
        got = repr(model_type)[:100] if isinstance(model_type, str) else f"a {type(model_type).__name__}"
        raise ValueError(f"{ckpt.root / 'config.json'}: model_type must be one of {tuple(CLASSES)}, got {got}")
    return cls.from_pretrained(path, dtype, **kw)
