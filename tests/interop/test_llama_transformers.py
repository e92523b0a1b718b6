"""tblock.Llama against transformers' LlamaForCausalLM, Qwen2ForCausalLM and MistralForCausalLM
(``make test-interop``).

Each case builds a random reduced model, moves its RMSNorm gains and every bias away from 1
and 0 and gives its matrices the scale of a trained model's activations (HF's N(0, 0.02)
leaves attention nearly uniform and the FFN nearly linear), saves it with ``save_pretrained``
(safetensors, float32), loads the directory with ``tblock.load`` and compares logits and
hidden states with transformers' float32 on every tblock backend: grouped-query attention
2:1 and multi-query, tied and untied heads, Llama's optional biases, Qwen2's Q/K/V biases,
linear rope scaling.  Greedy generation must pick the same tokens.

Hidden states: transformers' last one is norm(h_N); ``Llama.hidden_states`` returns the
residual stream without it, so the last one is compared after the peer's own norm.
"""

import json
import re

import numpy as np
import pytest
import torch
import transformers

import tblock
from conftest import perturb_llama

pytestmark = pytest.mark.interop

SHAPE = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=None, eos_token_id=None)
TOL = 1e-5          # the bound on the float32 relative error
BACKENDS = ["numpy", "c", "numba"]
CASES = {
    "llama-gqa2-untied-biases": ("LlamaConfig", "LlamaForCausalLM",
                                 dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True,
                                      tie_word_embeddings=False)),
    "llama-mqa-tied-linear-rope": ("LlamaConfig", "LlamaForCausalLM",
                                   dict(num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500.0,
                                        rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "qwen2-gqa2-tied": ("Qwen2Config", "Qwen2ForCausalLM",
                        dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6)),
    "qwen2-mqa-untied": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=1, tie_word_embeddings=False)),
    "mistral-mha": ("MistralConfig", "MistralForCausalLM",
                    dict(num_key_value_heads=4, tie_word_embeddings=False, sliding_window=None)),
}


def rel_err(a, b) -> float:
    """max |a - b| / max |b|."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def hf_model(case: str, seed: int = 0):
    """A random model of ``case`` with non-trivial norm gains and biases."""
    config_cls, model_cls, extra = CASES[case]
    cfg = getattr(transformers, config_cls)(**{**SHAPE, **extra})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).eval()
    return perturb_llama(model)


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(peer, tblock's load of its save_pretrained folder, case name)."""
    peer = hf_model(request.param)
    root = tmp_path_factory.mktemp(request.param)
    peer.save_pretrained(root, safe_serialization=True)
    return peer, tblock.load(root), request.param


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_and_hidden_states_match_transformers(pair, backend, record_error):
    peer, ours, case = pair
    ids = np.random.default_rng(1).integers(0, SHAPE["vocab_size"], size=(2, 11))
    with torch.no_grad():
        out = peer(torch.from_numpy(ids), output_hidden_states=True)
    err = rel_err(ours(ids, backend=backend), out.logits.numpy())
    record_error(f"llama-family logits, {case}, {backend}", err)
    assert err <= TOL
    assert rel_err(ours(ids[1], backend=backend), out.logits[1].numpy()) <= TOL    # one sequence, (T,)
    n = peer.config.num_hidden_layers
    hs = ours.hidden_states(ids, backend=backend)                    # (n + 1, B, T, d)
    with torch.no_grad():
        last = peer.model.norm(torch.from_numpy(hs[n])).numpy()      # HF's last state is norm(h_N)
    for layer, (a, b) in enumerate(zip([*hs[:n], last], out.hidden_states)):
        assert rel_err(a, b.numpy()) <= TOL, layer


@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_steps_match_the_whole_sequence(pair, backend):
    peer, ours, _ = pair
    ids = np.random.default_rng(2).integers(0, SHAPE["vocab_size"], size=(2, 9))
    with torch.no_grad():
        want = peer(torch.from_numpy(ids)).logits.numpy()
    cache = ours.make_cache(16, batch=2)
    got = [ours(ids[:, :5], backend=backend, cache=cache)]           # a chunk, then one token at a time
    got += [ours(ids[:, t:t + 1], backend=backend, cache=cache) for t in range(5, 9)]
    assert rel_err(np.concatenate(got, axis=1), want) <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_generate_matches_transformers(pair, backend):
    peer, ours, _ = pair
    ids = np.random.default_rng(3).integers(1, SHAPE["vocab_size"], size=(1, 6))
    with torch.no_grad():
        want = peer.generate(torch.from_numpy(ids), max_new_tokens=12, do_sample=False).numpy()
    np.testing.assert_array_equal(ours.generate(ids, 12, temperature=0, backend=backend), want)


@pytest.mark.parametrize("key,value,message", [
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}, "rope_scaling type 'yarn' is not"),
    ("head_dim", 32, "head_dim=32 is not supported"),
    ("num_key_value_heads", 3, "num_key_value_heads must divide num_attention_heads"),
    ("hidden_act", "gelu_fast", "hidden_act must be one of"),
])
def test_refuses_what_it_does_not_compute(tmp_path, key, value, message):
    hf_model("qwen2-gqa2-tied").save_pretrained(tmp_path, safe_serialization=True)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + re.escape(message)):
        tblock.load(tmp_path)


def test_a_sliding_window_bounds_the_sequence(tmp_path):
    peer = hf_model("mistral-mha")
    peer.config.sliding_window = 8
    peer.save_pretrained(tmp_path, safe_serialization=True)
    ours = tblock.load(tmp_path)
    assert ours.n_positions == 8            # past the window attention would drop keys: refused
    with pytest.raises(ValueError, match="more than n_positions=8"):
        ours(np.arange(9), backend="numpy")
