"""tblock's thread count at start in this process's environment (tests/test_threads.py):
python thread_count.py.  Prints the count, then whether Numba's pool has started (it must
not have: tblock.peers.import_early relies on it)."""

import tblock  # isort: skip  (first, as a program using tblock would)
import numba.np.ufunc.parallel as p  # isort: skip

n = tblock.get_num_threads()
tblock.set_num_threads(1)
print(n, p._is_initialized)
