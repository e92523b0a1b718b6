"""The vector paths: detection, TBLOCK_ISA, and one Numba cache per path.

Each path is a process-wide choice made when tblock.kernels is imported, so every check
of a path other than this process's runs in a subprocess.  (`make test` also runs the
kernel and block test files once per path this machine can execute: see the Makefile.)"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from conftest import proc

import tblock
from tblock.kernels import isa, tiles
from tblock.kernels.gemm import panel_width
from tblock.kernels.simd import lanes, panel_lanes
from tblock.kernels.tiles import BK, FF_CHUNK, KC, MR, NV
from numba import njit

pytestmark = pytest.mark.isa

RUNNABLE = isa.PATH.runnable


def run_check(check: str, **env) -> subprocess.CompletedProcess:
    """Run tests/procs/isa_paths.py's ``check`` in a fresh interpreter with these
    environment variables added (a value of None removes the variable)."""
    full = dict(os.environ)
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    return subprocess.run(proc("isa_paths", check), env=full, capture_output=True, text=True, timeout=600)


@njit
def _lanes_of(x):
    return lanes(x), panel_lanes(x)


def test_this_process_runs_the_widest_path_unless_forced():
    assert tblock.isa() == isa.PATH.name
    assert isa.PATH.runnable == isa.NAMES[isa.NAMES.index(isa.PATH.runnable[0]):]
    if not isa.PATH.forced:
        assert tblock.isa() == RUNNABLE[0]
    else:
        assert tblock.isa() == os.environ["TBLOCK_ISA"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_width_and_micro_tile_follow_the_path(dtype):
    x = np.zeros(4, dtype)
    W, NR = _lanes_of(x)
    assert W * np.dtype(dtype).itemsize == isa.PATH.vector_bytes
    assert NR == NV * W == panel_width(dtype)
    # registers the micro-kernel keeps live: 6 NV accumulators, NV for B, 1 broadcast
    regs = {"avx512": 32, "avx2": 16, "generic": 32 if NV == 4 else 16}[isa.PATH.name]
    assert MR * NV + NV + 1 <= regs
    # FF_CHUNK is a multiple of KC, and a KC x NR slice of B fits in L1
    assert FF_CHUNK % KC == 0 and BK % NR == 0
    assert KC == 64 or KC * NR * np.dtype(dtype).itemsize <= isa.PATH.l1d


def test_path_key_names_everything_compiled_code_depends_on():
    """The cache key names the path and every fact the tiles are sized by: the same key,
    the same micro-tile and KC."""
    p = isa.PATH
    assert p.key == f"{p.name}-v{p.vector_bytes}-{p.arch}-l1d{p.l1d}"
    assert (tiles.micro_tile_vectors(p), tiles.k_block(p.vector_bytes, NV, p.l1d)) == (NV, KC)


def test_the_tile_table_sizes_every_path():
    """tiles.py's micro-tile per path (the register file's room: MR * NV accumulators, a
    row of B and a broadcast) and KC's rule: 128 in a 32 or 48 KiB L1 on avx512 (Zen 4,
    Zen 5), 256 in 32 KiB on avx2, never past 256 or under 64."""
    regs = {"avx512": 32, "avx2": 16, "generic": 16}
    for name, nv in tiles.NV_BY_PATH.items():
        assert MR * nv + nv + 1 <= regs[name]
    assert tiles.k_block(64, 4, 48 * 1024) == 128 and tiles.k_block(32, 2, 32 * 1024) == 256
    assert tiles.k_block(64, 4, 32 * 1024) == 128 and tiles.k_block(64, 4, 16 * 1024) == 64
    assert tiles.k_block(64, 4, 4 * 1024) == 64 and tiles.k_block(16, 2, 1 << 20) == 256


def test_without_avx512_turns_off_every_avx512_feature():
    feats = "+avx2,+avx512f,+avx512vl,+evex512,-avx512fp16,+fma,+amx-tile,+avx10.1-512"
    out = isa._without_avx512(feats).split(",")
    assert "+avx2" in out and "+fma" in out and "-avx512fp16" in out
    assert not [f for f in out if f.startswith("+") and ("avx512" in f or "evex" in f or "amx" in f
                                                          or "avx10" in f)]


@pytest.mark.subprocess
@pytest.mark.any_path
@pytest.mark.parametrize("name", RUNNABLE)
def test_forced_path_reports_itself_and_reproduces_the_lesson(name):
    r = run_check("worked", TBLOCK_ISA=name)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["isa"] == name and got["forced"]
    assert got["lanes"] == {"avx512": 16, "avx2": 8, "generic": 4}[name]
    if name == "generic" and RUNNABLE[0] != "generic" and "NUMBA_CPU_NAME" not in os.environ:
        assert got["cpu"] == "generic"      # the baseline target, not the host's
    ex = tblock.load_worked_example()
    ref = tblock.forward(ex.H_in, ex.weights, ex.cfg, backend="numpy")
    np.testing.assert_allclose(np.array(got["out"]), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.array(got["out32"]), ref, rtol=2e-6, atol=2e-6)


@pytest.mark.subprocess
@pytest.mark.any_path
def test_bad_tblock_isa_is_a_clear_error_and_leaves_the_other_backends():
    r = run_check("bad_isa", TBLOCK_ISA="sse9")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert "numba" not in lines[0] and "numpy" in lines[0]
    assert lines[1].startswith("isa:") and "TBLOCK_ISA" in lines[1] and "'sse9'" in lines[1]
    assert lines[2] == "(3, 8)"
    assert lines[3].startswith("forward: BackendUnavailable") and "avx512, avx2, generic" in lines[3]


@pytest.mark.subprocess
@pytest.mark.any_path
def test_a_path_the_target_cannot_run_is_refused():
    # Numba told to compile for Haswell (AVX2, no AVX-512): the avx512 path must be refused
    r = run_check("isa", TBLOCK_ISA="avx512",
               NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="")
    assert r.returncode != 0
    assert "TBLOCK_ISA=avx512" in r.stderr and "'haswell'" in r.stderr and "at most the avx2 path" in r.stderr


@pytest.mark.subprocess
@pytest.mark.any_path
def test_numba_cpu_name_selects_the_path_without_tblock_isa():
    r = run_check("isa", TBLOCK_ISA=None,
               NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["avx2"]


@pytest.mark.subprocess
@pytest.mark.any_path
@pytest.mark.skipif(len(RUNNABLE) < 2, reason="this machine runs one path only: nothing to narrow to")
def test_narrowing_after_numba_compiled_is_refused():
    r = run_check("narrow", TBLOCK_ISA="generic", NUMBA_CPU_NAME=None, NUMBA_CPU_FEATURES=None)
    assert r.returncode != 0
    assert "already compiled" in r.stderr


@pytest.mark.subprocess
@pytest.mark.any_path
@pytest.mark.skipif(len(RUNNABLE) < 2, reason="this machine runs one path only: no other path's cache")
def test_numba_cache_never_hands_one_paths_code_to_another(tmp_path):
    a, b = RUNNABLE[0], RUNNABLE[1]
    env = dict(NUMBA_CACHE_DIR=str(tmp_path))
    runs = [(a, "miss"), (a, "hit"), (b, "miss"), (b, "hit"), (a, "hit")]
    for name, expect in runs:
        r = run_check("cached", TBLOCK_ISA=name, **env)
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["path"].startswith(str(tmp_path)) and got["path"].endswith("tblock-" + got["key"])
        assert got["key"].startswith(name + "-")
        assert (got["hits"], got["misses"]) == ((1, 0) if expect == "hit" else (0, 1)), (name, expect, got)


def test_cache_stamp_covers_every_kernel_module():
    # the block inlines code from every sibling module: the stamp is a hash of all of them
    from tblock.kernels import cache
    import hashlib
    from pathlib import Path
    here = Path(cache.__file__).parent
    h = hashlib.sha256(isa.PATH.key.encode())
    for f in sorted(here.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    assert cache._package_stamp() == h.hexdigest()
    assert {"gemm.py", "simd.py", "block.py", "attention.py"} <= {f.name for f in here.glob("*.py")}
