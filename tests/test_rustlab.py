"""tblock.rustlab against its peers: the Rust crates' own test values, the crate's ziggurat
table, and, above all, the lesson's seed-13 draws, which must come out exactly (==)."""

import hashlib
import math
import re
import time

import numpy as np
import pytest

from tblock import load_worked_example, rustlab
from tblock.lesson import depth
from tblock.rustlab import Rng


def test_seed_from_u64_matches_rand_core():
    # rand_core 0.6.4, lib.rs test_seed_from_u64: "value-breakage test", the seed's first 8 bytes
    key = rustlab.seed_key(0)
    assert int(key[0]) | int(key[1]) << 32 == 5029875928683246316


def _key(seed_bytes):
    return np.frombuffer(bytes(seed_bytes), dtype="<u4").astype(np.uint32)


def test_chacha12_matches_rand_stdrng():
    # rand 0.8.5, rngs/std.rs test_stdrng_construction: StdRng::from_seed(seed).next_u64()
    seed = [1, 0, 0, 0, 23, 0, 0, 0, 200, 1, 0, 0, 210, 30, 0, 0] + [0] * 16
    words = rustlab.chacha_blocks(_key(seed), 0, 1)
    assert int(words[0]) | int(words[1]) << 32 == 10719222850664546238


@pytest.mark.parametrize("seed, first_block, expected", [
    # rand_chacha 0.3.1 test_chacha_true_values_a and _c (the IETF draft's vectors 1, 2 and 4), ChaCha20
    ([0] * 32, 0, [0xade0b876, 0x903df1a0, 0xe56a5d40, 0x28bd8653, 0xb819d2bd, 0x1aed8da0, 0xccef36a8,
                   0xc70d778b, 0x7c5941da, 0x8d485751, 0x3fe02477, 0x374ad8b8, 0xf4b8436a, 0x1ca11815,
                   0x69b687c3, 0x8665eeb2]),
    ([0] * 32, 1, [0xbee7079f, 0x7a385155, 0x7c97ba98, 0x0d082d73, 0xa0290fcb, 0x6965e348, 0x3e53c612,
                   0xed7aee32, 0x7621b729, 0x434ee69c, 0xb03371d5, 0xd539d874, 0x281fed31, 0x45fb0a51,
                   0x1f0ae1ac, 0x6f4d794b]),
    ([0, 0xFF] + [0] * 30, 2, [0xfb4dd572, 0x4bc42ef1, 0xdf922636, 0x327f1394, 0xa78dea8f, 0x5e269039,
                               0xa1bebbc1, 0xcaf09aae, 0xa25ab213, 0x48a6b46c, 0x1b9d9bcb, 0x092c5be6,
                               0x546ca624, 0x1bec45d5, 0x87f47473, 0x96f0992e]),
])
def test_chacha_block_function_matches_the_test_vectors(seed, first_block, expected):
    words = rustlab.chacha_blocks(_key(seed), first_block, 1, double_rounds=10)
    assert words.tolist() == expected
    # and the same block from inside a batch of several
    batch = rustlab.chacha_blocks(_key(seed), 0, first_block + 3, double_rounds=10)
    assert batch[16 * first_block:16 * (first_block + 1)].tolist() == expected


# rand_distr 0.4.3, src/ziggurat_tables.rs: sha256 of ZIG_NORM_X then ZIG_NORM_F as little-endian
# f64 (each entry of the file's text parsed as a double), and some entries as the file prints them
CRATE_TABLE_SHA256 = "b685935eee7f0ec680b2aabe47f857dc837c5d5d520f09b2e580d2a5c3b96ebd"
CRATE_TABLE_ENTRIES = {   # i: (ZIG_NORM_X[i], ZIG_NORM_F[i])
    0: ("3.910757959537090045", "0.000477467764586655"),
    1: ("3.654152885361008796", "0.001260285930498598"),
    2: ("3.449278298560964462", "0.002609072746106363"),
    94: ("1.776464495522344977", "0.206405406398679298"),
    128: ("1.535342571438843118", "0.307697412505553769"),
    255: ("0.215241895913273806", "0.977101701282731328"),
    256: ("0.000000000000000000", "1.000000000000000000"),
}


def test_ziggurat_tables_are_the_crates():
    X, F = rustlab.ziggurat_tables()
    assert X.shape == F.shape == (257,)
    assert rustlab.ZIG_NORM_R == float("3.654152885361008796") == X[1]
    for i, (x, f) in CRATE_TABLE_ENTRIES.items():
        assert (X[i], F[i]) == (float(x), float(f)), i
    assert hashlib.sha256(np.concatenate([X, F]).astype("<f8").tobytes()).hexdigest() == CRATE_TABLE_SHA256


