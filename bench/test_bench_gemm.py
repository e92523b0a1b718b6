"""The machine's ceiling: an n x n matrix product through numpy's BLAS, float32 and float64.

The component benchmarks' GFLOP/s read against these (tblock report measures the same
thing once per run and prints '% of ceiling')."""

import numpy as np
import pytest

SIZES = (256, 1024, 2048)


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    return request.param


@pytest.mark.parametrize("n", SIZES)
def test_gemm_ceiling(benchmark, n, dtype, settings):
    if settings["smoke"] and n > SIZES[0]:
        pytest.skip("--smoke: the smallest GEMM only")
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    np.matmul(a, b)                     # warm-up: first touch, BLAS thread start
    benchmark.group = "gemm ceiling"
    benchmark.extra_info.update(n=n, dtype=dtype, flops=2 * n ** 3, library="numpy " + np.__version__)
    out = benchmark.pedantic(np.matmul, args=(a, b), rounds=1 if settings["smoke"] else 5, iterations=1)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        benchmark.extra_info["gflops"] = 2 * n ** 3 / stats.stats.median / 1e9
    assert out.shape == (n, n)
