"""Models pickle at any point (issue 31): before and after generate, with a prepared decode
step or without, and come back computing the same bits.

A prepared step holds addresses of this process's arrays and weak references to caches:
it is left behind, and the unpickled model prepares its own on its first one-token step.
Spawn pools and Ray-style workers receive a model this way.
"""

import copy
import pickle
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np
import pytest

from tblock import GPT2

SHAPE = dict(vocab_size=101, n_positions=32, n_embd=32, n_layer=2, n_head=4)


def snapshots(model, ids):
    """Pickles of the model at each point of a session: fresh, after generate, with a step
    prepared for a live list of caches, after a reference backend's call."""
    out = {"fresh": pickle.dumps(model)}
    model.generate(ids, 8, temperature=0)
    assert model.prepared_step is not None
    out["after generate"] = pickle.dumps(model)
    cache = model.make_cache(20)
    model.next_logits(ids[:5], cache)
    model.next_logits(ids[5:6], cache)
    out["with a live prepared step"] = pickle.dumps(model)
    model(ids, backend="numpy")
    model.next_logits(ids[6:7], cache, backend="numpy")
    out["after the numpy backend"] = pickle.dumps(model)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_model_pickles_at_any_point(dtype):
    model = GPT2.from_config(seed=4, dtype=dtype, **SHAPE)
    ids = np.random.default_rng(0).integers(0, 101, 12)
    logits, greedy = model(ids), model.generate(ids, 12, temperature=0)
    sampled = model.generate(ids, 12, temperature=0.9, top_k=20, seed=3)
    for when, blob in snapshots(model, ids).items():
        m = pickle.loads(blob)
        assert m.prepared_step is None, when
        for a in (m.wte, m.wpe, m.ln_f):           # frozen again, not writeable copies
            with pytest.raises(ValueError):
                a.flags.writeable = True
        assert np.array_equal(m(ids), logits), when
        assert np.array_equal(m(ids, backend="numpy"), model(ids, backend="numpy")), when
        assert np.array_equal(m.generate(ids, 12, temperature=0), greedy), when
        assert m.prepared_step is not None, when        # it prepared its own step
        assert np.array_equal(m.generate(ids, 12, temperature=0.9, top_k=20, seed=3), sampled), when


def test_a_copied_model_steps_like_the_original():
    model = GPT2.from_config(seed=5, **SHAPE)
    ids = np.random.default_rng(1).integers(0, 101, 16)
    model.generate(ids[:4], 4, temperature=0)
    twin = copy.deepcopy(model)
    a, b = model.make_cache(16), twin.make_cache(16)
    model.next_logits(ids[:4], a)
    twin.next_logits(ids[:4], b)
    for t in range(4, 16):
        assert np.array_equal(model.next_logits(ids[t:t + 1], a), twin.next_logits(ids[t:t + 1], b)), t
    assert twin.prepared_step is not None and twin.prepared_step is not model.prepared_step


@pytest.mark.subprocess
def test_a_model_goes_to_a_spawned_worker():
    model = GPT2.from_config(seed=6, **SHAPE)
    ids = np.arange(5)
    greedy = model.generate(ids, 10, temperature=0)         # the step prepared, then sent
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        got = pool.submit(model.generate, ids, 10, temperature=0).result(timeout=600)
    np.testing.assert_array_equal(got, greedy)


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_a_quantized_model_pickles_and_computes_the_same(fmt):
    """Stored matrices travel as their bytes: the unpickled model holds the same format and
    bytes, read-only, and computes the same logits and tokens."""
    from tblock import quantize
    base = GPT2.from_config(seed=7, **SHAPE)
    model = GPT2(base.config, base.wte, base.wpe, [quantize(b, fmt) for b in base.blocks],
                 base.ln_f[:32], base.ln_f[32:])
    ids = np.random.default_rng(2).integers(0, 101, 12)
    logits, greedy = model(ids), model.generate(ids, 10, temperature=0)
    for blob in (pickle.dumps(model), pickle.dumps(copy.deepcopy(model))):
        m = pickle.loads(blob)
        assert m.weight_format == fmt and m.bytes_per_token(7) == model.bytes_per_token(7)
        for a, b in zip(m.blocks, model.blocks):
            assert a.w_ff1.format == fmt and np.array_equal(a.w_ff1.data, b.w_ff1.data)
            with pytest.raises(ValueError):
                a.w_q.data.flags.writeable = True
        assert np.array_equal(m(ids), logits)
        assert np.array_equal(m(ids, backend="numpy"), model(ids, backend="numpy"))
        assert np.array_equal(m.generate(ids, 10, temperature=0), greedy)
