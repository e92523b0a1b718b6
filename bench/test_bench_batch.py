"""bench_batch.py's flow at --quick, tblock's contenders only: generate_many's greedy tokens
must equal the loop of single generate calls' (bench_batch compares them), and every row
carries its rates and floor.  Its own cache (a tiny checkpoint, written with torch): nothing
is built or downloaded, nothing under ~/.cache is read."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("weights", [[], ["--weights", "int8", "--dot", "int8"]])
def test_quick_run_tblock_contenders(tmp_path, weights):
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("the checkpoint is written by transformers' save_pretrained: transformers and torch needed")
    out = tmp_path / "batch.json"
    p = subprocess.run([sys.executable, str(HERE / "bench_batch.py"), "--quick", "--peers", "many,loop",
                        "--no-install", "--cache", str(tmp_path / "cache"), "--json", str(out)] + weights,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    record = json.loads(out.read_text())
    rows = {(r["job"], r["batch"]): r for r in record["rows"]}
    assert not record["skipped"], record["skipped"]
    assert set(rows) == {("loop", 1), ("many", 2), ("many", 4)}
    n = record["settings"]["prompts"]
    for key in (("many", 2), ("many", 4)):
        assert rows[key]["agree"] == f"{n}/{n}", key        # generate_many's tokens are generate's
    for r in rows.values():
        assert r["wall_median_s"] > 0 and r["floor_s"] > 0
        total = sum(record["lengths"]) + n * record["settings"]["new"]
        assert r["total_tps"] == pytest.approx(total / r["wall_median_s"])
    assert [x["batch"] for x in record["ratios_total_tps"]] == [2, 4]
    assert "| tblock generate_many |" in p.stdout
    assert {r["weights"] for r in rows.values()} == {"int8/int8" if weights else "fp32"}
