"""Children made after a parallel call (tests/test_fork.py): python fork_children.py METHOD.

METHOD fork, forkserver or spawn: one child process by that start method; pool: a forked
Pool of two.  Each child computes the block the parent computed in parallel; prints "ok"
and Numba's threading layer when every child's output equals the parent's up to rounding.

METHOD probe: prints the threading layer, then for a forked and a spawned child whether
it runs serially and what a parallel call does there ("ran" or the error's message)."""

import multiprocessing as mp
import sys

import numba
import numpy as np

import tblock


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


def children(method):
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


def probes():
    run()
    print(numba.threading_layer())
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=probe, args=(q,))
        p.start()
        print(method, *q.get(timeout=120))
        p.join(60)


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        probes()
    else:
        children(sys.argv[1])
