"""A kernel loaded from Numba's cache finds the standalone kernels it calls by address
(kernels.options._call_by_address), however its callees got into the process.

The case that crashed (SIGSEGV or LLVM's "Symbol not found", with bf16 weights after an
edit of the kernels): process 1 compiles and caches a standalone kernel s, a kernel c that
calls it, and a caller of c; process 2 loads c from the cache and compiles a new caller
p of it; process 3 loads p from the cache and calls it.  p's entry must carry what
publishes s, which it inherits from c's library: a library Numba loaded from its cache
came back without it."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.subprocess

MODULE = textwrap.dedent("""
    from tblock.kernels.options import kernel

    @kernel(standalone=True, internal=True)
    def s(x):
        return x + 1.0

    @kernel(internal=True)
    def c(x):
        return s(x) * 2.0

    @kernel
    def first_caller(x):
        return c(x)

    @kernel
    def later_caller(x):
        return c(x) + 0.5
    """)


def _run(tmp_path, call):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}
    code = f"import calls_by_address as m; print(m.{call}(1.0)); print(m.{call}.stats.cache_hits)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_a_caller_compiled_over_a_cached_callee_loads_from_the_cache(tmp_path):
    (tmp_path / "calls_by_address.py").write_text(MODULE)
    expected = {"first_caller": "4.0", "later_caller": "4.5"}      # (1 + 1) * 2, then + 0.5
    hits = []
    for call in ("first_caller", "later_caller", "later_caller"):
        r = _run(tmp_path, call)
        assert r.returncode == 0, f"{call}: exit {r.returncode}\n{r.stderr[-2000:]}"
        value, hit = r.stdout.strip().split("\n")
        assert value == expected[call], (call, r.stdout)
        hits.append(hit)
    # the third process loaded later_caller from the cache (the case under test), the first
    # two compiled theirs
    assert hits[2] != "Counter()" and hits[1] == "Counter()", hits
