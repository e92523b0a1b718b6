"""The vector paths this machine can run other than the one tblock chose (make test-isa
re-runs the isa-marked tests on each): python other_paths.py prints them on one line."""

import tblock
from tblock.kernels.isa import PATH

print(*[p for p in PATH.runnable if p != tblock.isa()])
