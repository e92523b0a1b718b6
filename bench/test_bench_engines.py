"""bench_engines.py's rounds (--rounds): rows merged across rounds, ratios paired round by
round; on made-up rows, nothing timed."""

from types import SimpleNamespace

import pytest
from bench_engines import merge_rounds, paired, x_floor
from engine_util import row


def rows(tblock_ms, llama_ms, read_bw=None):
    def one(engine, weights, ms):
        return row(engine, weights, "int8", [ms / 1e3] * 3, [10 * ms / 1e3] * 3, 100, "bytes", {}, 20, read_bw)
    return [one("tblock", "int8 dot int8", tblock_ms), one("llama.cpp", "Q8_0", llama_ms)]


def test_rounds_merge_into_one_row_each_with_the_median_of_their_medians():
    ctx = SimpleNamespace(fp32_row=None)
    merged = merge_rounds([rows(4.0, 5.0), rows(6.0, 5.5), rows(5.0, 9.0)], ctx)
    assert [(r["engine"], r["weights"]) for r in merged] == [("tblock", "int8 dot int8"), ("llama.cpp", "Q8_0")]
    ours, theirs = merged
    assert ours["decode_median_s"] == pytest.approx(5.0e-3) and theirs["decode_median_s"] == pytest.approx(5.5e-3)
    assert len(ours["decode_s"]) == 9 and ours["rounds"]["prefill"] == pytest.approx([0.04, 0.06, 0.05])
    # round by round 0.8, 1.09, 0.56: their median, not 5.0 / 5.5 = 0.91 from the medians
    assert paired(ours, theirs, "decode_median_s") == pytest.approx(4.0 / 5.0)


def test_one_round_keeps_the_plain_ratio_and_the_fp32_row_follows_the_merge():
    first = rows(4.0, 5.0)
    ctx = SimpleNamespace(fp32_row=first[0])
    ours, theirs = merge_rounds([first], ctx)
    assert ctx.fp32_row is ours
    assert paired(ours, theirs, "prefill_median_s") == pytest.approx(40.0 / 50.0)


def test_x_floor_pairs_each_round_with_the_read_beside_it():
    # 120 bytes a step; round 1 read at 40 kB/s (floor 3 ms), round 2 at 60 (2 ms), round 3 none
    ctx = SimpleNamespace(fp32_row=None)
    ours, _ = merge_rounds([rows(4.5, 5.0, 40e3), rows(3.0, 5.0, 60e3), rows(6.0, 5.0)], ctx)
    assert ours["read_bw"] == pytest.approx(50e3)
    assert x_floor(ours, 1e9) == pytest.approx(1.5)            # rounds 1.5 and 1.5; round 3 has no read
    alone, _ = merge_rounds([rows(6.0, 5.0)], ctx)
    assert x_floor(alone, 30e3) == pytest.approx(6.0e-3 * 30e3 / 120)     # the run's bandwidth
