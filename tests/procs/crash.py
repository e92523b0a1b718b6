"""A child that ends one way (tests/test_peers.py, compare_peers' child_failure):
python crash.py HOW, HOW one of ok, segv (killed by SIGSEGV), raise (a RuntimeError),
exit3 (sys.exit(3))."""

import os
import signal
import sys

how = sys.argv[1]
if how == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
elif how == "raise":
    raise RuntimeError("the peer broke")
elif how == "exit3":
    sys.exit(3)
elif how != "ok":
    sys.exit(f"crash.py: unknown HOW {how!r}")
