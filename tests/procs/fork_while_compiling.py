"""A fork while another thread compiles with Numba (tests/test_fork.py): python
fork_while_compiling.py FORK_WAIT_S TYPING_S.  The other thread's compile holds Numba's
compiler lock for TYPING_S seconds (an intrinsic typed slowly); the child compiles a new
function and runs tblock.  Prints the child's outcome ("child compiled True" or "child
refused: <error>"), then the parent's; "child hung" where the child was still blocked
after 120 s (it is killed)."""

import os
import sys
import threading
import time

import numba
import numpy as np
from numba.extending import intrinsic

import tblock
from tblock import _runtime

_runtime.FORK_WAIT_S = float(sys.argv[1])
typing_s = float(sys.argv[2])
cfg = tblock.BlockConfig(d_model=16, n_heads=2)
w = tblock.init_weights(cfg, seed=0)
H = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
want = tblock.forward(H, w, cfg, backend="numpy")
tblock.forward(H, w, cfg)               # compiled (or loaded) here, before the thread starts
started = threading.Event()


@intrinsic
def slow_to_type(typingctx, x):         # typed inside Numba's compile, under its compiler lock
    started.set()
    time.sleep(typing_s)

    def codegen(context, builder, signature, args):
        return args[0]
    return x(x), codegen


@numba.njit
def slow(x):
    return slow_to_type(x)


t = threading.Thread(target=slow, args=(1,))
t.start()
assert started.wait(120)
sys.stdout.flush()
pid = os.fork()                         # while the other thread compiles
if pid == 0:
    try:
        plus_one = numba.njit(lambda x: x + 1)      # a new compile in the child
        ok = plus_one(1) == 2 and np.allclose(tblock.forward(H, w, cfg), want, atol=1e-5)
        print("child compiled", ok, flush=True)
        os._exit(0)
    except RuntimeError as e:
        print("child refused:", e, flush=True)
        os._exit(3)
deadline = time.monotonic() + 120
while True:                             # a child still running at the deadline is hung
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        print("child hung", flush=True)
        os._exit(1)
    time.sleep(0.05)
t.join()
print("parent compiled", slow(2) == 2, "child exit", os.waitstatus_to_exitcode(status))
