"""GGUF files written by llama.cpp's own tools, read by tblock (``make test-gguf``).

Random reduced LlamaForCausalLM / Qwen2ForCausalLM / GPT2LMHeadModel checkpoints (norm gains
and biases moved off 1 and 0, grouped-query 2:1 and multi-query, tied and untied heads) are
saved by transformers and converted by llama.cpp's convert_hf_to_gguf.py (through
bench/child_gguf_convert.py, which only names the made-up tokenizer's pre-tokenizer) to F32,
BF16 and Q8_0, and re-quantized by llama.cpp's llama-quantize (ggml's C quantizers) to Q8_0
and Q4_0.  Then:

- the F32 file's tensors are the checkpoint's, bit for bit (Q and K rows un-permuted), and
  its config the checkpoint's;
- every BF16 / Q8_0 / Q4_0 matrix is byte for byte tblock.formats' quantization of the
  checkpoint's float32 matrix (tblock.quantize's bytes are llama.cpp's);
- the Llama-family model built from each file gives the logits of ``tblock.load`` of the
  safetensors folder in the same weight format, exactly, and the F32 one is within 1e-5
  relative of transformers' float32.

The llama.cpp tree is llama-cpp-python's source package unpacked under
$TBLOCK_ENGINES_CACHE (default ~/.cache/tblock-engines, where bench/bench_engines.py puts it)
or $TBLOCK_LLAMA_CPP; llama-quantize is that cache's build (bench_engines.py builds it) or
$TBLOCK_LLAMA_QUANTIZE.  Without them the tests skip, saying which is missing.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import tblock
from conftest import perturb_llama
from tblock.formats import QuantizedMatrix, quantize_matrix
from tblock.models.checkpoint import Checkpoint
from tblock.models.gguf import read_gguf_model
from tblock.models.llama import Llama

pytestmark = pytest.mark.interop

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("TBLOCK_ENGINES_CACHE", Path.home() / ".cache" / "tblock-engines"))
VOCAB = 300                 # the byte-level tokenizer needs 256 byte symbols and an end of text
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
CASES = {
    "llama-gqa2-untied-biases": ("LlamaConfig", "LlamaForCausalLM",
                                 dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True,
                                      tie_word_embeddings=False, rope_theta=500.0)),
    "llama-mqa-tied": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "qwen2-gqa2-tied": ("Qwen2Config", "Qwen2ForCausalLM",
                        dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6)),
    "qwen2-mqa-untied": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=1, tie_word_embeddings=False)),
}
CONVERTED = {"f32": "fp32", "bf16": "bf16", "q8_0": "int8"}      # the converter's --outtype -> tblock's format
QUANTIZED = {"Q8_0": "int8", "Q4_0": "int4"}                      # llama-quantize's type -> tblock's format
IDS = np.array([5, 17, 299, 0, 42, 123, 7, 256, 31, 64], np.int64)
TOL = 1e-5


def llama_cpp_tree() -> Path:
    env = os.environ.get("TBLOCK_LLAMA_CPP")
    trees = [Path(env)] if env else sorted(CACHE.glob("src/llama_cpp_python-*/vendor/llama.cpp"))
    trees = [t for t in trees if (t / "convert_hf_to_gguf.py").is_file()]
    if not trees:
        pytest.skip(f"no llama.cpp source tree with convert_hf_to_gguf.py in {CACHE / 'src'} (make test-gguf "
                    f"unpacks llama-cpp-python's source package there) and TBLOCK_LLAMA_CPP unset")
    pytest.importorskip("sentencepiece", reason="llama.cpp's converter imports sentencepiece for Llama "
                                                "vocabularies (make test-gguf installs it)")
    return trees[-1]


def llama_quantize() -> Path:
    env = os.environ.get("TBLOCK_LLAMA_QUANTIZE")
    tools = [Path(env)] if env else sorted(CACHE.glob("build/llama.cpp-*/bin/llama-quantize"))
    if not tools or not tools[-1].is_file():
        pytest.skip(f"no llama-quantize in {CACHE / 'build'} (bench/bench_engines.py builds llama.cpp there) "
                    f"and TBLOCK_LLAMA_QUANTIZE unset")
    return tools[-1]


def write_tokenizer(folder: Path) -> None:
    """A byte-level BPE tokenizer of VOCAB ids the converter accepts: the 256 byte symbols,
    made-up merges of pairs, and <|endoftext|> last (the weights are what is tested)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    symbols = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)
    vocab = {s: i for i, s in enumerate(symbols)}
    pairs = [(a, b) for a in symbols[:8] for b in symbols[:8]][:VOCAB - 1 - len(vocab)]
    for a, b in pairs:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = VOCAB - 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    eot = "<|endoftext|>"
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot).save_pretrained(folder)


def hf_model(case: str, seed: int = 0):
    config_cls, model_cls, extra = CASES[case]
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**{**SHAPE, **extra})).eval()
    return perturb_llama(model)


