"""The benchmark suite in bench/ is not part of the default test run (it takes minutes);
this runs it once at tiny sizes so it cannot rot unnoticed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

pytest.importorskip("pytest_benchmark")

ROOT = Path(__file__).resolve().parent.parent


def run_bench(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "pytest", "bench", "--smoke", "-q", "-p", "no:cacheprovider",
                           "-rs", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_bench_suite_runs_at_smoke_sizes():
    r = run_bench("--benchmark-disable")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "error" not in r.stdout.lower().split("short test summary")[0]
    # at least every component of the oracle at the three smoke sizes, and two GEMMs, ran
    passed = int(r.stdout.split(" passed")[0].split()[-1])
    assert passed >= 3 * 6 + 2, r.stdout[-2000:]


def test_bench_json_is_self_describing(tmp_path):
    out = tmp_path / "bench.json"
    r = run_bench("-k", "numpy- and d8-T4", f"--benchmark-json={out}")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    data = json.loads(out.read_text())
    benches = data["benchmarks"]
    assert {b["extra_info"]["component"] for b in benches} == {
        "layernorm", "softmax", "attention_core", "attention", "ffn", "block"}
    for b in benches:
        info = b["extra_info"]
        for key in ("T", "d_model", "n_heads", "backend", "dtype", "flops_full", "flops_causal", "gflops",
                    "first_call_s", "threads"):
            assert key in info, key
        assert info["backend"] == "numpy" and info["T"] == 4 and info["d_model"] == 8
        assert info["gflops"] == pytest.approx(info["flops"] / b["stats"]["median"] / 1e9)
    machine = data["machine_info"]["tblock"]
    assert machine["threads"]["requested"] >= 1 and machine["cpu"] and machine["blas"]
