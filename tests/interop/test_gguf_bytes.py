"""tblock.formats' bytes against llama.cpp's own quantizers (the gguf package): bf16, Q8_0
and Q4_0 of the same float32 rows must be the same bytes, so a GGUF file llama.cpp writes
holds exactly what tblock.quantize would (``make test-interop``)."""

import gguf
import numpy as np
import pytest
from gguf import quants
from hypothesis import given, settings
from hypothesis import strategies as st

from tblock.formats import quantize_matrix

pytestmark = pytest.mark.interop

PEER = {"bf16": gguf.GGMLQuantizationType.BF16, "int8": gguf.GGMLQuantizationType.Q8_0,
        "int4": gguf.GGMLQuantizationType.Q4_0}


@settings(max_examples=40, deadline=None)
@given(fmt=st.sampled_from(sorted(PEER)), blocks=st.integers(1, 6), cols=st.integers(1, 40),
       scale=st.sampled_from([1e-7, 1e-3, 1.0, 1e3]), seed=st.integers(0, 2**32 - 1))
def test_same_bytes_as_llama_cpp(fmt, blocks, cols, scale, seed):
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((32 * blocks, cols)) * scale).astype(np.float32)
    W[:32, 0] = 0                                       # an all-zero block
    W[:, -1] = np.round(W[:, -1] / scale * 4) / 4 * scale    # ties of the rounding
    ours = quantize_matrix(W, fmt).data
    theirs = quants.quantize(np.ascontiguousarray(W.T), PEER[fmt])     # one row per output, as stored
    assert ours.view(np.uint8).tobytes() == theirs.view(np.uint8).tobytes()
