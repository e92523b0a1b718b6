"""tblock.GPT2 against the real thing: transformers' GPT2LMHeadModel (``make test-interop``).

Each test builds a random GPT2LMHeadModel of reduced size, moves its LayerNorm gains and
every bias well away from 1 and 0 and gives its matrices the scale of a trained model's
activations (HF's N(0, 0.02) leaves attention nearly uniform and the FFN nearly linear),
saves it with ``save_pretrained`` (safetensors) in float32, float16 or bfloat16, loads the
directory with ``tblock.GPT2.from_pretrained`` and compares logits and hidden states with
transformers run in float32 on the same weights (for a float16 or bfloat16 checkpoint: the
saved weights upcast to float32, so both sides compute on identical values).

Hidden states: transformers returns n_layer + 1 states, the embeddings and the output of
every block, except that its last one is LN_f(h_N); ``GPT2.hidden_states`` returns the
residual stream h_0..h_N without LN_f, so the last one is compared after the peer's own
ln_f.  Not collected by a plain ``pytest`` (pyproject's addopts ignores tests/interop).
"""

import copy

import numpy as np
import pytest
import torch
import transformers
from transformers import GPT2LMHeadModel

from tblock import GPT2

pytestmark = pytest.mark.interop

SHAPE = dict(vocab_size=211, n_positions=64, n_embd=64, n_layer=3, n_head=4)
TOL = 1e-5          # the bound on the float32 relative error
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def rel_err(a, b) -> float:
    """max |a - b| / max |b|."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def hf_model(seed: int, **config) -> GPT2LMHeadModel:
    """A random GPT2LMHeadModel with non-trivial LayerNorm affines and biases."""
    cfg = transformers.GPT2Config(**{**SHAPE, **config}, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            module = name.split(".")[-2]
            if module.startswith("ln") and name.endswith("weight"):     # ln_1, ln_2, ln_f gains
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif module in ("wte", "wpe"):
                p.copy_(0.5 * torch.randn_like(p))
            else:                       # Conv1D weights, (in, out): activations of O(1)
                p.copy_(torch.randn_like(p) / p.shape[0] ** 0.5)
    return model


def save(model: GPT2LMHeadModel, root, dtype: str, **kw) -> GPT2LMHeadModel:
    """save_pretrained in ``dtype``; returns the peer: the saved weights, upcast, in float32."""
    stored = copy.deepcopy(model).to(DTYPES[dtype])
    stored.save_pretrained(root, **kw)
    assert (root / "model.safetensors").is_file() or (root / "model.safetensors.index.json").is_file()
    return stored.float().eval()


def compare(ours: GPT2, peer: GPT2LMHeadModel, ids: np.ndarray, label: str, record_error) -> None:
    """Logits and hidden states of (B, T) ids, and the logits of one (T,) sequence."""
    with torch.no_grad():
        out = peer(torch.from_numpy(ids), output_hidden_states=True)
    n = peer.config.n_layer
    err = rel_err(ours(ids), out.logits.numpy())
    record_error(f"logits, {label}", err)
    assert err <= TOL, (label, ids.shape)
    assert rel_err(ours(ids[-1]), out.logits[-1].numpy()) <= TOL
    hs = ours.hidden_states(ids)                    # (n + 1, B, T, d)
    assert hs.shape == (n + 1, *ids.shape, peer.config.n_embd)
    with torch.no_grad():
        last = peer.transformer.ln_f(torch.from_numpy(hs[n])).numpy()    # HF's last state is LN_f(h_N)
    for layer, (a, b) in enumerate(zip([*hs[:n], last], out.hidden_states)):
        err = rel_err(a, b.numpy())
        record_error(f"hidden states, {label}", err)
        assert err <= TOL, (label, layer, ids.shape)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_checkpoints_match_transformers(tmp_path, dtype, record_error):
    model = hf_model(seed=1)
    peer = save(model, tmp_path, dtype)
    ours = GPT2.from_pretrained(tmp_path)
    rng = np.random.default_rng(2)
    for B, T in [(1, 1), (1, 17), (3, 8), (2, 64)]:     # 64 = n_positions
        compare(ours, peer, rng.integers(0, SHAPE["vocab_size"], (B, T)), f"{dtype} checkpoint", record_error)


def test_float32_against_float64_truth(tmp_path, record_error):
    """Both float32 computations against transformers in float64: how far each is from the
    exact result (for the record; the bound is on tblock vs transformers)."""
    model = hf_model(seed=3)
    save(model, tmp_path, "float32")
    ours = GPT2.from_pretrained(tmp_path)
    truth = copy.deepcopy(model).double()
    ids = np.random.default_rng(4).integers(0, SHAPE["vocab_size"], (2, 64))
    with torch.no_grad():
        exact = truth(torch.from_numpy(ids)).logits.numpy()
        theirs = model(torch.from_numpy(ids)).logits.numpy()
    record_error("logits vs float64 truth: tblock float32", rel_err(ours(ids), exact))
    record_error("logits vs float64 truth: transformers float32", rel_err(theirs, exact))
    assert rel_err(ours(ids), exact) <= TOL


@pytest.mark.parametrize("config", [
    {"n_inner": 80}, {"activation_function": "gelu"}, {"activation_function": "relu"},
    {"activation_function": "gelu_pytorch_tanh"}, {"layer_norm_epsilon": 1e-3},
], ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_config_variants_match_transformers(tmp_path, config, record_error):
    model = hf_model(seed=5, **config)
    peer = save(model, tmp_path, "float32")
    ours = GPT2.from_pretrained(tmp_path)
    ids = np.random.default_rng(6).integers(0, SHAPE["vocab_size"], (2, 23))
    compare(ours, peer, ids, "float32 checkpoint, config variants", record_error)


def test_sharded_checkpoint(tmp_path, record_error):
    model = hf_model(seed=7)
    peer = save(model, tmp_path, "float32", max_shard_size="100KB")
    index = tmp_path / "model.safetensors.index.json"
    assert index.is_file() and len(list(tmp_path.glob("model-*.safetensors"))) > 1
    ids = np.random.default_rng(8).integers(0, SHAPE["vocab_size"], (2, 31))
    compare(GPT2.from_pretrained(tmp_path), peer, ids, "float32 checkpoint, sharded", record_error)


@pytest.mark.parametrize("key", ["scale_attn_by_inverse_layer_idx", "add_cross_attention"])
def test_variants_tblock_cannot_run_are_refused(tmp_path, key):
    save(hf_model(seed=9, **{key: True}), tmp_path, "float32")
    with pytest.raises(ValueError, match=f"{key}=True is not supported"):
        GPT2.from_pretrained(tmp_path)


def test_benchmark_script_runs(tmp_path):
    """bench/bench_gpt2.py end to end at a tiny shape, once (make bench-gpt2 runs GPT-2 small)."""
    import json

    from conftest import run_bench
    out = tmp_path / "gpt2.json"
    run_bench("bench_gpt2", "--model", "1:32:2:300", "--points", "5,9", "--budget", "0", "--min-reps", "1",
              "--json", out)
    points = json.loads(out.read_text())["points"]
    assert [p["T"] for p in points] == [5, 9]
    assert all(p["max_rel_err"] <= TOL and p["median_s"]["tblock"] > 0 for p in points)
