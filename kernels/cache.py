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
the sources; the user's cache directory; the system's temporary directory.  A read-only
installation with no writable home still imports and caches.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
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


def _candidates(py_file: str) -> list[str]:
    sub = caching._CacheLocator.get_suitable_cache_subpath(py_file)
    base = [os.path.join(os.path.dirname(py_file), "__pycache__")]
    if config.CACHE_DIR:
        base.insert(0, os.path.join(config.CACHE_DIR, sub))
    base.append(os.path.join(caching.AppDirs(appname="numba", appauthor=False).user_cache_dir, sub))
    base.append(os.path.join(tempfile.gettempdir(), f"numba-cache-{os.getuid() if hasattr(os, 'getuid') else 0}", sub))
    return [os.path.join(b, f"tblock-{PATH.key}") for b in base]


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
        if not py_file or Path(py_file).resolve().parent != _HERE:
            return None
        for path in _candidates(py_file):
            self = cls(py_func, py_file, path)
            try:
                self.ensure_cache_path()
            except OSError:
                continue
            return self
        return None


def install() -> None:
    """Put PathCacheLocator first among Numba's locators (once)."""
    classes = caching._CacheImpl._locator_classes if hasattr(caching, "_CacheImpl") else caching.CacheImpl._locator_classes
    if PathCacheLocator not in classes:
        classes.insert(0, PathCacheLocator)
