"""tblock.Llama without transformers: its config, its checkpoints' names and checks, and the
model's bookkeeping (tests/interop/test_llama_transformers.py compares it with transformers).

The checkpoints here are written with safetensors' numpy API from weights drawn in the test;
the expected logits come from a plain NumPy forward written below from Hugging Face's
modeling_llama (RMSNorm, rotate-half rotary, repeat_kv, SwiGLU), independent of tblock's code."""

import json
import pickle

import numpy as np
import pytest
from safetensors.numpy import save_file

import tblock
from tblock.models.llama import LlamaConfig, hf_tensor_shapes

HF = dict(model_type="qwen2", vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-6,
          rope_theta=1000.0, tie_word_embeddings=False)


def random_tensors(hf: dict, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in hf_tensor_shapes(LlamaConfig.from_hf(hf)).items():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            out[name] = (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        elif len(shape) == 1:
            out[name] = (0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    return out


def write(root, hf: dict, tensors: dict):
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(hf))
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    return root


def reference_logits(hf: dict, t: dict, ids: np.ndarray) -> np.ndarray:
    """Hugging Face's Llama/Qwen2 forward in float64 NumPy, (T,) ids -> (T, vocab)."""
    d, nh = hf["hidden_size"], hf["num_attention_heads"]
    nkv, dk, eps = hf["num_key_value_heads"], hf["hidden_size"] // hf["num_attention_heads"], hf["rms_norm_eps"]
    f64 = {n: a.astype(np.float64) for n, a in t.items()}
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    T = len(ids)
    inv = 1.0 / hf["rope_theta"] ** (np.arange(0, dk, 2) / dk)
    emb = np.concatenate([np.outer(np.arange(T), inv)] * 2, axis=1)           # (T, dk): HF's cat(freqs, freqs)
    cos, sin = np.cos(emb), np.sin(emb)
    rot = lambda x: x * cos + np.concatenate([-x[..., dk // 2:], x[..., :dk // 2]], -1) * sin
    lin = lambda x, n: x @ f64[n + ".weight"].T + f64.get(n + ".bias", 0.0)
    h = f64["model.embed_tokens.weight"][ids]
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms(h, f64[p + "input_layernorm.weight"])
        q = lin(x, p + "self_attn.q_proj").reshape(T, nh, dk).transpose(1, 0, 2)
        k = lin(x, p + "self_attn.k_proj").reshape(T, nkv, dk).transpose(1, 0, 2)
        v = lin(x, p + "self_attn.v_proj").reshape(T, nkv, dk).transpose(1, 0, 2)
        q, k = rot(q), rot(k)
        k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)   # repeat_kv
        s = q @ k.transpose(0, 2, 1) / np.sqrt(dk) + np.triu(np.full((T, T), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        h = h + lin((a @ v).transpose(1, 0, 2).reshape(T, d), p + "self_attn.o_proj")
        x = rms(h, f64[p + "post_attention_layernorm.weight"])
        g = lin(x, p + "mlp.gate_proj")
        h = h + lin(g / (1 + np.exp(-g)) * lin(x, p + "mlp.up_proj"), p + "mlp.down_proj")
    head = f64["model.embed_tokens.weight" if hf["tie_word_embeddings"] else "lm_head.weight"]
    return rms(h, f64["model.norm.weight"]) @ head.T


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    t = random_tensors(HF)
    return write(tmp_path_factory.mktemp("qwen2"), HF, t), t


def test_logits_equal_an_independent_forward(qwen):
    root, t = qwen
    ids = np.array([3, 17, 5, 96, 0, 41, 7])
    got = tblock.load(root, dtype=np.float64)(ids, backend="numpy")
    want = reference_logits(HF, t, ids)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def test_load_picks_the_class_and_the_model_knows_its_shape(qwen):
    root, _ = qwen
    m = tblock.load(root)
    assert isinstance(m, tblock.Llama) and m.config.model_type == "qwen2"
    cfg = m.stack.cfg
    assert (cfg.norm_type, cfg.ffn, cfg.activation, cfg.positions, cfg.kv_heads, cfg.attn_bias) == \
        ("rmsnorm", "gated", "silu", "rotary", 2, "qkv")
    d, f, v, kv = 64, 96, 97, 32
    per_block = 2 * d * d + 2 * d * kv + 3 * d * f + d + 2 * kv + 2 * d
    assert m.param_count() == 2 * per_block + 2 * v * d + d        # untied: embedding and head
    assert m.wpe is None and m.lm_head is not None
    # a decode step reads the blocks, the head, and 2 * d_kv float32s per cached token per block
    blocks = sum(b.nbytes for b in m.blocks)
    assert m.bytes_per_token(10) == blocks + v * d * 4 + 2 * 10 * 2 * kv * 4


def test_generate_and_a_pickled_model(qwen):
    root, _ = qwen
    m = tblock.load(root)
    ids = np.array([1, 2, 3])
    out = m.generate(ids, 6, temperature=0, backend="numpy")
    again = pickle.loads(pickle.dumps(m))
    np.testing.assert_array_equal(again.generate(ids, 6, temperature=0, backend="numpy"), out)
    # greedy tokens are the argmax of the whole sequence's logits at each step
    logits = m(out[:-1], backend="numpy")
    np.testing.assert_array_equal(logits[2:].argmax(-1), out[3:])


def test_stored_formats_hold_every_matrix(qwen):
    root, _ = qwen
    m = tblock.Llama.from_pretrained(root, weights="int8")
    assert m.weight_format == "int8" and m.head_format == "int8"
    assert all(b.w_gate.format == "int8" for b in m.blocks)
    ref = tblock.load(root)
    ids = np.arange(1, 9)
    assert np.abs(m(ids, backend="numpy") - ref(ids, backend="numpy")).max() < 0.05 * np.abs(ref(ids, backend="numpy")).max()


def test_a_tied_head_stored_anyway_must_equal_the_embedding(tmp_path):
    hf = {**HF, "tie_word_embeddings": True}
    t = random_tensors(hf)
    t["lm_head.weight"] = t["model.embed_tokens.weight"].copy()
    m = tblock.load(write(tmp_path / "same", hf, t))
    assert m.lm_head is None
    t["lm_head.weight"][0, 0] += 1
    with pytest.raises(ValueError, match="'lm_head.weight' differs from 'model.embed_tokens.weight'"):
        tblock.load(write(tmp_path / "differs", hf, t))


@pytest.mark.parametrize("change,message", [
    (lambda t: t.pop("model.layers.1.mlp.gate_proj.weight"), "lacks 'model.layers.1.mlp.gate_proj.weight'"),
    (lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": np.zeros(64, np.float32)}),
     "unexpected tensor 'model.layers.0.self_attn.o_proj.bias'"),
    (lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": np.zeros((64, 64), np.float32)}),
     r"'model.layers.0.self_attn.k_proj.weight' must have shape \(32, 64\)"),
    (lambda t: t["model.norm.weight"].__setitem__(3, np.nan), "'model.norm.weight' must be finite"),
])
def test_a_checkpoint_that_does_not_fit_its_config_is_refused(tmp_path, change, message):
    t = random_tensors(HF)
    change(t)
    with pytest.raises(ValueError, match=message):
        tblock.load(write(tmp_path, HF, t))


@pytest.mark.parametrize("key,value,error,message", [
    ("model_type", "gemma", ValueError, "model_type must be one of"),
    ("num_hidden_layers", 10**9, ValueError, "checkpoint holds only"),
    ("rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, ValueError, "rope_scaling type 'dynamic'"),
    ("rope_scaling", {"rope_type": "linear", "factor": -1}, ValueError, "factor must be a positive number"),
    ("hidden_size", "64", TypeError, "hidden_size must be an integer"),
    ("rms_norm_eps", 0, ValueError, "rms_norm_eps must be positive"),
])
def test_a_bad_config_is_refused_by_key(tmp_path, key, value, error, message):
    t = random_tensors(HF)
    root = write(tmp_path, {**HF, key: value}, t)
    with pytest.raises(error, match=str(root / "config.json") if key != "num_hidden_layers" else "config.json"):
        tblock.load(root)
    with pytest.raises(error, match=message):
        tblock.load(root)


def test_transformers_5_rope_parameters_are_read(tmp_path):
    hf = {k: v for k, v in HF.items() if k != "rope_theta"}
    hf["rope_parameters"] = {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}
    m = tblock.load(write(tmp_path, hf, random_tensors(hf)))
    assert (m.stack.cfg.rope_theta, m.stack.cfg.rope_scale) == (500.0, 4.0)