def convert(tree: Path, ckpt: Path, outtype: str, out: Path) -> Path:
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "child_gguf_convert.py"), str(tree), str(ckpt),
                        "--outtype", outtype, "--outfile", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return out


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(case name, transformers model, its safetensors folder, {outtype: GGUF path})."""
    tree = llama_cpp_tree()
    peer = hf_model(request.param)
    root = tmp_path_factory.mktemp(request.param)
    ckpt = root / "hf"
    peer.save_pretrained(ckpt, safe_serialization=True)
    write_tokenizer(ckpt)
    files = {t: convert(tree, ckpt, t, root / f"{t}.gguf") for t in CONVERTED}
    return request.param, peer, ckpt, files


def checkpoint_tensors(ckpt: Path) -> dict:
    c = Checkpoint(ckpt)
    return {n: c.read(n, np.float32) for n in c.tensors}


def matrix_of(name: str, a: np.ndarray) -> np.ndarray:
    """The (in, out) matrix X is multiplied by, of a Hugging Face tensor (a Linear's
    weight^T, an embedding^T as tblock stores a head)."""
    return a.T


def check_same_tensors(hf_t: dict, t: dict, fmt: str) -> None:
    assert set(t) == set(hf_t)
    for name, want in hf_t.items():
        got = t[name]
        if isinstance(got, QuantizedMatrix):
            assert got.format == fmt and want.ndim == 2, name
            assert np.array_equal(got.data, quantize_matrix(matrix_of(name, want), fmt).data), name
        else:
            assert want.ndim == 1 or fmt == "fp32", (name, "left as float")
            assert got.dtype == np.float32 and np.array_equal(got, want), name


def gguf_model(path: Path, fmt: str) -> Llama:
    """tblock.load of the file, which keeps its stored formats: they must be ``fmt``."""
    model = tblock.load(path)
    assert isinstance(model, Llama) and (model.weight_format, model.head_format) == (fmt, fmt)
    return model


@pytest.mark.parametrize("outtype", list(CONVERTED))
def test_the_converters_files(case, outtype):
    name, peer, ckpt, files = case
    fmt = CONVERTED[outtype]
    hf, t = read_gguf_model(files[outtype])
    want = json.loads((ckpt / "config.json").read_text())
    for key in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
                "tie_word_embeddings", "architectures"):
        assert hf[key] == want[key], key
    rope = want.get("rope_parameters") or {"rope_theta": want.get("rope_theta")}
    assert hf["rope_theta"] == rope["rope_theta"]
    check_same_tensors(checkpoint_tensors(ckpt), t, fmt)
    ours = tblock.load(ckpt, weights=fmt, head_weights=fmt)
    got = gguf_model(files[outtype], fmt)(IDS, backend="numpy")
    assert np.array_equal(got, ours(IDS, backend="numpy"))
    if fmt == "fp32":
        with torch.no_grad():
            ref = peer(torch.from_numpy(IDS)[None]).logits[0].numpy()
        assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) <= TOL


@pytest.mark.parametrize("qtype", list(QUANTIZED))
def test_ggml_quantizers_bytes(case, qtype, tmp_path):
    """llama-quantize --pure (ggml's C reference quantizers, every matrix in qtype) from the F32 file."""
    tool = llama_quantize()
    _, _, ckpt, files = case
    out = tmp_path / f"{qtype}.gguf"
    p = subprocess.run([str(tool), "--pure", str(files["f32"]), str(out), qtype, "1"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    fmt = QUANTIZED[qtype]
    _, t = read_gguf_model(out)
    check_same_tensors(checkpoint_tensors(ckpt), t, fmt)
    ours = tblock.load(ckpt, weights=fmt, head_weights=fmt)
    assert np.array_equal(gguf_model(out, fmt)(IDS, backend="numpy"), ours(IDS, backend="numpy"))


def test_gpt2_converted(tmp_path):
    """GPT-2: the converter transposes Conv1D weights to rows; they come back as checkpointed."""
    tree = llama_cpp_tree()
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                                  bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    ckpt = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(cfg).save_pretrained(ckpt, safe_serialization=True)
    config = json.loads((ckpt / "config.json").read_text())
    config["n_ctx"] = 32                # the converter reads n_ctx, which transformers 5 does not write
    (ckpt / "config.json").write_text(json.dumps(config))
    write_tokenizer(ckpt)
    for outtype, fmt in (("f32", "fp32"), ("q8_0", "int8")):
        hf, t = read_gguf_model(convert(tree, ckpt, outtype, tmp_path / f"{outtype}.gguf"))
        assert {k: hf[k] for k in ("n_embd", "n_layer", "n_head", "n_positions", "vocab_size")} == \
            {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": VOCAB}
        assert hf["tie_word_embeddings"] and hf["layer_norm_epsilon"] == config["layer_norm_epsilon"]
        hf_t = {n.removeprefix("transformer."): a for n, a in checkpoint_tensors(ckpt).items()}
        assert set(t) == set(hf_t)
        for name, want in hf_t.items():
            got = t[name]
            if isinstance(got, QuantizedMatrix):     # Conv1D weights are (in, out) already; embeddings^T
                W = want if name.startswith("h.") else want.T
                assert np.array_equal(got.data, quantize_matrix(W, fmt).data), name
            else:
                assert np.array_equal(got, want), name
        ours = tblock.load(tmp_path / f"{outtype}.gguf")          # GPT2, the file's formats kept
        want = tblock.load(ckpt, weights=fmt, head_weights=fmt)
        assert isinstance(ours, tblock.GPT2) and ours.weight_format == fmt
        assert np.array_equal(ours(IDS, backend="numpy"), want(IDS, backend="numpy"))
