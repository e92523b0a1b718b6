"""The interop run's record: the largest relative errors the parity tests measured, printed
at the end of ``make test-interop`` (the figures the issue asks for)."""

import subprocess
import sys
from pathlib import Path

import pytest

ERRORS: dict[str, float] = {}       # "what, checkpoint dtype" -> max relative error seen


@pytest.fixture
def record_error():
    """record_error(what, err): keep the largest err per what for the summary."""
    def record(what: str, err: float) -> None:
        ERRORS[what] = max(ERRORS.get(what, 0.0), err)
    return record


def run_bench(name: str, *args) -> subprocess.CompletedProcess:
    """bench/<name>.py run as a script with ``args`` (as `make bench-...` runs it); it must succeed."""
    script = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
    p = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def pytest_terminal_summary(terminalreporter):
    if ERRORS:
        terminalreporter.section("tblock's models vs transformers: max relative error (max |a-b| / max |b|)")
        for what in sorted(ERRORS):
            terminalreporter.write_line(f"{what:<62} {ERRORS[what]:.2e}")
