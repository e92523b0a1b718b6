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


def _fork_while_compiling(wait_s, typing_s):
    try:
        p = subprocess.run(proc("fork_while_compiling", wait_s, typing_s), capture_output=True, text=True,
                           timeout=400)
    except subprocess.TimeoutExpired:
        pytest.fail("the parent hung forking while another thread compiled")
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    return p.stdout.splitlines()


@pytest.mark.subprocess
def test_a_fork_while_another_thread_compiles_waits_for_it():
    """Issue #31: the child inherited Numba's compiler lock held by a thread it does not
    have, and its first compile waited forever. The fork now waits for the compile (2 s
    here), and the child compiles and runs tblock."""
    lines = _fork_while_compiling(wait_s=120, typing_s=2)
    assert lines == ["child compiled True", "parent compiled True child exit 0"]


@pytest.mark.subprocess
def test_a_fork_that_cannot_wait_gives_a_child_that_refuses_to_compile():
    """A compile longer than FORK_WAIT_S (0.5 s against 5 s here): the fork goes ahead and
    the child's compile raises a RuntimeError saying why, instead of hanging."""
    lines = _fork_while_compiling(wait_s=0.5, typing_s=5)
    assert lines[0].startswith("child refused: tblock: this process was forked while another thread "
                               "was compiling with Numba"), lines
    assert lines[1] == "parent compiled True child exit 3"
