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
