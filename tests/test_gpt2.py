"""tblock.GPT2 against GPT-2's equations, on small checkpoints written here.

The checkpoints are written with safetensors' NumPy API under Hugging Face's names (the
bfloat16 one byte by byte, as the format's spec lays it out), and the expected logits
come from ``reference_logits``: GPT-2's forward pass written out in float64 NumPy in this
file, heads by reshape (not tblock's per-head loop), on the very tensors that were saved.
The real transformers model is the peer in tests/interop/ (``make test-interop``).
"""

import json
import math
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

import tblock
from tblock import GPT2
from tblock.formats import quantize_matrix
from tblock.models.gpt2 import GPT2Config

from conftest import proc, rel_err

pytestmark = pytest.mark.isa

SMALL = dict(vocab_size=101, n_positions=24, n_embd=32, n_layer=2, n_head=4)


# ----------------------------------------------------------------------------- checkpoints


def random_tensors(rng, vocab_size, n_positions, n_embd, n_layer, d_ff=None):
    """A GPT-2's tensors under Hugging Face's names, float32, with weights of the scale that
    makes every part matter (projections of O(1), biases and LayerNorm affines far from 0 and 1)."""
    d = n_embd
    f = 4 * d if d_ff is None else d_ff

    def normal(*shape, std=1.0, mean=0.0):
        return (mean + std * rng.standard_normal(shape)).astype(np.float32)

    t = {"transformer.wte.weight": normal(vocab_size, d, std=0.5),
         "transformer.wpe.weight": normal(n_positions, d, std=0.3),
         "transformer.ln_f.weight": normal(d, std=0.2, mean=1.0),
         "transformer.ln_f.bias": normal(d, std=0.2)}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        t.update({
            p + "ln_1.weight": normal(d, std=0.2, mean=1.0), p + "ln_1.bias": normal(d, std=0.2),
            p + "attn.c_attn.weight": normal(d, 3 * d, std=d ** -0.5), p + "attn.c_attn.bias": normal(3 * d, std=0.3),
            p + "attn.c_proj.weight": normal(d, d, std=d ** -0.5), p + "attn.c_proj.bias": normal(d, std=0.3),
            p + "ln_2.weight": normal(d, std=0.2, mean=1.0), p + "ln_2.bias": normal(d, std=0.2),
            p + "mlp.c_fc.weight": normal(d, f, std=d ** -0.5), p + "mlp.c_fc.bias": normal(f, std=0.3),
            p + "mlp.c_proj.weight": normal(f, d, std=f ** -0.5), p + "mlp.c_proj.bias": normal(d, std=0.3),
        })
    return t


def hf_config(**kw):
    """config.json as transformers writes it for a GPT-2 (the keys that matter and a few that do not)."""
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "activation_function": "gelu_new",
           "layer_norm_epsilon": 1e-5, "n_inner": None, "scale_attn_weights": True,
           "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
           "tie_word_embeddings": True, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
           "bos_token_id": 50256, "eos_token_id": 50256, "initializer_range": 0.02, "n_ctx": kw.get("n_positions")}
    cfg.update(kw)
    return cfg


