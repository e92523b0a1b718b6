"""Fork safety (issue #13): children made after a parallel call finish with the parent's results.

Each case runs in a fresh interpreter with a timeout, so a child that dies and leaves its
parent waiting fails the test instead of hanging the suite."""

import os
import subprocess
import sys

import pytest

from tblock import _numba_backend as nb

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
    assert all(np.array_equal(o, parent) for o in outs), "a child computed something else"
    print("ok", numba.threading_layer())
'''


def test_the_scripts_call_is_parallel():
    assert nb._block_flops(1, 256, 64, 256, True) >= nb.PARALLEL_MIN_FLOPS


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn", "pool"])
def test_children_after_a_parallel_call(method, tmp_path):
    script = tmp_path / "forking.py"
    script.write_text(SCRIPT)
    try:
        p = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{method}: the parent hung after forking")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["ok", "workqueue"]


def test_a_users_threading_layer_is_kept():
    code = "import tblock, numba; print(numba.config.THREADING_LAYER)"
    env_run = lambda env: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                         timeout=120, env=env).stdout.strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_THREADING_LAYER")}
    assert env_run(env) == "workqueue"
    assert env_run({**env, "NUMBA_THREADING_LAYER": "safe"}) == "safe"
