"""The Numba releases tblock is tested with, named.

kernels.options subclasses Numba's CPUDispatcher and reaches into its target context's
registry, its code libraries and its parfor lowering, none of them public API, so
pyproject.toml pins Numba to these releases (tests/test_architecture.py checks that the pin
has an upper bound).  Widen it only after the suite has passed on a new release, here too."""

from __future__ import annotations

import numba
from test_architecture import in_range, numba_requirement

TESTED = ">=0.68,<0.69"         # every 0.68.x release: 0.68.1 when this was written


def test_numba_is_pinned_to_the_named_releases_and_one_of_them_is_installed():
    assert numba_requirement() == f"numba{TESTED}"
    assert in_range(numba.__version__, TESTED), f"numba {numba.__version__} is installed, outside {TESTED}"