def to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns, rounded to nearest even (as torch rounds)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def from_bf16_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def save_bf16(path, tensors):
    """A safetensors file of BF16 tensors written by hand: an 8-byte little-endian header
    length, the JSON header (padded with spaces to 8 bytes), then the data in header order."""
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        raw = to_bf16_bits(a).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def write_checkpoint(root, tensors, config, dtype="float32", shards=1):
    """config.json and the tensors in ``dtype`` (float32, float16 or bfloat16), in one
    model.safetensors or in ``shards`` files with model.safetensors.index.json.  Returns the
    tensors as the file holds them, in float64 (what a loader must reproduce)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    names = list(tensors)
    parts = [names[i::shards] for i in range(shards)]
    files = ["model.safetensors"] if shards == 1 else [f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
                                                       for i in range(shards)]
    for file, part in zip(files, parts):
        chunk = {n: tensors[n] for n in part}
        if dtype == "bfloat16":
            save_bf16(root / file, chunk)
        else:
            save_file({n: a.astype(dtype) if a.dtype.kind == "f" else a for n, a in chunk.items()}, str(root / file), metadata={"format": "pt"})
    if shards > 1:
        index = {"metadata": {}, "weight_map": {n: file for file, part in zip(files, parts) for n in part}}
        (root / "model.safetensors.index.json").write_text(json.dumps(index))
    if dtype == "bfloat16":
        return {n: from_bf16_bits(to_bf16_bits(a)).astype(np.float64) for n, a in tensors.items()}
    return {n: a.astype(dtype).astype(np.float64) for n, a in tensors.items()}


# ----------------------------------------------------------------------------- the reference


def layer_norm(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


ACTS = {"gelu_new": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
        "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
        "relu": lambda x: np.maximum(x, 0)}


def reference_states(t, ids, n_layer, n_head, eps=1e-5, act="gelu_new"):
    """GPT-2 in float64 on the tensors ``t`` (HF names, with the transformer. prefix):
    the residual stream h_0..h_N for ids (T,), (N + 1, T, d), and the logits (T, vocab)."""
    g = lambda name: t["transformer." + name]       # noqa: E731
    T = len(ids)
    h = g("wte.weight")[ids] + g("wpe.weight")[:T]
    d = h.shape[1]
    dk = d // n_head
    causal = np.triu(np.ones((T, T), bool), k=1)   # True above the diagonal: the future
    states = [h]
    for i in range(n_layer):
        p = f"h.{i}."
        x = layer_norm(h, g(p + "ln_1.weight"), g(p + "ln_1.bias"), eps)
        qkv = x @ g(p + "attn.c_attn.weight") + g(p + "attn.c_attn.bias")            # (T, 3d)
        q, k, v = (qkv[:, j * d:(j + 1) * d].reshape(T, n_head, dk).transpose(1, 0, 2) for j in range(3))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(dk)                                # (heads, T, T)
        s = np.where(causal, -np.inf, s)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = (a @ v).transpose(1, 0, 2).reshape(T, d)                                 # heads side by side
        h = h + o @ g(p + "attn.c_proj.weight") + g(p + "attn.c_proj.bias")
        x = layer_norm(h, g(p + "ln_2.weight"), g(p + "ln_2.bias"), eps)
        u = ACTS[act](x @ g(p + "mlp.c_fc.weight") + g(p + "mlp.c_fc.bias"))
        h = h + u @ g(p + "mlp.c_proj.weight") + g(p + "mlp.c_proj.bias")
        states.append(h)
    logits = layer_norm(h, g("ln_f.weight"), g("ln_f.bias"), eps) @ g("wte.weight").T
    return np.stack(states), logits


@pytest.fixture
def ckpt(tmp_path, rng):
    """A float32 checkpoint of the SMALL shape: (its directory, its tensors in float64)."""
    tensors = random_tensors(rng, 101, 24, 32, 2)
    exact = write_checkpoint(tmp_path / "ckpt", tensors, hf_config(**SMALL))
    return tmp_path / "ckpt", tensors, exact


# ----------------------------------------------------------------------------- parity


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 1e-5), ("bfloat16", 1e-5)])
def test_logits_and_hidden_states_match_the_reference(tmp_path, rng, backend, dtype, tol):
    tensors = random_tensors(rng, 101, 24, 32, 2)
    exact = write_checkpoint(tmp_path / dtype, tensors, hf_config(**SMALL), dtype=dtype)
    model = GPT2.from_pretrained(tmp_path / dtype)
    for T in (1, 5, 24):
        ids = rng.integers(0, 101, T)
        states, logits = reference_states(exact, ids, 2, 4)
        got = model(ids, backend=backend)
        assert got.shape == (T, 101) and got.dtype == np.float32
        assert rel_err(got, logits) <= tol, (dtype, T)
        hs = model.hidden_states(ids, backend=backend)
        assert hs.shape == (3, T, 32)
        assert rel_err(hs, states) <= tol, (dtype, T)


def test_float16_and_bfloat16_are_read_exactly(tmp_path, rng):
    """Both widen to float32 without rounding: the loaded weights are the stored values."""
    tensors = random_tensors(rng, 101, 24, 32, 2)
    for dtype in ("float16", "bfloat16"):
        exact = write_checkpoint(tmp_path / dtype, tensors, hf_config(**SMALL), dtype=dtype)
        model = GPT2.from_pretrained(tmp_path / dtype)
        assert np.array_equal(model.wte, exact["transformer.wte.weight"])
        w_qkv = exact["transformer.h.1.attn.c_attn.weight"]
        assert np.array_equal(model.blocks[1].w_k, w_qkv[:, 32:64])
        assert np.array_equal(model.blocks[1].b_v, exact["transformer.h.1.attn.c_attn.bias"][64:])
        # the bf16 rounding really happened: this is not the float32 checkpoint again
        assert not np.array_equal(model.wte, tensors["transformer.wte.weight"])


def test_float64_model_matches_the_reference_closely(ckpt, rng):
    root, _, exact = ckpt
    model = GPT2.from_pretrained(root, dtype=np.float64)
    ids = rng.integers(0, 101, 17)
    _, logits = reference_states(exact, ids, 2, 4)
    got = model(ids)
    assert got.dtype == np.float64
    assert rel_err(got, logits) <= 1e-12


def test_batched_ids_give_each_sequence_its_own_logits(ckpt, rng, backend):
    model = GPT2.from_pretrained(ckpt[0])
    ids = rng.integers(0, 101, (3, 9))
    batched = model(ids, backend=backend)
    assert batched.shape == (3, 9, 101)
    for b in range(3):
        # the batched and the single call may split the work differently (serial/parallel
        # builds), so they agree to rounding, not to the bit
        assert rel_err(batched[b], model(ids[b], backend=backend)) <= 1e-6
        _, logits = reference_states(ckpt[2], ids[b], 2, 4)
        assert rel_err(batched[b], logits) <= 1e-5
    hs = model.hidden_states(ids, backend=backend)
    assert hs.shape == (3, 3, 9, 32)
    assert rel_err(hs[:, 2], model.hidden_states(ids[2], backend=backend)) <= 1e-6


def test_the_parallel_head_on_a_longer_batch(tmp_path, rng):
    """Rows past one head task (HEAD_ROWS) and more column panels than one group: the
    parallel kernel's task split, against the reference."""
    from tblock.kernels.tiles import HEAD_PANELS, HEAD_ROWS
    from tblock.kernels.gemm import panel_width
    vocab = panel_width(np.float32) * HEAD_PANELS + 37          # two panel groups, the last ragged
    cfg = dict(SMALL, vocab_size=vocab, n_positions=300, n_layer=1)
    tensors = random_tensors(rng, vocab, 300, 32, 1)
    exact = write_checkpoint(tmp_path / "long", tensors, hf_config(**cfg))
    model = GPT2.from_pretrained(tmp_path / "long")
    ids = rng.integers(0, vocab, (2, 300))
    assert 2 * 300 > HEAD_ROWS
    with tblock.threads(min(2, tblock._runtime.pool_size())):
        got = model(ids)
    for b in range(2):
        _, logits = reference_states(exact, ids[b], 1, 4)
        assert rel_err(got[b], logits) <= 1e-5


