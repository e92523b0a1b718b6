"""Where Numba caches the kernels' machine code: one directory per vector path.

Numba keys its cache on the function's source file and the target CPU, not on the
module-level constants the kernels are compiled with (the vector width, the micro-tile,
the tile sizes of ``isa.PATH``).  With TBLOCK_ISA a process can compile the same source
for another path on the same CPU, so each path gets a directory of its own
(``__pycache__/tblock-<path key>``) and never loads another's code.

The freshness stamp is a hash of every module of this package, not of the one file
that defines the function: the block inlines GEMM, attention and SIMD code from its
siblings, so editing any of them must invalidate all of it.

Where the cache goes, first that is writable: NUMBA_CACHE_DIR; ``__pycache__`` beside
the sources; the user's cache directory; then, with a warning, the system's temporary
directory; where none is writable, nowhere (the kernels compile in every process), with a
warning.  A read-only installation with no writable home or temporary directory still
imports and runs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from pathlib import Path

from numba.core import caching, config

from .isa import PATH

_HERE = Path(__file__).resolve().parent
_stamp = None


def _package_stamp() -> str:
    """sha256 over every kernel module's source, and the path key."""
    global _stamp
    if _stamp is None:
        h = hashlib.sha256(PATH.key.encode())
        for f in sorted(_HERE.glob("*.py")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
        _stamp = h.hexdigest()
    return _stamp


def _writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()    # makedirs passes on a read-only folder that exists
        return True
    except OSError:
        return False


def _cache_path() -> str | None:
    """The folder every kernel of this package caches into (they share one source folder,
    so one answer serves them all), or None for no caching; warns once on a fallback."""
    sub = caching._CacheLocator.get_suitable_cache_subpath(str(_HERE / "block.py"))
    usual = [os.path.join(config.CACHE_DIR, sub)] if config.CACHE_DIR else []
    usual += [str(_HERE / "__pycache__"),
              os.path.join(caching.AppDirs(appname="numba", appauthor=False).user_cache_dir, sub)]
    for base in usual:
        if _writable(os.path.join(base, f"tblock-{PATH.key}")):
            return os.path.join(base, f"tblock-{PATH.key}")
    tried = ", ".join(os.path.dirname(b) if b.endswith(sub) else b for b in usual)     # without the hash
    try:
        tmp = tempfile.gettempdir()
    except OSError:                     # no usable temporary directory at all
        tmp = None
    if tmp is not None:
        uid = os.getuid() if hasattr(os, "getuid") else 0
        path = os.path.join(tmp, f"numba-cache-{uid}", sub, f"tblock-{PATH.key}")
        if _writable(path):
            warnings.warn(f"tblock: cannot write Numba's cache in {tried}; the compiled kernels are cached "
                          f"in {path}, which the system may clear: set NUMBA_CACHE_DIR to a writable folder "
                          "to keep them", RuntimeWarning, stacklevel=2)
            return path
    warnings.warn(f"tblock: cannot write Numba's cache in {tried} or a temporary directory; the kernels are "
                  "compiled again in every process: set NUMBA_CACHE_DIR to a writable folder to cache them",
                  RuntimeWarning, stacklevel=2)
    return None


CACHE_PATH = _cache_path()


class PathCacheLocator(caching._CacheLocator):
    """Numba cache locator for the functions defined in this package (others: None)."""

    def __init__(self, py_func, py_file, path):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = path

    def get_cache_path(self):
        return self._cache_path

    def get_source_stamp(self):
        return _package_stamp()

    def get_disambiguator(self):
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        if CACHE_PATH is None or not py_file or Path(py_file).resolve().parent != _HERE:
            return None
        return cls(py_func, py_file, CACHE_PATH)


def install() -> None:
    """Put PathCacheLocator first among Numba's locators (once)."""
    classes = caching._CacheImpl._locator_classes if hasattr(caching, "_CacheImpl") else caching.CacheImpl._locator_classes
    if PathCacheLocator not in classes:
        classes.insert(0, PathCacheLocator)
