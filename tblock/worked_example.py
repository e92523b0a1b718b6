"""Lesson 13's worked example (T=4, d_model=8, 2 heads, d_ff=32), shipped as package data.

``tblock/data/seed13_block.json`` holds the weights drawn by the lesson's own generator
with seed(13) and every intermediate the lesson computed from them. ``LESSON_PRINTED``
holds the numbers the lesson's text prints, typed in from the lesson, so they are a
second, independent source for the same example.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

import numpy as np

from .config import BlockConfig
from .weights import BlockWeights

# The numbers the lesson prints, as printed (the 6-digit ones to 6 digits).
LESSON_PRINTED = {
    "norm_H_in": 6.069769106017517,
    "norm_H_mid": 9.195808939486904,
    "norm_H_out": 10.544696449259169,
    "mha_ratio": 0.9873622796827375,     # |A_out| / |H_in|
    "ffn_ratio": 0.5208642158653086,     # |F_out| / |H_mid|
    "H_mid_row1_first4": [1.114650853792557, -1.3444806749068605, 1.0992947175874568, 0.2117387088439008],
    "A_1": [[1.000000, 0.000000, 0.000000, 0.000000],
            [0.060243, 0.939757, 0.000000, 0.000000],
            [0.066182, 0.699757, 0.234061, 0.000000],
            [0.066049, 0.209946, 0.502133, 0.221872]],
    "A_2_row4": [0.363668, 0.045474, 0.079966, 0.510892],
    "entropy_bound_bits": [0.000000, 1.000000, 1.584963, 2.000000],
    "entropy_head1_bits": [0.000000, 0.328409, 1.110058, 1.712712],
    "entropy_head2_bits": [0.000000, 0.910635, 1.531749, 1.519905],
    "perturb_token": 3,                  # 1-based, as the lesson: bump channel 1 of token 3 by +1
    "perturb_mha_sums": [0.000000, 0.000000, 0.775304, 0.351612],
    "perturb_ffn_sums": [0.000000, 0.000000, 1.758853, 0.000000],
    "params": 808,
    "params_with_ln_affine": 840,
}

# JSON key -> BlockWeights field
_WEIGHT_KEYS = {"W_Q": "w_q", "W_K": "w_k", "W_V": "w_v", "W_O": "w_o", "W_ff1": "w_ff1", "W_ff2": "w_ff2"}


@dataclass(frozen=True)
class WorkedExample:
    cfg: BlockConfig
    H_in: np.ndarray            # (4, 8) float64
    weights: BlockWeights       # float64, as the lesson drew them
    expected: dict              # every intermediate the lesson computed, by its lesson name


def load_worked_example() -> WorkedExample:
    raw = json.loads(resources.files("tblock.data").joinpath("seed13_block.json").read_text())
    c = raw["meta"]["config"]
    cfg = BlockConfig(d_model=c["d_model"], n_heads=c["n_heads"], d_ff=c["d_ff"], causal=c["causal"],
                      norm=c["norm"], activation="gelu_" + c["gelu"], eps=c["eps"])
    arrays = {k: np.array(v, dtype=np.float64) for k, v in raw.items() if k != "meta"}
    weights = BlockWeights(**{field: arrays[key] for key, field in _WEIGHT_KEYS.items()})
    expected = {k: v for k, v in arrays.items() if k not in _WEIGHT_KEYS and k != "H_in"}
    return WorkedExample(cfg=cfg, H_in=arrays["H_in"], weights=weights, expected=expected)
