"""Numba kernels, installed as ``tblock.kernels`` (never as a bare ``kernels``)."""
