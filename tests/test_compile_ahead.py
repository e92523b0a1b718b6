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
    """With the helper waited for, the call finds output_stages_task in the cache (a hit,
    no miss: the helper compiled the very signature the call types) and gives the bits
    of a call that compiled it itself; a second start for the same signature, or one
    the cache holds, starts nothing."""
    waited = first_forward("waited", tmp_path / "waited")
    alone = first_forward("alone", tmp_path / "alone")
    assert not waited["cached_before"] and waited["started"] and waited["helper_rc"] == 0
    assert waited["cached_after_helper"] and not waited["started_again"]
    assert waited["hits"] >= 1 and waited["misses"] == 0, waited
    assert alone["hits"] == 0 and alone["misses"] >= 1, alone
    assert waited["out"] == alone["out"]
    assert np.isfinite(np.frombuffer(bytes.fromhex(alone["out"]), np.float32)).all()


def test_off_switch_and_no_cache(monkeypatch):
    """TBLOCK_COMPILE_AHEAD=0 starts nothing, and nor does a process without a kernel cache."""
    from tblock.backends.numba import ahead
    monkeypatch.setenv("TBLOCK_COMPILE_AHEAD", "0")
    assert ahead.start(np.float32, (2, 64, True, True, 0, 1e-5, 2, False, None, None, 1.0), None) is None
    monkeypatch.setenv("TBLOCK_COMPILE_AHEAD", "1")
    monkeypatch.setattr(ahead, "CACHE_PATH", None)
    assert ahead.start(np.float32, (2, 64, True, True, 0, 1e-5, 2, False, None, None, 1.0), None) is None
