"""The interop run's record: the largest relative errors the parity tests measured, printed
at the end of ``make test-interop`` (the figures the issue asks for)."""

import importlib.util
from pathlib import Path

import pytest

ERRORS: dict[str, float] = {}       # "what, checkpoint dtype" -> max relative error seen


@pytest.fixture
def record_error():
    """record_error(what, err): keep the largest err per what for the summary."""
    def record(what: str, err: float) -> None:
        ERRORS[what] = max(ERRORS.get(what, 0.0), err)
    return record


def load_bench(name: str):
    """bench/<name>.py as a module (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[2] / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_terminal_summary(terminalreporter):
    if ERRORS:
        terminalreporter.section("tblock.GPT2 vs transformers: max relative error (max |a-b| / max |b|)")
        for what in sorted(ERRORS):
            terminalreporter.write_line(f"{what:<62} {ERRORS[what]:.2e}")
