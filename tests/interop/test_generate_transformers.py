"""tblock.GPT2.generate against transformers' GPT2LMHeadModel.generate (``make test-interop``).

Greedy decoding must give the same tokens, one for one, for 50+ new tokens: the models
are test_gpt2_transformers' random GPT2LMHeadModels (LayerNorm affines and biases away
from 1 and 0, matrices at a trained model's scale), saved in float32 and loaded with
GPT2.from_pretrained; transformers runs in float32 with its own KV cache.  Sampling uses
different random streams on the two sides, so what is compared there is the distribution:
``next_token_probs`` against transformers' own temperature, top-k and top-p warpers.
"""

import numpy as np
import pytest
import torch
from test_gpt2_transformers import hf_model, save
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from tblock import GPT2
from tblock.models.sampling import next_token_probs

pytestmark = pytest.mark.interop

N_POSITIONS = 128           # room for a prompt and 50+ new tokens


def hf_greedy(peer, ids: np.ndarray, n: int, eos: int | None = None) -> np.ndarray:
    """transformers' greedy generate of n new tokens for (B, T) ids of equal length; a
    sequence that ends pads with eos (GPT-2's pad_token_id is its eos)."""
    peer.generation_config.eos_token_id = eos       # the config's eos (0) would stop it early
    peer.generation_config.pad_token_id = eos
    x = torch.from_numpy(ids)
    with torch.no_grad():
        out = peer.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                            eos_token_id=eos, pad_token_id=eos)
    return out.numpy()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(tblock's model, transformers'), the position embedding 4x larger: with the tied head,
    a greedy GPT-2 of random weights soon repeats one token; strong positions make every
    step's input differ, so the continuations keep changing."""
    root = tmp_path_factory.mktemp("gen")
    model = hf_model(seed=11, n_positions=N_POSITIONS)
    with torch.no_grad():
        model.transformer.wpe.weight.mul_(4)
    peer = save(model, root, "float32")
    return GPT2.from_pretrained(root), peer


@pytest.mark.parametrize("T", [1, 9, 40])
def test_greedy_generate_equals_transformers(pair, T):
    ours, peer = pair
    ids = np.random.default_rng(T).integers(0, peer.config.vocab_size, (1, T))
    n = min(70, N_POSITIONS - T)
    theirs = hf_greedy(peer, ids, n)
    assert theirs.shape == (1, T + n) and n >= 50
    assert len(set(theirs[0, T:].tolist())) > 5         # a real continuation, not one token repeated
    mine = ours.generate(ids[0], n, temperature=0)
    np.testing.assert_array_equal(mine, theirs[0])


def test_greedy_batch_equals_transformers(pair):
    ours, peer = pair
    ids = np.random.default_rng(12).integers(0, peer.config.vocab_size, (4, 7))
    theirs = hf_greedy(peer, ids, 60)
    np.testing.assert_array_equal(ours.generate(ids, 60, temperature=0), theirs)
    steps = np.stack(list(ours.stream(ids, 60, temperature=0)), axis=1)     # (B, 60)
    np.testing.assert_array_equal(steps, theirs[:, 7:])


def test_eos_stops_and_pads_as_transformers(pair):
    ours, peer = pair
    ids = np.random.default_rng(13).integers(0, peer.config.vocab_size, (3, 5))
    free = hf_greedy(peer, ids, 55)
    eos = int(free[0, 5 + 10])                  # sequence 0's 11th new token ends it
    theirs = hf_greedy(peer, ids, 55, eos=eos)
    assert (theirs[0, 5 + 10:] == eos).all()
    np.testing.assert_array_equal(ours.generate(ids, 55, temperature=0, eos_token_id=eos), theirs)
    np.testing.assert_array_equal(ours.generate(ids[0], 55, temperature=0, eos_token_id=eos),
                                  hf_greedy(peer, ids[:1], 55, eos=eos)[0])


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, None, None), (0.7, None, None), (1.0, 20, None), (1.0, None, 0.9), (0.8, 50, 0.95), (1.5, 5, 0.5)])
def test_the_sampling_distribution_is_transformers(pair, temperature, top_k, top_p):
    """next_token_probs == softmax of transformers' warpers (temperature, top-k, top-p in
    generate's order) on the model's own logits."""
    ours, peer = pair
    ids = np.random.default_rng(14).integers(0, peer.config.vocab_size, (3, 12))
    logits = torch.from_numpy(ours(ids)[:, -1])            # (3, vocab), float32
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None:
        scores = TopPLogitsWarper(top_p)(None, scores)
    theirs = torch.softmax(scores.double(), dim=-1).numpy()
    mine = next_token_probs(logits.numpy(), temperature, top_k, top_p)
    np.testing.assert_array_equal(mine > 0, theirs > 0)             # the same tokens stay
    np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-12)


def test_decode_benchmark_script_runs(tmp_path):
    """bench/bench_decode.py end to end at a tiny shape, once (make bench-decode runs GPT-2 small)."""
    import json

    from conftest import run_bench
    out = tmp_path / "decode.json"
    # d_k = 64, a whole number of panels on every vector path: the cache has no padding
    run_bench("bench_decode", "--model", "1:64:1:300", "--contexts", "5,9", "--prefill", "16", "--budget", "0",
              "--min-reps", "1", "--steps", "5", "--bandwidth-mib", "64", "--json", out)
    r = json.loads(out.read_text())
    assert [p["context"] for p in r["decode"]] == [5, 9]
    assert all(p["max_rel_err"] <= 1e-5 and p["median_s"]["tblock"] > 0 for p in r["decode"])
    # bench_decode.PAIRS (40) pairs of a step and a read, more than --min-reps asks
    assert all(len(p["paired_s"]) == 40 and p["over_floor_paired"] > 0 for p in r["decode"])
    assert r["bandwidth"]["read_GBs"] > 0 and r["memory"]["cache_bytes"] == r["memory"]["cache_bytes_expected"]