def test_n_inner_and_other_activations(tmp_path, rng):
    """n_inner sets d_ff; gelu (erf) and relu map onto the block's other activations."""
    for act in ("gelu", "relu", "gelu_pytorch_tanh"):
        tensors = random_tensors(rng, 101, 24, 32, 2, d_ff=48)
        root = tmp_path / act
        exact = write_checkpoint(root, tensors, hf_config(**SMALL, n_inner=48, activation_function=act))
        model = GPT2.from_pretrained(root)
        ids = rng.integers(0, 101, 11)
        _, logits = reference_states(exact, ids, 2, 4, act="gelu_new" if act == "gelu_pytorch_tanh" else act)
        assert rel_err(model(ids), logits) <= 1e-5, act


def test_layer_norm_epsilon_is_used(tmp_path, rng):
    tensors = random_tensors(rng, 101, 24, 32, 2)
    # a large epsilon changes the LayerNorms visibly, so the wrong one would fail
    exact = write_checkpoint(tmp_path / "eps", tensors, hf_config(**SMALL, layer_norm_epsilon=0.5))
    ids = rng.integers(0, 101, 7)
    _, logits = reference_states(exact, ids, 2, 4, eps=0.5)
    _, default_eps = reference_states(exact, ids, 2, 4)
    got = GPT2.from_pretrained(tmp_path / "eps")(ids)
    assert rel_err(got, logits) <= 1e-5 < rel_err(got, default_eps)


# ----------------------------------------------------------------------------- checkpoint layouts


