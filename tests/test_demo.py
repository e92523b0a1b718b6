"""The interactive demo's model (tblock.lesson.demo): Mulberry32, the block against an independent
JavaScript rendering of the demo's class, the tracer's events, and the demo's invariants.

tests/data/demo_reference.json was written by ``node tests/data/demo_reference.mjs``, a
line-by-line JavaScript rendering of the published transformer-block.ts (with the unshown
Mulberry32 / SelfAttention / Kernels filled in as tblock/demo.py documents). When node is
installed, one test re-runs it and checks the stored file is what it prints.
"""

import json
import math
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import tblock
from tblock.lesson import demo

BACKENDS = tblock.available_backends()
DATA = pathlib.Path(__file__).parent / "data"
REF = json.loads((DATA / "demo_reference.json").read_text())
VOCAB = ["the", "cat", "sat", "on", "mat", "ran"]
TOKENS = [0, 1, 2, 3, 0, 4]
ORDER = ["embed"] * 6 + ["attend"] * 12 + ["add"] * 6 + ["norm"] * 6 + ["ffn"] * 6 + ["add"] * 6 + \
        ["norm"] * 6 + ["predict"] * 6


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


class Recorder:
    """A tracer with the demo's interface: .emit(kind, payload)."""

    def __init__(self):
        self.events = []

    def emit(self, kind, payload):
        self.events.append((kind, payload))

    def of(self, kind, stage=None):
        return [p for k, p in self.events if k == kind and (stage is None or p.get("stage") == stage)]


# ---- Mulberry32 and the reference ------------------------------------------------------

def test_mulberry32_matches_javascript():
    r = demo.Mulberry32(1)
    assert [r.next() for _ in range(5)] == REF["mulberry32_seed1"]
    r = demo.Mulberry32(0xDEADBEEF)
    assert [r.next() for _ in range(3)] == REF["mulberry32_deadbeef"]
    assert demo.Mulberry32(1 + 2 ** 32).next() == REF["mulberry32_seed1"][0]      # seed >>> 0
    r = demo.Mulberry32(5)
    assert all(-1 <= r.between(-1, 1) < 1 for _ in range(1000))


