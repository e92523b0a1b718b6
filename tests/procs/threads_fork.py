"""A fork while another Python thread is inside a ``tblock.threads(1)`` block
(tests/test_threads.py): python threads_fork.py POOL.  Prints the child's count (the
other thread's block is not in the child: the process's count), the parent's count while
the block is open, then the parent's count after it closed."""

import os
import sys
import threading

import tblock

tblock.set_num_threads(int(sys.argv[1]))
inside, leave = threading.Event(), threading.Event()


def other():
    with tblock.threads(1):
        inside.set()
        leave.wait()


t = threading.Thread(target=other)
t.start()
inside.wait()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, str(tblock.get_num_threads()).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 16).decode(), tblock.get_num_threads())
leave.set()
t.join()
print(tblock.get_num_threads())
