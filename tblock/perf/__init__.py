"""Measurement: the machine's facts, thread pinning and one timing harness, shared by
``tblock report``, bench/conftest.py and the peer comparison."""

from .machine import (blas_info, cpu_model, git_commit, machine_info, package_version, pinned_threads,
                      usable_cores)
from .timing import Progress, first_calls, measure, settle, t_grid

__all__ = ["Progress", "blas_info", "cpu_model", "first_calls", "git_commit", "machine_info", "measure",
           "package_version", "pinned_threads", "settle", "t_grid", "usable_cores"]
