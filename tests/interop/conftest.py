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


def perturb_llama(model):
    """A random Llama-family model made like a trained one, in place: norm gains and biases
    off 1 and 0, embeddings of O(1), Linear weights (out, in) giving activations of O(1)
    (HF's N(0, 0.02) leaves attention nearly uniform and the FFN nearly linear)."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    return model


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
