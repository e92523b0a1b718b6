"""Fork safety (issue #13): children made after a parallel call finish with the parent's results.

On the GNU OpenMP layer a child forked after a parallel region runs the serial block
(tblock._runtime.serial_only), equal to the parallel one up to rounding; spawned children, and every child on the workqueue layer,
run in parallel.

Each case runs in a fresh interpreter with a timeout, so a child that dies and leaves its
parent waiting fails the test instead of hanging the suite."""

import os
import subprocess
import sys

import pytest

from tblock.backends import numba as nb

SCRIPT = r'''
import multiprocessing as mp, sys
import numba, numpy as np, tblock

def run(_=None):
    cfg = tblock.BlockConfig(d_model=64, n_heads=4)
    w = tblock.init_weights(cfg, seed=0)
    H = np.random.default_rng(1).standard_normal((256, 64)).astype(np.float32)
    return tblock.forward(H, w, cfg)

def child(q):
    q.put(run())

def probe(q):
    from tblock import _runtime
    from tblock.backends import numba as nb
    try:
        nb.parallel.parallel_call(lambda: None)
        q.put((_runtime.serial_only(), "ran"))
    except RuntimeError as e:
        q.put((_runtime.serial_only(), str(e)))

if __name__ == "__main__":
    method = sys.argv[1]
    parent = run()                  # parallel: Numba's pool is running from here on
    if method == "pool":
        with mp.get_context("fork").Pool(2) as pool:
            outs = pool.map_async(run, range(2)).get(timeout=120)
    else:
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        outs = [q.get(timeout=120)]
        p.join(60)
        assert p.exitcode == 0, f"child exit code {p.exitcode}"
    # a child forked after an OpenMP region runs the serial build: equal up to rounding
    assert all(np.allclose(o, parent, rtol=1e-5, atol=1e-5 * np.abs(parent).max()) for o in outs), \
        "a child computed something else"
    print("ok", numba.threading_layer())

'''


def test_the_scripts_call_is_parallel():
    assert nb.packing.block_flops(1, 256, 64, 256, True) >= nb.parallel.PARALLEL_MIN_FLOPS


LAYERS = ["default", "workqueue"]     # Numba's own choice (OpenMP where libgomp is found)


def _env(layer):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_THREADING_LAYER")}
    return env if layer == "default" else {**env, "NUMBA_THREADING_LAYER": layer}


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn", "pool"])
def test_children_after_a_parallel_call(method, layer, tmp_path):
    script = tmp_path / "forking.py"
    script.write_text(SCRIPT)
    try:
        p = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True,
                           timeout=300, env=_env(layer))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{method}: the parent hung after forking")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[0] == "ok"
    if layer != "default":
        assert p.stdout.split()[1] == layer


PROBE = SCRIPT.split('if __name__ == "__main__":')[0] + r'''
if __name__ == "__main__":
    run()
    import numba
    print(numba.threading_layer())
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=probe, args=(q,))
        p.start()
        print(method, *q.get(timeout=120))
        p.join(60)
'''


def test_a_forked_child_of_an_openmp_parent_runs_serially(tmp_path):
    """The child knows it must not enter OpenMP code: forward runs the serial block (the
    test above checks its bits), and any other parallel call raises instead of Numba
    killing the process."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       env=_env("default"))
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    if lines[0] != "omp":
        pytest.skip(f"Numba chose the {lines[0]} layer here (no GNU OpenMP); nothing to fall back from")
    assert lines[1].startswith("fork True parallel code cannot run in a child forked")
    assert lines[2] == "spawn False ran"


def test_tblock_leaves_numbas_threading_layer_alone():
    code = "import tblock, numba; print(numba.config.THREADING_LAYER)"
    run = lambda env: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                     timeout=120, env=env).stdout.strip()
    assert run(_env("default")) == "default"
    assert run(_env("workqueue")) == "workqueue"
