"""tblock.set_num_threads / get_num_threads / threads(n) (issue #13): one count for the whole
process, applied to calls from any Python thread; the environment's count at start.
threads() blocks overlapping across Python threads (issue #31): the newest open block's count
is in force, and once every block has exited, in any order, the process's count again."""

import os
import queue
import random
import subprocess
import sys
import threading
import time

import numba
import numpy as np
import pytest
from conftest import proc

import tblock
from tblock.backends import numba as nb

POOL = numba.config.NUMBA_NUM_THREADS


@pytest.fixture(autouse=True)
def restore_count():
    before = tblock.get_num_threads()
    yield
    tblock.set_num_threads(before)


@pytest.fixture
def parallel_case():
    cfg = tblock.BlockConfig(d_model=64, n_heads=4)
    w = tblock.init_weights(cfg, seed=3)
    H = np.random.default_rng(3).standard_normal((2, 300, 64)).astype(np.float32)
    assert nb.packing.block_flops(2, 300, 64, 256, True) >= nb.parallel.PARALLEL_MIN_FLOPS
    return cfg, w, H


@pytest.fixture
def seen(monkeypatch):
    """What each block call ran on: ("serial",) or ("parallel", nthr argument, Numba's count
    in the calling thread); one thread runs the serial block (the same bits)."""
    calls = []
    serial, parallel = nb.forward.block_serial, nb.forward.block_parallel

    def spy_serial(*args):
        calls.append(("serial",))
        return serial(*args)

    def spy_parallel(*args):
        calls.append(("parallel", args[-1], numba.get_num_threads()))
        return parallel(*args)
    monkeypatch.setattr(nb.forward, "block_serial", spy_serial)
    monkeypatch.setattr(nb.forward, "block_parallel", spy_parallel)
    return calls


def expected(n):
    return ("serial",) if n == 1 else ("parallel", n, n)


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(300)
    assert out, "the thread failed"
    return out[0]


def test_another_thread_sees_the_setting(parallel_case, seen):
    cfg, w, H = parallel_case
    for n in sorted({1, POOL}):
        tblock.set_num_threads(n)
        _in_thread(lambda: tblock.forward(H, w, cfg))
        assert seen[-1] == expected(n)
        assert _in_thread(tblock.get_num_threads) == n


def test_the_context_applies_to_the_body_and_restores(parallel_case, seen):
    cfg, w, H = parallel_case
    tblock.set_num_threads(POOL)
    with tblock.threads(1):
        assert tblock.get_num_threads() == 1
        _in_thread(lambda: tblock.forward(H, w, cfg))
        assert seen[-1] == expected(1)
    assert tblock.get_num_threads() == POOL
    _in_thread(lambda: tblock.forward(H, w, cfg))
    assert seen[-1] == expected(POOL)
    with pytest.raises(RuntimeError):
        with tblock.threads(1):
            raise RuntimeError("the body fails")
    assert tblock.get_num_threads() == POOL


@pytest.mark.skipif(POOL < 2, reason="Numba's pool has one thread here (NUMBA_NUM_THREADS)")
def test_numbas_own_count_in_the_caller_is_put_back(parallel_case, seen):
    cfg, w, H = parallel_case
    mine = numba.get_num_threads()
    numba.set_num_threads(1)            # the caller's own, thread-local setting
    try:
        tblock.set_num_threads(POOL)
        tblock.forward(H, w, cfg)
        assert seen[-1] == expected(POOL) and numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(mine)


@pytest.mark.skipif(POOL < 2, reason="Numba's pool has one thread here (NUMBA_NUM_THREADS)")
def test_one_and_two_threads_give_identical_results(parallel_case):
    """One thread runs the serial build, two the parallel one: the same sums in the same
    order, equal up to the rounding of the two fast-math compiles (kernels/block.py)."""
    cfg, w, H = parallel_case
    with tblock.threads(1):
        one = tblock.forward(H, w, cfg)
    with tblock.threads(2):
        two = tblock.forward(H, w, cfg)
    np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-5 * np.abs(one).max())


class Worker:
    """A real Python thread that opens and closes threads() blocks, or sets the count, when
    told to: a schedule decides the interleaving, each step done before the next is sent."""

    def __init__(self):
        self.todo, self.done, self.blocks = queue.Queue(), queue.Queue(), []
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            op, n = self.todo.get()
            if op == "stop":
                return
            try:
                if op == "enter":
                    block = tblock.threads(n)
                    block.__enter__()
                    self.blocks.append(block)
                elif op == "exit":
                    self.blocks.pop().__exit__(None, None, None)
                else:
                    tblock.set_num_threads(n)
                self.done.put(tblock.get_num_threads())
            except BaseException as e:          # reported to the test, not lost in the thread
                self.done.put(e)

    def do(self, op, n=None):
        self.todo.put((op, n))
        got = self.done.get(timeout=60)
        if isinstance(got, BaseException):
            raise got
        return got


class Model:
    """The documented rule, written independently: open blocks in the order entered, each
    owned by a thread; the newest one's count is in force, else the process's."""

    def __init__(self, base):
        self.base, self.open = base, []

    def apply(self, who, op, n):
        mine = [i for i, b in enumerate(self.open) if b[0] == who]
        if op == "enter":
            self.open.append([who, n])
        elif op == "exit":
            del self.open[mine[-1]]
        elif mine:
            self.open[mine[-1]][1] = n                      # set inside a block: that block's count
        else:
            self.base = n
        return self.now()

    def now(self):
        return self.open[-1][1] if self.open else self.base


