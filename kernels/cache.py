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

A cache that goes bad heals (CacheFile).  Each data file carries a sha256 of its contents,
and an index or data file that does not read back whole (truncated, garbled, not Numba's)
is treated as missing: the kernel compiles again and its entry is written anew, with one
warning a process.  A cache folder that stops taking writes (a full or read-only volume)
leaves the kernels compiled in memory for the rest of the process, with one warning.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
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


_warned = set()            # the kinds of cache trouble this process has warned about
_no_writes = False          # set when a write failed: the kernels compile in memory from then on


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=2)


def _corrupt(path: str, why: Exception) -> None:
    _warn_once("corrupt", f"tblock: Numba's cache file {path} does not read back whole "
               f"({type(why).__name__}: {why}); the kernel is compiled again and the entry written "
               "anew (other such entries in this process are replaced without a warning)")


def _cannot_write(why: OSError) -> None:
    global _no_writes
    _no_writes = True
    _warn_once("write", f"tblock: cannot write Numba's cache in {CACHE_PATH} ({why.strerror or why}); the "
               "kernels are compiled in memory for the rest of this process: free the space, or set "
               "NUMBA_CACHE_DIR to a writable folder")


class CacheFile(caching.IndexDataCacheFile):
    """Numba's index and data files, which for this package's folder (CACHE_PATH) check what
    they read and survive what they cannot write; every other folder's as Numba has them.

    A data file is TAG, the sha256 of the pickled entry, then the entry; the index is
    Numba's, and must name data files of its own function.  What fails either check, or
    does not unpickle, is missing: Numba compiles and saves the entry again, replacing it."""

    TAG = b"tblock-sha256\n"

    def __init__(self, cache_path, filename_base, source_stamp):
        super().__init__(cache_path, filename_base, source_stamp)
        self._ours = CACHE_PATH is not None and cache_path == CACHE_PATH
        self._data_name_re = re.compile(re.escape(filename_base) + r"\.[0-9]+\.nbc")

    def load(self, key):
        if not self._ours:
            return super().load(key)
        name = self._load_index().get(key)
        if name is None:
            return None
        try:
            return self._load_data(name)
        except FileNotFoundError:       # removed while the index still named it
            return None
        except Exception as e:          # noqa: BLE001  (whatever a damaged file raises)
            _corrupt(self._data_path(name), e)
            return None

    def save(self, key, data):
        """The entry's data file is named by its key, not numbered by the index: two
        processes saving entries of one function at once (a compile-ahead helper and the
        call it helps, tblock.backends.numba.ahead) never write one file for two keys.
        Data first, so the index names no file not yet written; an index entry one
        writer's index drops is compiled again later."""
        if not self._ours:
            return super().save(key, data)
        if _no_writes:
            return
        name = self._data_name(int(hashlib.sha256(repr(key).encode()).hexdigest()[:15], 16))
        try:
            self._save_data(name, data)
            overloads = self._load_index()
            if overloads.get(key) != name:
                overloads[key] = name
                self._save_index(overloads)
        except OSError as e:
            _cannot_write(e)

    def _load_index(self):
        if not self._ours:
            return super()._load_index()
        try:
            overloads = super()._load_index()       # {} when missing or stale
            if not (isinstance(overloads, dict) and all(isinstance(v, str) and self._data_name_re.fullmatch(v)
                                                        for v in overloads.values())):
                raise ValueError("not an index of this function's data files")
            return overloads
        except Exception as e:          # noqa: BLE001
            _corrupt(self._index_path, e)
            return {}

    def _save_data(self, name, data):
        if not self._ours:
            return super()._save_data(name, data)
        payload = self._dump(data)
        with self._open_for_write(self._data_path(name)) as f:
            f.write(self.TAG + hashlib.sha256(payload).digest() + payload)

    def _load_data(self, name):
        if not self._ours:
            return super()._load_data(name)
        with open(self._data_path(name), "rb") as f:
            raw = f.read()
        head = len(self.TAG) + 32
        if raw[:len(self.TAG)] != self.TAG or hashlib.sha256(raw[head:]).digest() != raw[len(self.TAG):head]:
            raise ValueError("its sha256 does not match its contents")
        return pickle.loads(raw[head:])


def holds(dispatcher, signature: tuple) -> bool:
    """Whether the cache holds ``dispatcher``'s machine code for ``signature`` (its argument
    types), without loading it."""
    cache = dispatcher._cache
    return cache._index_key(signature, dispatcher.targetctx.codegen()) in cache._cache_file._load_index()


class PathCacheLocator(caching._CacheLocator):
    """Numba cache locator for the functions defined in this package (others: None)."""

    def __init__(self, py_func, py_file, path):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = path

    def get_cache_path(self):
        return self._cache_path

    def ensure_cache_path(self):
        try:
            super().ensure_cache_path()
        except OSError:
            pass                        # the save that follows fails too, and warns (CacheFile)

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
    """Put PathCacheLocator first among Numba's locators, and CacheFile in place of Numba's
    cache files (it is Numba's own for every folder but this package's), once."""
    classes = caching._CacheImpl._locator_classes if hasattr(caching, "_CacheImpl") else caching.CacheImpl._locator_classes
    if PathCacheLocator not in classes:
        classes.insert(0, PathCacheLocator)
    if not issubclass(caching.IndexDataCacheFile, CacheFile):
        caching.IndexDataCacheFile = CacheFile
