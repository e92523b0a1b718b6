"""The trained byte-level GPT-2 (tests/data/tiny_gpt2) in float32: tblock's held-out
perplexity equals transformers' on the same windows (``make test-interop``).

The windows are tblock.models.accuracy's (non-overlapping, 256 bytes, every position
scored); transformers' float32 logits go through a float64 log-softmax here, so the two
perplexities differ only by the two float32 forward passes.  This anchors
tests/test_quant_accuracy.py: its float32 reference is the model transformers computes.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel

from tblock import GPT2
from tblock.models.accuracy import perplexity, windows

pytestmark = pytest.mark.interop

DATA = Path(__file__).resolve().parents[1] / "data" / "tiny_gpt2"
TOL = 1e-5          # relative, on the perplexity


def torch_perplexity(peer, inputs: np.ndarray, targets: np.ndarray) -> float:
    with torch.no_grad():
        logits = peer(torch.from_numpy(inputs)).logits.double()
    logp = torch.log_softmax(logits, dim=-1).numpy()
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1).mean()
    return float(np.exp(nll))


@pytest.mark.parametrize("backend, positions", [("numba", None), ("numpy", 10_240)])
def test_perplexity_matches_transformers(backend, positions, record_error):
    heldout = np.frombuffer((DATA / "heldout.txt").read_bytes(), np.uint8)
    peer = GPT2LMHeadModel.from_pretrained(DATA).float().eval()
    inputs, targets = windows(heldout, 256, positions)
    theirs = torch_perplexity(peer, inputs, targets)
    ours = perplexity(GPT2.from_pretrained(DATA), heldout, positions=positions, backend=backend)
    err = abs(ours / theirs - 1)
    record_error(f"tiny_gpt2 held-out perplexity ({targets.size} positions), {backend}", err)
    assert targets.size >= 10_000
    assert err <= TOL, (ours, theirs)