def test_sharded_checkpoint_loads_the_same(ckpt, tmp_path, rng):
    root, tensors, _ = ckpt
    write_checkpoint(tmp_path / "sharded", tensors, hf_config(**SMALL), shards=3)
    ids = rng.integers(0, 101, 12)
    assert np.array_equal(GPT2.from_pretrained(tmp_path / "sharded")(ids), GPT2.from_pretrained(root)(ids))


def test_names_without_prefix_tied_head_and_mask_buffers(ckpt, tmp_path, rng):
    """Names without ``transformer.``, an lm_head.weight equal to wte, and the causal-mask
    buffers older transformers saved (h.{i}.attn.bias, .masked_bias): all load the same."""
    root, tensors, _ = ckpt
    t = {n[len("transformer."):]: a for n, a in tensors.items()}
    t["lm_head.weight"] = tensors["transformer.wte.weight"]
    for i in range(2):
        t[f"h.{i}.attn.bias"] = np.tril(np.ones((24, 24), np.float32))[None, None]
        t[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    write_checkpoint(tmp_path / "plain", t, hf_config(**SMALL))
    ids = rng.integers(0, 101, 12)
    assert np.array_equal(GPT2.from_pretrained(tmp_path / "plain")(ids), GPT2.from_pretrained(root)(ids))


# ----------------------------------------------------------------------------- loader errors


def _write(tmp_path, tensors, **config):
    root = tmp_path / "bad"
    write_checkpoint(root, tensors, hf_config(**{**SMALL, **config}))
    return root


def test_missing_tensor_is_named(ckpt, tmp_path):
    t = dict(ckpt[1])
    del t["transformer.h.1.mlp.c_fc.bias"]
    with pytest.raises(ValueError, match=r"lacks 'h\.1\.mlp\.c_fc\.bias'"):
        GPT2.from_pretrained(_write(tmp_path, t))


def test_extra_tensor_is_named(ckpt, tmp_path):
    t = dict(ckpt[1], **{"transformer.h.2.ln_1.weight": np.ones(32, np.float32)})   # a third layer
    with pytest.raises(ValueError, match=r"unexpected tensor 'transformer\.h\.2\.ln_1\.weight'"):
        GPT2.from_pretrained(_write(tmp_path, t))


def test_misshaped_tensor_is_named(ckpt, tmp_path):
    t = dict(ckpt[1])
    t["transformer.h.0.attn.c_attn.weight"] = np.ascontiguousarray(t["transformer.h.0.attn.c_attn.weight"].T)
    with pytest.raises(ValueError, match=r"'transformer\.h\.0\.attn\.c_attn\.weight' must have shape \(32, 96\).*got \(96, 32\)"):
        GPT2.from_pretrained(_write(tmp_path, t))


def test_integer_tensor_is_refused_by_name(ckpt, tmp_path):
    t = dict(ckpt[1], **{"transformer.ln_f.bias": np.zeros(32, np.int32)})
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'transformer\.ln_f\.bias' must be F32, F16 or BF16.*got I32"):
        GPT2.from_pretrained(_write(tmp_path, t))


def test_non_finite_tensor_is_named(ckpt, tmp_path):
    t = dict(ckpt[1])
    t["transformer.h.1.ln_2.bias"] = t["transformer.h.1.ln_2.bias"].copy()
    t["transformer.h.1.ln_2.bias"][5] = np.inf
    with pytest.raises(ValueError, match=r"'transformer\.h\.1\.ln_2\.bias' must be finite.*index \(5,\)"):
        GPT2.from_pretrained(_write(tmp_path, t))


def test_untied_head_is_refused(ckpt, tmp_path):
    t = dict(ckpt[1], **{"lm_head.weight": ckpt[1]["transformer.wte.weight"] + 1})
    with pytest.raises(ValueError, match=r"'lm_head\.weight' differs from 'transformer\.wte\.weight'"):
        GPT2.from_pretrained(_write(tmp_path, t))


def test_tensor_stored_twice_is_refused(ckpt, tmp_path):
    t = dict(ckpt[1], **{"wpe.weight": ckpt[1]["transformer.wpe.weight"]})
    with pytest.raises(ValueError, match=r"'wpe\.weight' is stored twice"):
        GPT2.from_pretrained(_write(tmp_path, t))


def test_shapes_follow_the_config(ckpt, tmp_path):
    """A config that disagrees with the tensors (here vocab_size) fails on the tensor."""
    with pytest.raises(ValueError, match=r"'transformer\.wte\.weight' must have shape \(100, 32\)"):
        GPT2.from_pretrained(_write(tmp_path, ckpt[1], vocab_size=100))


@pytest.mark.parametrize("key, value, error, match", [
    ("scale_attn_by_inverse_layer_idx", True, ValueError, "scale_attn_by_inverse_layer_idx=True is not supported"),
    ("scale_attn_weights", False, ValueError, "scale_attn_weights=False is not supported"),
    ("add_cross_attention", True, ValueError, "add_cross_attention=True is not supported"),
    ("tie_word_embeddings", False, ValueError, "tie_word_embeddings=False is not supported"),
    ("activation_function", "silu", ValueError, "activation_function must be one of .* got 'silu'"),
    ("n_inner", 0, ValueError, "n_inner must be >= 1, got 0"),
    ("n_inner", 1.5, TypeError, "n_inner must be an integer"),
    ("n_head", 5, ValueError, "n_embd must be divisible by n_head"),
    ("layer_norm_epsilon", -1.0, ValueError, "layer_norm_epsilon must be positive"),
    ("model_type", "bert", ValueError, "model_type must be 'gpt2', got 'bert'"),
])
def test_unsupported_config_values_are_named(ckpt, tmp_path, key, value, error, match):
    with pytest.raises(error, match=match) as e:
        GPT2.from_pretrained(_write(tmp_path, ckpt[1], **{key: value}))
    assert "config.json" in str(e.value)


def test_missing_files(tmp_path, ckpt):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        GPT2.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="is a file"):
        GPT2.from_pretrained(ckpt[0] / "config.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        GPT2.from_pretrained(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text(json.dumps(hf_config(**SMALL)))
    (tmp_path / "empty" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="only safetensors checkpoints are read"):
        GPT2.from_pretrained(tmp_path / "empty")
    (tmp_path / "empty" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"transformer.wte.weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(ValueError, match=r"'transformer\.wte\.weight' is in 'model-00001-of-00002\.safetensors', "
                                         r"which does not exist"):
        GPT2.from_pretrained(tmp_path / "empty")
    with pytest.raises(TypeError, match="path must be a str or a path, got int"):
        GPT2.from_pretrained(3)


# ----------------------------------------------------------------------------- ids


def test_bad_ids_are_refused(ckpt):
    model = GPT2.from_pretrained(ckpt[0])
    with pytest.raises(TypeError, match="ids must have an integer dtype, got float64"):
        model(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="ids must have an integer dtype, got bool"):
        model(np.array([True, False]))
    with pytest.raises(ValueError, match=r"ids must be \(T,\) or \(B, T\), got shape \(1, 2, 3\)"):
        model(np.zeros((1, 2, 3), int))
    with pytest.raises(ValueError, match="at least one token"):
        model(np.zeros(0, int))
    with pytest.raises(ValueError, match=r"token ids in \[0, vocab_size=101\), found 101 at index \(1, 2\)"):
        model(np.array([[0, 1, 2], [3, 4, 101]]))
    with pytest.raises(ValueError, match=r"found -1 at index \(0,\)"):
        model.hidden_states([-1, 3])
    with pytest.raises(ValueError, match="T=25 tokens, more than n_positions=24"):
        model(np.zeros(25, int))
    with pytest.raises(TypeError, match="ids must be an integer numpy array"):
        model("hello")
    with pytest.raises(ValueError, match="backend must be one of"):
        model([1, 2], backend="cuda")
    assert model([1, 2, 3]).shape == (3, 101)          # a list of ints is fine; T = n_positions too
    assert model(np.arange(24, dtype=np.uint16)).shape == (24, 101)


# ----------------------------------------------------------------------------- random models


def test_init_follows_gpt2(rng):
    cfg = GPT2Config(vocab_size=2000, n_positions=64, n_embd=64, n_layer=3, n_head=4)
    model = GPT2.init(cfg, seed=3)
    assert abs(model.wte.std() - 0.02) < 0.001 and abs(model.wpe.std() - 0.02) < 0.002
    b = model.blocks[1]
    assert abs(np.concatenate([b.w_q, b.w_k, b.w_v]).std() - 0.02) < 0.001
    assert abs(b.w_ff1.std() - 0.02) < 0.001
    for w in (b.w_o, b.w_ff2):          # c_proj: the std divided by sqrt(2 n_layer)
        assert abs(w.std() / (0.02 / math.sqrt(6)) - 1) < 0.05
    assert not any(np.any(getattr(b, n)) for n in ("b_q", "b_k", "b_v", "b_o", "b_ff1", "b_ff2", "ln1_beta"))
    assert np.all(b.ln1_gamma == 1) and np.all(model.ln_f[:64] == 1) and not np.any(model.ln_f[64:])
    # the same seed gives the same model; from_config is init on GPT2Config's keywords
    again = GPT2.from_config(vocab_size=2000, n_positions=64, n_embd=64, n_layer=3, n_head=4, seed=3)
    assert np.array_equal(again.wte, model.wte) and np.array_equal(again.blocks[2].w_ff2, model.blocks[2].w_ff2)
    assert not np.array_equal(GPT2.init(cfg, seed=4).wte, model.wte)
    with pytest.raises(TypeError, match="not both"):
        GPT2.from_config(cfg, n_layer=2)


def test_random_model_matches_the_reference(rng):
    """A model built in memory runs the same equations as a loaded one: its arrays, under HF
    names, through the reference."""
    model = GPT2.from_config(**SMALL, seed=5)
    d = 32
    t = {"transformer.wte.weight": model.wte, "transformer.wpe.weight": model.wpe,
         "transformer.ln_f.weight": model.ln_f[:d], "transformer.ln_f.bias": model.ln_f[d:]}
    for i, b in enumerate(model.blocks):
        p = f"transformer.h.{i}."
        t.update({p + "ln_1.weight": b.ln1_gamma, p + "ln_1.bias": b.ln1_beta,
                  p + "attn.c_attn.weight": np.concatenate([b.w_q, b.w_k, b.w_v], axis=1),
                  p + "attn.c_attn.bias": np.concatenate([b.b_q, b.b_k, b.b_v]),
                  p + "attn.c_proj.weight": b.w_o, p + "attn.c_proj.bias": b.b_o,
                  p + "ln_2.weight": b.ln2_gamma, p + "ln_2.bias": b.ln2_beta,
                  p + "mlp.c_fc.weight": b.w_ff1, p + "mlp.c_fc.bias": b.b_ff1,
                  p + "mlp.c_proj.weight": b.w_ff2, p + "mlp.c_proj.bias": b.b_ff2})
    t = {n: a.astype(np.float64) for n, a in t.items()}
    ids = rng.integers(0, 101, 10)
    _, logits = reference_states(t, ids, 2, 4)
    assert rel_err(model(ids), logits) <= 1e-5


def test_param_count():
    assert GPT2Config().param_count() == 124_439_808       # GPT-2 small, as published by OpenAI/HF
    model = GPT2.from_config(**SMALL, n_inner=48, seed=0)
    assert model.param_count() == model.config.param_count() == (
        101 * 32 + 24 * 32 + 2 * (3 * 32 * 32 + 3 * 32 + 32 * 32 + 32 + 32 * 48 + 48 + 48 * 32 + 32 + 4 * 32) + 2 * 32)


def test_config_round_trips_through_hf_keys():
    cfg = GPT2Config(vocab_size=77, n_positions=9, n_embd=16, n_layer=1, n_head=2, n_inner=40,
                     activation_function="gelu", layer_norm_epsilon=1e-6)
    hf = cfg.to_hf()
    assert hf["model_type"] == "gpt2" and hf["n_inner"] == 40 and hf["layer_norm_epsilon"] == 1e-6
    assert GPT2Config.from_hf(json.loads(json.dumps(hf))) == cfg
    assert cfg.block_config() == tblock.BlockConfig(d_model=16, n_heads=2, d_ff=40, activation="gelu_erf", eps=1e-6,
                                                    ffn_bias=True, ln_affine=True, attn_bias=True)


@pytest.mark.subprocess
def test_import_tblock_stays_light():
    """GPT2 is loaded on first use: importing tblock does not import safetensors."""
    import subprocess
    subprocess.run(proc("import_check", "gpt2"), check=True)


def test_the_model_cannot_be_edited_behind_the_backends():
    """The embeddings and LN_f are copies nobody can make writeable: the packed head and a
    prepared decode step were made from them once (issue 31)."""
    model = GPT2.from_config(**SMALL, seed=1)
    model(np.arange(3))                             # the head packed from wte
    for a in (model.wte, model.wpe, model.ln_f, model.wte[:5]):
        with pytest.raises(ValueError):
            a.flags.writeable = True


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")     # numpy's, before the refusal
def test_a_value_past_float32_is_refused_not_cast_to_inf():
    model = GPT2.from_config(**SMALL, seed=1)
    wte = model.wte.astype(np.float64)
    wte[7, 3] = 1e39                                # finite in float64, inf in the float32 model
    with pytest.raises(ValueError, match=r"wte must be finite, found inf at index \(7, 3\)"):
        GPT2(model.config, wte, model.wpe, model.blocks, model.ln_f[:32], model.ln_f[32:])
    assert GPT2(model.config, wte, model.wpe, model.blocks, model.ln_f[:32], model.ln_f[32:],
                dtype=np.float64).wte[7, 3] == 1e39


# ----------------------------------------------------------------------------- weight formats


def stored_tensors(exact, fmt, n_layer):
    """The checkpoint's tensors with every block matrix replaced by its ``fmt`` value, the
    Conv1D (in, out) matrices quantized as tblock stores them (c_attn as three (d, d) parts)."""
    from tblock.formats import quantize_matrix
    t = dict(exact)
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        w = exact[p + "attn.c_attn.weight"]
        d = w.shape[0]
        t[p + "attn.c_attn.weight"] = np.concatenate(
            [quantize_matrix(w[:, j * d:(j + 1) * d], fmt).dequantize(np.float64) for j in range(3)], axis=1)
        for name in ("attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"):
            t[p + name] = quantize_matrix(exact[p + name], fmt).dequantize(np.float64)
    return t


@pytest.mark.parametrize("fmt, head", [("bf16", None), ("int8", None), ("int4", None), ("int4", "int4"),
                                       ("int8", "fp32")])
def test_weights_are_stored_in_the_format_asked(ckpt, rng, backend, fmt, head):
    """from_pretrained(weights=fmt, head_weights=head): every block's six matrices in fmt,
    each the quantized checkpoint matrix it stands for, and the tied embedding in head
    (None: fmt, but int8 under int4 blocks), its rows the tokens'; the logits are GPT-2's on
    those values.  LN_f stays the checkpoint's float32."""
    root, _, exact = ckpt
    model = GPT2.from_pretrained(root, weights=fmt, head_weights=head)
    head = head or ("int8" if fmt == "int4" else fmt)
    assert (model.weight_format, model.head_format) == (fmt, head) and fmt in repr(model)
    assert all(b.format == fmt for b in model.blocks)
    assert np.array_equal(model.ln_f[32:], exact["transformer.ln_f.bias"])
    t = stored_tensors(exact, fmt, 2)
    wte = exact["transformer.wte.weight"]
    if head == "fp32":
        assert model.wte.dtype == np.float32 and np.array_equal(model.wte, wte)
    else:
        stored = quantize_matrix(wte.T, head)           # wte^T: one stored row a token
        assert np.array_equal(model.wte.data, stored.data)
        t["transformer.wte.weight"] = stored.dequantize(np.float64).T
    b = model.blocks[1]
    assert np.array_equal(b.matrix("w_v"), t["transformer.h.1.attn.c_attn.weight"][:, 64:])
    assert np.array_equal(b.matrix("w_ff2"), t["transformer.h.1.mlp.c_proj.weight"])
    assert np.array_equal(b.b_ff1, exact["transformer.h.1.mlp.c_fc.bias"])
    for T in (1, 13):
        ids = rng.integers(0, 101, T)
        _, logits = reference_states(t, ids, 2, 4)
        assert rel_err(model(ids, backend=backend), logits) <= 1e-5, T
    # the format made a difference: these are not the float32 logits
    _, fp32 = reference_states(exact, ids, 2, 4)
    assert rel_err(logits, fp32) > 1e-4


def test_weight_format_of_float_models(ckpt):
    assert GPT2.from_pretrained(ckpt[0]).weight_format == "fp32"
    assert GPT2.from_pretrained(ckpt[0], dtype=np.float64, weights="fp32").weight_format == "fp64"
    assert GPT2.from_config(**SMALL, seed=0, dtype=np.float64).weight_format == "fp64"


def test_bad_weights_are_refused(ckpt, tmp_path, rng):
    root = ckpt[0]
    with pytest.raises(ValueError, match=r"weights must be one of \('fp32', 'bf16', 'int8', 'int4'\), got 'int3'"):
        GPT2.from_pretrained(root, weights="int3")
    with pytest.raises(TypeError, match="weights must be a str, .* got int"):
        GPT2.from_pretrained(root, weights=8)
    with pytest.raises(ValueError, match=r"weights='int8' computes in float32: dtype must be float32, got float64"):
        GPT2.from_pretrained(root, dtype=np.float64, weights="int8")
    with pytest.raises(TypeError):                      # a keyword only: never taken for dtype
        GPT2.from_pretrained(root, np.float32, "int8")
    # d_model 48: bf16 stores it, the 32-input blocks of int8 and int4 do not divide it
    shape = dict(SMALL, n_embd=48)
    write_checkpoint(tmp_path / "d48", random_tensors(rng, 101, 24, 48, 2), hf_config(**shape))
    assert GPT2.from_pretrained(tmp_path / "d48", weights="bf16").weight_format == "bf16"
    with pytest.raises(ValueError, match=r"d48: block 0 cannot be stored as int4: .*multiple of 32, got 48"):
        GPT2.from_pretrained(tmp_path / "d48", weights="int4")


def test_blocks_must_share_one_format_and_compute_in_float32():
    from tblock import quantize
    model = GPT2.from_config(**SMALL, seed=2)
    args = (model.config, model.wte, model.wpe)
    ln = (model.ln_f[:32], model.ln_f[32:])
    int8 = [quantize(b, "int8") for b in model.blocks]
    with pytest.raises(ValueError, match="blocks must share one weight format, got int8, fp32"):
        GPT2(*args, [int8[0], model.blocks[1]], *ln)
    with pytest.raises(ValueError, match=r"blocks\[0\] holds int8 weights, which compute in float32: "
                                         r"the model's dtype must be float32, got float64"):
        GPT2(*args, int8, *ln, dtype=np.float64)
    q = GPT2(*args, int8, *ln)
    assert q.weight_format == "int8" and q.param_count() == model.param_count()


@pytest.mark.parametrize("fmt, bytes_per_value", [("fp32", 4), ("bf16", 2), ("int8", 34 / 32), ("int4", 18 / 32)])
def test_bytes_per_token_counts_the_blocks_the_head_and_the_cache(ckpt, fmt, bytes_per_value):
    """Counted by hand from the sizes: per block 4 d^2 + 2 d d_ff matrix values in the format
    and 9 d + d_ff float32 biases and LayerNorm values; the head vocab * d values in its
    format (float32 when asked so; int8, 1.0625 bytes, under int4 blocks); the cache
    2 * n_layer * context * d float32."""
    V, L, d, f = 101, 2, 32, 128
    blocks = L * (round((4 * d * d + 2 * d * f) * bytes_per_value) + 4 * (9 * d + f))
    model = GPT2.from_pretrained(ckpt[0], weights=fmt, head_weights="fp32")
    assert model.bytes_per_token() == model.bytes_per_token(0) == blocks + 4 * V * d
    assert model.bytes_per_token(24) == blocks + 4 * V * d + 4 * 2 * L * 24 * d
    head = round(V * d * (1.0625 if fmt == "int4" else bytes_per_value))
    assert GPT2.from_pretrained(ckpt[0], weights=fmt).bytes_per_token(24) == blocks + head + 4 * 2 * L * 24 * d
    assert GPT2.from_pretrained(ckpt[0], dtype=np.float64).bytes_per_token(5) == (
        L * 8 * (4 * d * d + 2 * d * f + 9 * d + f) + 8 * V * d + 8 * 2 * L * 5 * d)
    with pytest.raises(ValueError, match="context must be <= n_positions=24, got 25"):
        model.bytes_per_token(25)
    with pytest.raises(ValueError, match="context must be >= 0, got -1"):
        model.bytes_per_token(-1)
    with pytest.raises(TypeError, match="context must be an integer, got float"):
        model.bytes_per_token(1.5)
