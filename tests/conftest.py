import numpy as np
import pytest

import tblock

# every backend that can run here; the oracle is always among them
BACKENDS = tblock.available_backends()


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


def copy_package(dest):
    """tblock as an installation lays it out (kernels/ as tblock/kernels), copied into
    ``dest`` without Numba's caches; returns ``dest`` for PYTHONPATH."""
    import shutil
    from pathlib import Path

    import tblock.kernels
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(tblock.__file__).parent, Path(dest) / "tblock", ignore=skip)
    shutil.rmtree(Path(dest) / "tblock" / "kernels", ignore_errors=True)   # an installed layout may hold one
    shutil.copytree(Path(tblock.kernels.__file__).parent, Path(dest) / "tblock" / "kernels", ignore=skip)
    return Path(dest)
