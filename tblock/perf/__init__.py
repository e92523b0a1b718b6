"""Measurement: the machine's facts, thread pinning and one timing harness, shared by
``tblock report``, bench/conftest.py and the peer comparison."""

from .machine import (blas_info, cpu_info, cpu_model, git_commit, machine_info, package_version, pin_threads,
                      pinned_threads, usable_cores)
from .timing import Progress, first_calls, interleaved, measure, seconds, settle, t_grid

__all__ = ["Progress", "blas_info", "cpu_info", "cpu_model", "first_calls", "git_commit", "interleaved",
           "machine_info", "measure", "package_version", "pin_threads", "pinned_threads", "seconds", "settle",
           "t_grid", "usable_cores"]
