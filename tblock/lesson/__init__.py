"""Lesson 13 as code, beside the library: the walk-through and the lesson's lenses and sidebars.

    command    ``tblock lesson``: the worked example beside the lesson's printed numbers, its figures
    analysis   perturbation test, residual norms, per-block gain, stack traces, filter-bank entropies
    dropout    the four dropout points, train and eval
    encdec     encoder and decoder blocks with cross-attention
    demo       the interactive demo's tiny language model and its tracer

Each runs on every backend. Import them by their place, e.g. ``from tblock.lesson import analysis``.
"""

from .command import FIGURES, run_lesson, walkthrough, write_figures

__all__ = ["FIGURES", "run_lesson", "walkthrough", "write_figures"]