@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed; the stored reference is used")
def test_stored_reference_is_what_the_javascript_prints():
    out = subprocess.run(["node", str(DATA / "demo_reference.mjs")], capture_output=True, text=True, check=True)
    fresh = json.loads(out.stdout)
    assert fresh.keys() == REF.keys()
    assert fresh["mulberry32_seed1"] == REF["mulberry32_seed1"]                  # integer arithmetic: exact
    for key in ("heads2_postrue", "heads1_posfalse"):
        assert fresh[key]["kinds"] == REF[key]["kinds"]
        for field in ("stream", "probabilities"):                                # exp/sin/cos: to rounding
            np.testing.assert_allclose(fresh[key][field], REF[key][field], rtol=1e-13, atol=1e-15)
    for field in ("probabilities", "attention"):
        np.testing.assert_allclose(fresh["seed_page"][field], REF["seed_page"][field], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("heads, positional", [(2, True), (1, False)])
def test_model_matches_the_javascript_rendering(backend, heads, positional):
    ref = REF[f"heads{heads}_pos{str(positional).lower()}"]
    rec = Recorder()
    model = demo.TinyLM(VOCAB, dim=4, heads=heads, hidden=8, seed=7, tracer=rec, backend=backend)
    r = model.forward(TOKENS, positional=positional)
    np.testing.assert_allclose(r.probabilities, ref["probabilities"], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(r.stream, ref["stream"], rtol=1e-12, atol=1e-13)
    assert [k for k, _ in rec.events] == ref["kinds"]
    assert len(rec.events) == ref["n_events"] == demo.event_count(6, heads)


def test_the_seed_pages_reading_shows_its_numbers(backend):
    """The seed's page shows "predicts: ran 0.39 · attention entropy: 2.12 bits" for token 0 and
    its tour "the attention rows average 2.11 bits". The JavaScript rendering, with eight words and
    "ran" the seventh (docs/demo.md), gives those figures, and TinyLM gives the JavaScript's."""
    ref = REF["seed_page"]
    p, a = np.array(ref["probabilities"]), np.array(ref["attention"])                  # (6, 8), (2, 6, 6)
    bits = -(a * np.log2(a)).sum(axis=-1)                                               # (2, 6)
    assert (int(p[0].argmax()), f"{p[0].max():.2f}") == (6, "0.39")
    assert f"{bits[:, 0].mean():.2f}" == "2.12" and f"{bits.mean():.2f}" == "2.11"
    vocab = ["the", "cat", "sat", "on", "mat", "dog", "ran", "away"]
    r = demo.TinyLM(vocab, seed=1, backend=backend).forward(TOKENS)
    np.testing.assert_allclose(r.probabilities, p, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(r.attention, a, rtol=1e-12, atol=1e-14)
    assert r.top[0] == "ran"


# ---- the tracer ------------------------------------------------------------------------

def test_event_order_and_count_for_six_tokens_two_heads():
    rec = Recorder()
    demo.TinyLM(VOCAB, seed=1).forward(TOKENS, tracer=rec)
    assert [k for k, _ in rec.events] == ORDER
    assert len(rec.events) == 54 == demo.event_count(6, 2)
    attend = rec.of("attend")
    assert [(p["head"], p["index"]) for p in attend] == [(h, i) for h in range(2) for i in range(6)]
    assert [p["stage"] for p in rec.of("add")] == ["attention"] * 6 + ["ffn"] * 6


def test_a_plain_callable_is_a_tracer_too():
    kinds = []
    demo.TinyLM(VOCAB, tracer=lambda kind, payload: kinds.append(kind)).forward(TOKENS)
    assert kinds == ORDER


def test_event_payloads_are_consistent():
    rec = Recorder()
    model = demo.TinyLM(VOCAB, seed=3)
    r = model.forward(TOKENS, tracer=rec)
    for i, p in enumerate(rec.of("embed")):
        assert p["index"] == i and p["token"] == VOCAB[TOKENS[i]]
        np.testing.assert_array_equal(p["embedding"], model.weights.embeddings[TOKENS[i]])
        np.testing.assert_allclose(p["position"], demo.positional_encoding(i, 4))
        np.testing.assert_allclose(p["sum"], p["embedding"] + p["position"])
    for p in rec.of("attend"):
        assert p["weights"].shape == (6,) and p["output"].shape == (2,)
        assert abs(p["weights"].sum() - 1) < 1e-12
        np.testing.assert_array_equal(p["weights"], r.attention[p["head"], p["index"]])
    for stage in ("attention", "ffn"):
        adds, norms = rec.of("add", stage), rec.of("norm", stage)
        for a, n in zip(adds, norms):
            np.testing.assert_allclose(a["after"], a["before"] + a["delta"], rtol=1e-15)
            assert n["mean"] == pytest.approx(a["after"].mean(), abs=1e-14)
            assert n["variance"] == pytest.approx(a["after"].var(), rel=1e-12)
            np.testing.assert_allclose(n["after"], (a["after"] - n["mean"]) / np.sqrt(n["variance"] + 1e-5),
                                       atol=1e-12)
    # the ffn stage adds the ffn event's output onto the attention stage's normalised row
    for f, a, n in zip(rec.of("ffn"), rec.of("add", "ffn"), rec.of("norm", "attention")):
        np.testing.assert_array_equal(a["delta"], f["output"])
        np.testing.assert_array_equal(a["before"], n["after"])
        assert f["hidden"].shape == (8,) and np.all(f["hidden"] >= 0)           # relu
    for i, p in enumerate(rec.of("predict")):
        assert abs(p["probabilities"].sum() - 1) < 1e-12
        assert p["top"] == VOCAB[int(np.argmax(p["probabilities"]))] == r.top[i]
        assert p["probability"] == p["probabilities"].max()
        np.testing.assert_allclose(p["probabilities"], np.exp(p["logits"]) / np.exp(p["logits"]).sum())


# ---- the demo's invariants -------------------------------------------------------------

def test_probability_rows_sum_to_one_and_normalised_rows_are_standard(backend):
    rec = Recorder()
    r = demo.TinyLM(VOCAB, seed=11, backend=backend).forward(TOKENS, tracer=rec)
    np.testing.assert_allclose(r.probabilities.sum(axis=1), 1.0, atol=1e-12)
    for n in rec.of("norm"):
        assert abs(n["after"].mean()) < 1e-12
        # population variance of a LayerNorm output is var / (var + eps): 1 to eps precision
        assert n["after"].var() == pytest.approx(n["variance"] / (n["variance"] + 1e-5), rel=1e-12)
        assert abs(n["after"].var() - 1) < 1e-5 / n["variance"] + 1e-12
    # the residual norm returns to sqrt(d) = 2 after every norm stop (to eps precision)
    np.testing.assert_allclose(np.linalg.norm(r.stream, axis=1), 2.0, rtol=1e-4)


def test_without_position_identical_tokens_give_identical_rows(backend):
    r = demo.TinyLM(VOCAB, seed=2, backend=backend).forward(["the", "cat", "the", "sat", "the"], positional=False)
    for i, j in ((0, 2), (0, 4)):
        np.testing.assert_allclose(r.stream[i], r.stream[j], rtol=0, atol=1e-14)
        np.testing.assert_allclose(r.probabilities[i], r.probabilities[j], rtol=0, atol=1e-14)
        assert r.top[i] == r.top[j]
    with_pos = demo.TinyLM(VOCAB, seed=2, backend=backend).forward(["the", "cat", "the"], positional=True)
    assert not np.allclose(with_pos.stream[0], with_pos.stream[2])       # position tells them apart


def test_without_position_permuting_tokens_permutes_outputs(backend):
    model = demo.TinyLM(VOCAB, seed=4, backend=backend)
    perm = np.array([3, 0, 5, 1, 4, 2])
    a = model.forward(TOKENS, positional=False)
    b = model.forward([TOKENS[k] for k in perm], positional=False)
    np.testing.assert_allclose(b.stream, a.stream[perm], atol=1e-13)
    np.testing.assert_allclose(b.probabilities, a.probabilities[perm], atol=1e-14)
    np.testing.assert_allclose(b.attention, a.attention[:, perm][:, :, perm], atol=1e-14)
    assert b.top == tuple(a.top[k] for k in perm)


def test_a_constant_row_stays_finite(backend):
    base = demo.seeded_weights(len(VOCAB), 4, 2, 8, seed=1)
    emb = base.embeddings.copy()
    emb[1] = 0.5                                        # "cat" is a constant row
    blk = base.blocks[0]
    zero_wo = demo.DemoBlockWeights(heads=blk.heads, wo=np.zeros((4, 4)), w1=blk.w1, w2=blk.w2)
    w = demo.DemoWeights(embeddings=emb, blocks=(zero_wo,), wout=base.wout)
    rec = Recorder()
    r = demo.TinyLM(VOCAB, weights=w, backend=backend).forward(["cat", "cat"], positional=False, tracer=rec)
    assert np.all(np.isfinite(r.stream)) and np.all(np.isfinite(r.probabilities))
    first_norm = rec.of("norm", "attention")[0]
    assert first_norm["variance"] == 0.0                # the epsilon is what keeps this finite
    np.testing.assert_array_equal(first_norm["after"], np.zeros(4))
    np.testing.assert_allclose(r.probabilities, 1 / len(VOCAB))           # zero row -> uniform guess


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_one_wide_head_or_several_narrow_ones(backend, heads):
    rec = Recorder()
    model = demo.TinyLM(VOCAB, dim=4, heads=heads, hidden=8, seed=5, backend=backend)
    r = model.forward(TOKENS, tracer=rec)
    assert model.head_dim == 4 // heads
    assert r.attention.shape == (heads, 6, 6)
    assert all(p["output"].shape == (4 // heads,) for p in rec.of("attend"))
    np.testing.assert_allclose(r.probabilities.sum(axis=1), 1.0, atol=1e-12)
    assert len(rec.events) == demo.event_count(6, heads)


def test_low_temperature_makes_the_same_guess_more_confident(backend):
    model = demo.TinyLM(VOCAB, seed=1, backend=backend)
    warm = model.forward(TOKENS, temperature=1.0)
    cold = model.forward(TOKENS, temperature=0.1)
    assert cold.top == warm.top
    assert np.all(cold.probabilities.max(axis=1) > warm.probabilities.max(axis=1))
    np.testing.assert_allclose(cold.logits, warm.logits)                 # temperature only rescales


def test_positional_encoding_is_the_sinusoid():
    for i in (0, 1, 3, 17):
        want = [math.sin(i), math.cos(i), math.sin(i / 10000 ** 0.5), math.cos(i / 10000 ** 0.5)]
        np.testing.assert_allclose(demo.positional_encoding(i, 4), want, rtol=1e-15)
    assert demo.positional_encoding(2, 5).shape == (5,)
    assert demo.positional_encoding(2, 5)[4] == pytest.approx(math.sin(2 / 10000 ** (4 / 5)))


def test_words_and_ids_are_the_same_input():
    model = demo.TinyLM(VOCAB, seed=1)
    a = model.forward(TOKENS)
    b = model.forward([VOCAB[t] for t in TOKENS])
    c = model.forward(np.array(TOKENS))
    np.testing.assert_array_equal(a.probabilities, b.probabilities)
    np.testing.assert_array_equal(a.probabilities, c.probabilities)


def test_two_blocks_continue_the_stream_and_tag_their_events():
    rec = Recorder()
    one = demo.TinyLM(VOCAB, seed=1)
    two = demo.TinyLM(VOCAB, seed=1, n_blocks=2)
    np.testing.assert_array_equal(two.weights.embeddings, one.weights.embeddings)
    np.testing.assert_array_equal(two.weights.blocks[0].wo, one.weights.blocks[0].wo)
    r = two.forward(TOKENS, tracer=rec)
    assert len(rec.events) == demo.event_count(6, 2, n_blocks=2) == 6 + 2 * 42 + 6
    assert {p["block"] for k, p in rec.events if k in ("attend", "add", "norm", "ffn")} == {0, 1}
    assert len(r.attentions) == 2
    np.testing.assert_allclose(r.probabilities.sum(axis=1), 1.0, atol=1e-12)


# ---- errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, exc, match", [
    ([0, 6], ValueError, r"tokens\[1\] must index the vocabulary, an id in \[0, 6\), got 6"),
    ([-1], ValueError, r"tokens\[0\] must index the vocabulary.*got -1"),
    (["the", "zebra"], ValueError, r"tokens\[1\] must be a word of the vocabulary .*got 'zebra'"),
    ([0, 1.0], TypeError, r"tokens\[1\] must be a token id \(int\) or a word \(str\), got float 1.0"),
    ([True], TypeError, r"tokens\[0\] must be a token id .*got bool True"),
    ([], ValueError, "tokens must hold at least one token, got an empty sequence"),
    ("the cat", TypeError, "tokens must be a sequence of token ids or words, got str"),
    (3, TypeError, "tokens must be a sequence of token ids or words, got int"),
])
def test_bad_tokens(tokens, exc, match):
    with pytest.raises(exc, match=match):
        demo.TinyLM(VOCAB).forward(tokens)


@pytest.mark.parametrize("vocab, exc, match", [
    ([], ValueError, "vocab must hold at least two words, got 0"),
    (["only"], ValueError, "vocab must hold at least two words, got 1"),
    (["a", "b", "a"], ValueError, "vocab must hold distinct words, got 'a' more than once"),
    (["a", 2], TypeError, r"vocab\[1\] must be a word \(str\), got int 2"),
    ("ab", TypeError, "vocab must be a sequence of words"),
])
def test_bad_vocabulary(vocab, exc, match):
    with pytest.raises(exc, match=match):
        demo.TinyLM(vocab)


@pytest.mark.parametrize("temperature, exc", [(0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
                                              (float("inf"), ValueError), ("1", TypeError), (True, TypeError)])
def test_bad_temperature(temperature, exc):
    with pytest.raises(exc, match="temperature must be a finite number > 0, got"):
        demo.TinyLM(VOCAB).forward(TOKENS, temperature=temperature)


def test_bad_shapes_and_flags():
    with pytest.raises(ValueError, match="dim must split evenly across the heads, got dim=4, heads=3"):
        demo.TinyLM(VOCAB, dim=4, heads=3)
    with pytest.raises(ValueError, match="hidden must be an integer >= 1, got 0"):
        demo.TinyLM(VOCAB, hidden=0)
    with pytest.raises(TypeError, match="positional must be a bool"):
        demo.TinyLM(VOCAB).forward(TOKENS, positional=1)
    with pytest.raises(TypeError, match="tracer must be callable"):
        demo.TinyLM(VOCAB, tracer=42)
    with pytest.raises(ValueError, match=r"weights.embeddings must have shape \(6, 4\)"):
        demo.TinyLM(VOCAB, weights=demo.seeded_weights(5, 4, 2, 8))