def _run_schedule(workers, schedule, base):
    model = Model(base)
    for who, op, n in schedule:
        assert workers[who].do(op, n) == model.apply(who, op, n), (who, op, n)
        assert tblock.get_num_threads() == model.now()          # the same in every thread
    for who, w in enumerate(workers):           # every block exits, newest first in each thread
        while w.blocks:
            w.do("exit")
            model.apply(who, "exit", None)
    return model


@pytest.mark.skipif(POOL < 2, reason="Numba's pool has one thread here: every count is 1")
def test_overlapping_blocks_in_two_threads_put_the_count_back():
    """The probe of issue #31: A enters, B enters, A exits, B exits; and A exiting last."""
    for last in ("a", "b"):
        tblock.set_num_threads(POOL)
        a, b = Worker(), Worker()
        try:
            assert a.do("enter", 1) == 1
            assert b.do("enter", 2) == 2
            first, second = (b, a) if last == "a" else (a, b)
            assert first.do("exit") == (1 if first is b else 2)     # the other block still holds
            assert second.do("exit") == POOL
            assert tblock.get_num_threads() == POOL
        finally:
            for w in (a, b):
                w.todo.put(("stop", None))


@pytest.mark.skipif(POOL < 2, reason="Numba's pool has one thread here: every count is 1")
@pytest.mark.parametrize("seed", range(12))
def test_random_interleavings_follow_the_rule(seed):
    """Three threads open, close and set in a random order; after each step the count is the
    model's, and after every block has exited it is the process's count."""
    rng = random.Random(seed)
    tblock.set_num_threads(POOL)
    workers = [Worker() for _ in range(3)]
    try:
        schedule, depth = [], [0, 0, 0]
        for _ in range(60):
            who = rng.randrange(3)
            op = rng.choice(["enter", "enter", "exit", "set"] if depth[who] else ["enter", "set"])
            depth[who] += {"enter": 1, "exit": -1, "set": 0}[op]
            schedule.append((who, op, rng.randint(1, POOL) if op != "exit" else None))
        model = _run_schedule(workers, schedule, POOL)
        assert not model.open and tblock.get_num_threads() == model.base
    finally:
        for w in workers:
            w.todo.put(("stop", None))


@pytest.mark.skipif(POOL < 2, reason="Numba's pool has one thread here: every count is 1")
def test_free_running_threads_leave_the_count_as_set():
    """No schedule: four threads nest blocks as fast as they can, switching often."""
    tblock.set_num_threads(POOL)
    errors = []

    def churn(seed):
        rng = random.Random(seed)
        try:
            for _ in range(300):
                with tblock.threads(rng.randint(1, POOL)):
                    assert 1 <= tblock.get_num_threads() <= POOL
                    with tblock.threads(rng.randint(1, POOL)):
                        time.sleep(rng.random() * 1e-4)
        except BaseException as e:
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        ts = [threading.Thread(target=churn, args=(s,)) for s in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors
    assert tblock.get_num_threads() == POOL


@pytest.mark.subprocess
@pytest.mark.skipif(POOL < 2, reason="Numba's pool has one thread here: every count is 1")
def test_a_forked_child_drops_the_blocks_of_threads_it_has_not():
    p = subprocess.run(proc("threads_fork", POOL), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(POOL), "1", str(POOL)]


@pytest.mark.parametrize("n,error,needle", [
    (0, ValueError, f"n must be between 1 and {POOL}"), (POOL + 1, ValueError, f"got {POOL + 1}"),
    (-2, ValueError, "got -2"), (2.0, TypeError, "n must be an int, got float"),
    (True, TypeError, "got bool"), ("2", TypeError, "got str"), (None, TypeError, "got NoneType"),
])
def test_bad_counts_are_refused(n, error, needle):
    before = tblock.get_num_threads()
    with pytest.raises(error, match=needle):
        tblock.set_num_threads(n)
    with pytest.raises(error, match=needle):
        with tblock.threads(n):
            pass
    assert tblock.get_num_threads() == before


def test_numpy_integers_are_counts():
    tblock.set_num_threads(np.int64(1))
    assert tblock.get_num_threads() == 1 and type(tblock.get_num_threads()) is int


def _count_in_child(**env):
    """tblock's count at start in a fresh process with this environment, and whether
    Numba's pool has started (it must not be: tblock.peers.import_early relies on it)."""
    base = {k: v for k, v in os.environ.items() if k not in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS")}
    p = subprocess.run(proc("thread_count"), capture_output=True, text=True, timeout=120,
                       env={**base, **env})
    assert p.returncode == 0, p.stderr
    return p.stdout.split(), p.stderr


@pytest.mark.subprocess
def test_the_environment_sets_the_starting_count():
    assert _count_in_child()[0] == [str(POOL), "False"]           # and the pool is not started
    assert _count_in_child(NUMBA_NUM_THREADS="1")[0] == ["1", "False"]
    assert _count_in_child(OMP_NUM_THREADS="1")[0] == ["1", "False"]
    assert _count_in_child(OMP_NUM_THREADS="1,1")[0] == ["1", "False"]
    assert _count_in_child(OMP_NUM_THREADS=str(POOL + 5))[0] == [str(POOL), "False"]
    out, err = _count_in_child(OMP_NUM_THREADS="lots")
    assert out == [str(POOL), "False"] and "OMP_NUM_THREADS='lots' is not a positive integer" in err
