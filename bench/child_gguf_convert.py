#!/usr/bin/env python3
"""llama.cpp's convert_hf_to_gguf.py run on a checkpoint whose tokenizer it does not know
(bench_engines.py's child).

    python bench/child_gguf_convert.py LLAMA_CPP_DIR CHECKPOINT --outtype f32 --outfile x.gguf

bench_engines.py's random models (GPT-2, Llama and Qwen2 shapes) carry a byte-level BPE
tokenizer written by engine_models.py, with made-up merges (the real vocabularies cannot be
had offline).  The converter names a BPE tokenizer's pre-tokenizer by hashing how it splits a
test string, and refuses a hash it does not list; the split here is GPT-2's byte-level one,
so an unknown hash is named "gpt-2", which is the pre-tokenizer llama.cpp then applies.
Everything else is the converter's own code, from the llama.cpp tree given (with its own
gguf-py, as the converter run directly would use).  The weights are untouched by this:
llama-bench feeds token ids.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    tree = Path(sys.argv[1]).resolve()
    script = tree / "convert_hf_to_gguf.py"
    if not script.is_file():
        print(f"{script} is not there: the first argument must be a llama.cpp source tree", file=sys.stderr)
        return 2
    # the tree's own modules and gguf-py ahead of any installed gguf, as the script orders them
    sys.path[:0] = [str(tree), str(tree / "gguf-py")]
    from conversion import base

    known = base.TextModel.get_vocab_base_pre

    def pre_tokenizer(self, tokenizer) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:         # a hash the converter does not list: ours
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = pre_tokenizer
    import convert_hf_to_gguf
    sys.argv = [str(script), *sys.argv[2:]]
    convert_hf_to_gguf.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
