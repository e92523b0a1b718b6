"""Measurement, shared by ``tblock report``, bench/conftest.py and bench/compare_peers.py.

    machine  the machine's facts (CPU, BLAS, versions, commit) and the thread pinning
    timing   the one timing harness: warm-up, repeats and medians, interleaved rounds,
             calls paired side by side, the T grid, a progress bar
    peak     the float32 FMA peak at tblock's vector width (imported by name: it compiles)
"""

from .machine import (blas_info, cpu_info, cpu_model, git_commit, machine_info, package_version, pin_threads,
                      pinned_threads, usable_cores, vector_path, versions)
from .timing import Progress, first_calls, interleaved, measure, paired, seconds, settle, t_grid

__all__ = ["Progress", "blas_info", "cpu_info", "cpu_model", "first_calls", "git_commit", "interleaved",
           "machine_info", "measure", "package_version", "paired", "pin_threads", "pinned_threads", "seconds", "settle",
           "t_grid", "usable_cores", "vector_path", "versions"]