def test_seed13_draws_are_the_lessons_exactly():
    """seed(13); H_in = randn(4, 8); then the block's six matrices, in the lesson's order."""
    ex = load_worked_example()
    rng = Rng(13)
    H_in = rng.randn(4, 8)
    assert np.array_equal(H_in, ex.H_in)
    w = depth.lesson_block_weights(ex.cfg, rng)
    for name in ("w_q", "w_k", "w_v", "w_o", "w_ff1", "w_ff2"):
        assert np.array_equal(getattr(w, name), getattr(ex.weights, name)), name
    # the same draws written out as the lesson writes them
    rng = Rng(13)
    rng.randn(4, 8)
    for name in ("w_q", "w_k", "w_v", "w_o"):
        assert np.array_equal(rng.randn(8, 8) * (1.0 / math.sqrt(8)), getattr(ex.weights, name)), name
    assert np.array_equal(rng.randn(8, 32) * math.sqrt(2.0 / 8), ex.weights.w_ff1)
    assert np.array_equal(rng.randn(32, 8) * math.sqrt(2.0 / 32), ex.weights.w_ff2)
    # 800 samples took 808 u64s: the stream's wedge rejections (6 of them) read extra draws
    assert rng.u64s_drawn == 808


@pytest.mark.parametrize("seed", [0, 1300, 2**64 - 1])
def test_vectorised_stream_is_the_one_try_at_a_time_stream(seed):
    n = 60_000
    scalar_rng = Rng(seed)
    scalar = np.array([scalar_rng.normal() for _ in range(n)])
    whole_rng = Rng(seed)
    whole = whole_rng.standard_normal(n)
    assert np.array_equal(whole, scalar)
    assert whole_rng.u64s_drawn == scalar_rng.u64s_drawn > n      # the misses read extra u64s
    assert np.any(np.abs(scalar) > rustlab.ZIG_NORM_R)            # the tail path ran too
    # in pieces of every size (0 included), the stream is the same
    sizes = np.random.default_rng(seed % 2**32).integers(0, 300, size=400)   # ~60k in all
    piecewise_rng = Rng(seed)
    drawn = np.concatenate([piecewise_rng.standard_normal(int(k)) for k in sizes])[:n]
    assert len(drawn) > n // 2
    assert np.array_equal(drawn, scalar[:len(drawn)])


def test_randn_fills_row_by_row():
    flat = Rng(5).standard_normal(12)
    assert np.array_equal(Rng(5).randn(3, 4), flat.reshape(3, 4))    # (12,) -> (3, 4), C order
    assert Rng(5).randn(0, 4).shape == (0, 4)


def test_the_samples_are_standard_normal():
    x = Rng(2024).standard_normal(400_000)
    assert abs(x.mean()) < 0.01 and abs(x.var() - 1.0) < 0.01
    # P(|x| > 2) = 0.0455 for N(0, 1); the sample's share sits within 5 binomial sigmas
    p = np.mean(np.abs(x) > 2.0)
    assert abs(p - 0.0455) < 5 * math.sqrt(0.0455 * 0.9545 / len(x))


def test_a_768_block_draws_quickly():
    """The six matrices of a d_model = 768 block (4.7M samples); measured ~0.3 s on the
    project's machine, so 10 s only catches an accidental slow path, not noise."""
    rng = Rng(1)
    start = time.perf_counter()
    for shape in [(768, 768)] * 4 + [(768, 3072), (3072, 768)]:
        rng.randn(*shape)
    assert time.perf_counter() - start < 10.0


@pytest.mark.parametrize("seed, error, words", [
    (-1, ValueError, "seed must be in [0, 2**64)"),
    (2**64, ValueError, "seed must be in [0, 2**64)"),
    (1.5, TypeError, "seed must be a non-negative integer"),
    (True, TypeError, "seed must be a non-negative integer"),
    ("13", TypeError, "seed must be a non-negative integer"),
])
def test_bad_seeds_are_clear_errors(seed, error, words):
    with pytest.raises(error, match=re.escape(words)):
        Rng(seed)


@pytest.mark.parametrize("rows, cols, error, words", [
    (-1, 4, ValueError, "rows must be a non-negative integer, got -1"),
    (4, -2, ValueError, "cols must be a non-negative integer, got -2"),
    (4.0, 4, TypeError, "rows must be a non-negative integer, got float 4.0"),
    (4, None, TypeError, "cols must be a non-negative integer, got NoneType None"),
])
def test_bad_shapes_are_clear_errors(rows, cols, error, words):
    with pytest.raises(error, match=words):
        Rng(1).randn(rows, cols)


def test_lesson_block_weights_rejects_a_numpy_generator():
    with pytest.raises(TypeError, match="rng must be a tblock.rustlab.Rng, got Generator"):
        depth.lesson_block_weights(load_worked_example().cfg, np.random.default_rng(1))
