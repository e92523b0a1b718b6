"""Fork safety (issue #13): children made after a parallel call finish with the parent's results.

On the GNU OpenMP layer a child forked after a parallel region runs the serial block
(tblock._runtime.serial_only), equal to the parallel one up to rounding; spawned children, and every child on the workqueue layer,
run in parallel.

Each case runs in a fresh interpreter with a timeout, so a child that dies and leaves its
parent waiting fails the test instead of hanging the suite."""

import os
import subprocess

import pytest
from conftest import proc

from tblock.backends import numba as nb

def test_the_scripts_call_is_parallel():
    assert nb.packing.block_flops(1, 256, 64, 256, True) >= nb.parallel.PARALLEL_MIN_FLOPS


LAYERS = ["default", "workqueue"]     # Numba's own choice (OpenMP where libgomp is found)


def _env(layer):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_THREADING_LAYER")}
    return env if layer == "default" else {**env, "NUMBA_THREADING_LAYER": layer}


@pytest.mark.subprocess
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn", "pool"])
def test_children_after_a_parallel_call(method, layer):
    try:
        p = subprocess.run(proc("fork_children", method), capture_output=True, text=True,
                           timeout=300, env=_env(layer))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{method}: the parent hung after forking")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[0] == "ok"
    if layer != "default":
        assert p.stdout.split()[1] == layer


@pytest.mark.subprocess
def test_a_forked_child_of_an_openmp_parent_runs_serially():
    """The child knows it must not enter OpenMP code: forward runs the serial block (the
    test above checks its bits), and any other parallel call raises instead of Numba
    killing the process."""
    p = subprocess.run(proc("fork_children", "probe"), capture_output=True, text=True, timeout=300,
                       env=_env("default"))
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    if lines[0] != "omp":
        pytest.skip(f"Numba chose the {lines[0]} layer here (no GNU OpenMP); nothing to fall back from")
    assert lines[1].startswith("fork True parallel code cannot run in a child forked")
    assert lines[2] == "spawn False ran"


@pytest.mark.subprocess
def test_tblock_leaves_numbas_threading_layer_alone():
    run = lambda env: subprocess.run(proc("import_check", "threading_layer"), capture_output=True, text=True,
                                     timeout=120, env=env).stdout.strip()
    assert run(_env("default")) == "default"
    assert run(_env("workqueue")) == "workqueue"
