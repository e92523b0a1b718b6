"""tblock.perf.timing.paired: two calls side by side, their order alternating.

The clock is a fake one that each call moves by a known amount, so the pairs the harness
returns are checked exactly, not timed."""

import pytest

from tblock.perf import timing


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    return now


@pytest.mark.parametrize("n", [1, 2, 5])
def test_paired_attributes_each_call_its_own_time(clock, n):
    calls = []

    def a():
        calls.append("a")
        clock[0] += 3.0

    def b():
        calls.append("b")
        clock[0] += 1.0

    pairs = timing.paired(a, b, n)
    assert pairs == [(3.0, 1.0)] * n
    # one untimed call of each first, then a b, b a, a b, ...
    assert calls[:2] == ["a", "b"]
    assert calls[2:] == [c for i in range(n) for c in (("a", "b") if i % 2 == 0 else ("b", "a"))]
