"""The compile-ahead helper (tblock.backends.numba.ahead): a second process compiles the
block's output half for the signature a cold first call will use, and the call loads it
from the cache.  The helper is off in the rest of the suite (conftest), on here."""

import json
import os
import subprocess

import numpy as np
import pytest

from conftest import proc

pytestmark = pytest.mark.subprocess


def first_forward(how, cache_dir):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), "NUMBA_NUM_THREADS": "2",
           "TBLOCK_COMPILE_AHEAD": "1" if how == "waited" else "0"}
    p = subprocess.run(proc("compile_ahead", how), capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_call_loads_what_the_helper_compiled(tmp_path):
    """With the helper waited for, the call finds output_stages_task and the LN1 stage's
    layernorm_piece in the cache (hits, no miss: the helper compiled the very signatures
    the call types) and gives the bits of a call that compiled them itself; a second
    start for the same signature, or one the cache holds, starts nothing."""
    waited = first_forward("waited", tmp_path / "waited")
    alone = first_forward("alone", tmp_path / "alone")
    assert not waited["cached_before"] and waited["started"] and waited["helper_rc"] == 0
    assert waited["cached_after_helper"] and not waited["started_again"]
    assert waited["hits"] >= 1 and waited["misses"] == 0, waited
    assert waited["norm_hits"] >= 1 and waited["norm_misses"] == 0, waited
    assert alone["hits"] == 0 and alone["misses"] >= 1, alone
    assert alone["norm_hits"] == 0 and alone["norm_misses"] >= 1, alone
    assert waited["out"] == alone["out"]
    assert np.isfinite(np.frombuffer(bytes.fromhex(alone["out"]), np.float32)).all()


def test_when_a_helper_starts(monkeypatch):
    """Only with the switch on, a kernel cache, two usable CPUs and the signature not cached,
    and once a signature a process (a stand-in for Popen records the starts)."""
    from tblock.backends.numba import ahead
    started = []

    class Helper:
        def __init__(self, args, **kwargs):
            started.append(args)

        def wait(self):
            return 0
    monkeypatch.setattr(ahead.subprocess, "Popen", Helper)
    monkeypatch.setattr(ahead, "_started", set())
    monkeypatch.setattr(ahead, "holds", lambda kernel, signature: False)       # a cold cache
    monkeypatch.setattr(ahead, "usable_cores", lambda: 2)
    scalars = (2, 64, True, True, 0, 1e-5, 2, False, None, None, 1.0)
    monkeypatch.setenv("TBLOCK_COMPILE_AHEAD", "0")
    assert ahead.start(np.float32, scalars, None) is None and not started
    monkeypatch.setenv("TBLOCK_COMPILE_AHEAD", "1")
    monkeypatch.setattr(ahead, "CACHE_PATH", None)
    assert ahead.start(np.float64, scalars, None) is None and not started
    monkeypatch.setattr(ahead, "CACHE_PATH", "a folder")
    monkeypatch.setattr(ahead, "usable_cores", lambda: 1)
    assert ahead.start(np.float32, scalars, True) is None and not started
    monkeypatch.setattr(ahead, "usable_cores", lambda: 2)
    monkeypatch.setattr(ahead, "holds", lambda kernel, signature: True)        # already cached
    assert ahead.start(np.float64, scalars, True) is None and not started
    monkeypatch.setattr(ahead, "holds", lambda kernel, signature: False)
    assert ahead.start(np.float32, scalars, True) is None and not started       # each signature is looked at once
    assert ahead.start(np.float64, scalars, None) is None and not started
    other = scalars[:-1] + (2.0,)
    assert ahead.start(np.float64, other, True) is not None and len(started) == 1
    assert started[0][-3:] == ["<f8", repr(other), "True"]
    assert ahead.start(np.float64, other, True) is None and len(started) == 1
