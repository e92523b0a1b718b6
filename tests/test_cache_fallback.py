"""Import never fails over Numba's cache (issue #13): a read-only installation run by a user
whose HOME and TMPDIR are read-only caches in the system's temporary directory, and with
no writable temporary directory either it caches nothing; either way with one warning,
and the numpy and numba backends both run.

A cache that goes bad heals (issue #31): truncated or garbled entries are compiled again
and replaced, and a cache volume that fills up or turns read-only leaves the kernels
compiled in memory; one warning each, and the block computes what the oracle does."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import PROCS, copy_package

pytestmark = pytest.mark.subprocess


def _as_another_user():
    """The command prefix that runs a child without root's power to write anywhere: as
    this same user with every capability dropped, so that file modes bind it as they bind
    any owner.  (Issue #31: as user nobody, the child could not reach this interpreter's
    packages in a checkout inside a 0700 folder, such as one made by mktemp -d.)"""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root writes into read-only folders, and setpriv (util-linux) is not here to drop root's powers")
    prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    probe = subprocess.run(prefix + [sys.executable, "-c", "import numpy, numba"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"root without its capabilities cannot run {sys.executable} here: {probe.stderr[-300:]}")
    return prefix


def _private_read_only_tmp():
    """A prefix giving the child read-only /tmp and /var/tmp in a mount namespace of its own,
    or None where this process may not make one."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return ["unshare", "-m", "--propagation", "private"] if probe.returncode == 0 else None


@pytest.fixture
def read_only_world():
    """A read-only copy of the package and of the child program, a read-only HOME and TMPDIR:
    a folder every user can read (pytest's tmp_path is private to this user), made read-only
    after the copy."""
    top = Path(tempfile.mkdtemp(prefix="tblock-ro-"))
    site = copy_package(top / "site")
    shutil.copy(PROCS / "read_only_cache.py", top / "child.py")
    (top / "home").mkdir()
    for p in [top, *top.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    yield top
    for p in [top, *top.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(top)


def _run(prefix, top, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_CACHE_DIR", "PYTHON"))}
    env.update(HOME=str(top / "home"), TMPDIR=str(top / "home"), PYTHONPATH=str(top / "site"))
    p = subprocess.run(prefix + [sys.executable, str(top / "child.py"), *args], cwd=top, env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    path, cache, diff = p.stdout.split()
    assert path == str(top / "site" / "tblock" / "__init__.py")       # the read-only copy ran
    assert float(diff) < 1e-5
    warnings = [line for line in p.stderr.splitlines() if "RuntimeWarning: tblock:" in line]
    assert len(warnings) == 1, p.stderr
    return cache, warnings[0]


def test_cache_in_the_temporary_directory_when_nothing_else_is_writable(read_only_world):
    cache, warning = _run(_as_another_user(), read_only_world)
    assert "numba-cache-" in cache and not cache.startswith(str(read_only_world))
    assert f"cached in {cache}" in warning and "NUMBA_CACHE_DIR" in warning
    shutil.rmtree(os.path.dirname(cache), ignore_errors=True)      # named after this run's copy: never reused


def test_no_cache_when_not_even_a_temporary_directory_is_writable(read_only_world):
    user = _as_another_user()
    namespace = _private_read_only_tmp()
    if namespace is not None:           # /tmp and /var/tmp bound read-only onto themselves
        dirs = [d for d in ("/tmp", "/var/tmp") if os.path.isdir(d) and not os.path.islink(d)]
        script = " && ".join(f"mount --rbind {d} {d} && mount -o remount,bind,ro {d}" for d in dirs)
        prefix = namespace + ["sh", "-c", script + ' && exec "$@"', "sh"] + user
        args = ()
    else:                               # no namespace: the child is told its temporary directory is read-only
        prefix = user
        args = (read_only_world / "home",)
    cache, warning = _run(prefix, read_only_world, *args)
    assert cache == "None"
    assert "or a temporary directory; the kernels are compiled again in every process" in warning
    assert "NUMBA_CACHE_DIR" in warning


# ---- a cache that goes bad heals (issue #31) ------------------------------------------------

def _heal_run(site, *args, prefix=(), **env):
    """tests/procs/cache_heal.py on the package copy ``site``: the cache folder, and how many
    kernel signatures were loaded from the cache and compiled; the tblock warnings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_CACHE_DIR", "PYTHON"))}
    p = subprocess.run([*prefix, sys.executable, str(PROCS / "cache_heal.py"), *map(str, args)], capture_output=True,
                       text=True, timeout=900, env={**base, "PYTHONPATH": str(site), **env})
    assert p.returncode == 0, p.stderr[-3000:]
    path, diff, counts = p.stdout.splitlines()
    assert float(diff) < 1e-5                      # the block computed what the oracle does
    hits, misses = map(int, counts.split())
    return path, hits, misses, [line for line in p.stderr.splitlines() if "RuntimeWarning: tblock:" in line]


@pytest.fixture(scope="module")
def warm_site(tmp_path_factory):
    """A writable copy of the package whose own cache (kernels/__pycache__) holds every
    kernel one block call needs."""
    site = copy_package(tmp_path_factory.mktemp("warm") / "site")
    path, hits, misses, warnings = _heal_run(site)
    assert path.startswith(str(site)) and misses > 0 and not warnings
    return site


@pytest.fixture
def site(warm_site, tmp_path):
    shutil.copytree(warm_site, tmp_path / "site", symlinks=True)
    return tmp_path / "site"


@pytest.mark.slow
def test_a_sound_cache_is_loaded(site):
    path, hits, misses, warnings = _heal_run(site)
    assert hits > 0 and misses == 0 and not warnings


@pytest.mark.slow
def test_corrupt_entries_are_compiled_again_and_replaced(site):
    """Issue #31: a truncated or garbled cache file made every later call fail, in every
    process, until someone deleted it.  Half the kernels lose half their index, the other
    half have their data truncated, garbled in the middle (the length kept) or emptied."""
    folder = next((site / "tblock" / "kernels" / "__pycache__").glob("tblock-*"))
    indexes = sorted(folder.glob("*.nbi"))
    assert len(indexes) >= 2
    for i, index in enumerate(indexes):
        data = sorted(folder.glob(index.name[:-len(".nbi")] + ".*.nbc"))
        if i % 2 == 0 or not data:
            index.write_bytes(index.read_bytes()[:index.stat().st_size // 2])
            continue
        for j, f in enumerate(data):
            raw = bytearray(f.read_bytes())
            if j % 3 == 0:
                raw = raw[:len(raw) // 2]
            elif j % 3 == 1:
                mid = len(raw) // 2
                raw[mid:mid + 64] = bytes(b ^ 0xFF for b in raw[mid:mid + 64])
            else:
                raw = b""
            f.write_bytes(bytes(raw))
    path, hits, misses, warnings = _heal_run(site)
    assert path == str(folder) and misses > 0
    assert len(warnings) == 1 and "does not read back whole" in warnings[0], warnings
    path, hits, misses, warnings = _heal_run(site)         # replaced: all of it loads
    assert hits > 0 and misses == 0 and not warnings


def _mount_namespace():
    """The prefix running a command as root in a mount namespace of its own, or None."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    prefix = ["unshare", "-m", "--propagation", "private"]
    probe = subprocess.run(prefix + ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/mnt"], capture_output=True)
    return prefix if probe.returncode == 0 else None


@pytest.mark.slow
def test_a_full_cache_volume_leaves_the_kernels_compiled_in_memory(site, tmp_path):
    """Issue #31: on a full cache volume every forward raised ENOSPC.  Where this process
    may mount, NUMBA_CACHE_DIR is a 64 KiB tmpfs, really full after the first entries;
    elsewhere the child may write no file past 4 KiB (RLIMIT_FSIZE: EFBIG, not ENOSPC, but
    the same failed write)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    namespace = _mount_namespace()
    if namespace is not None:
        prefix = namespace + ["sh", "-c", f'mount -t tmpfs -o size=64k tmpfs {cache} && exec "$@"', "sh"]
        path, hits, misses, warnings = _heal_run(site, prefix=prefix, NUMBA_CACHE_DIR=str(cache))
        reason = "No space left on device"
    else:
        path, hits, misses, warnings = _heal_run(site, "fsize", 4096, NUMBA_CACHE_DIR=str(cache))
        reason = "File too large"
    assert path.startswith(str(cache)) and misses > 0
    assert len(warnings) == 1 and f"cannot write Numba's cache in {path} ({reason})" in warnings[0], warnings
    assert "compiled in memory" in warnings[0]


@pytest.mark.slow
def test_a_cache_volume_that_turns_read_only_leaves_the_kernels_compiled_in_memory(site, tmp_path):
    """The cache folder is writable when tblock is imported, then stops taking writes: a
    tmpfs remounted read-only (EROFS) where this process may mount, elsewhere its folders'
    write permission taken away (EACCES, for a child that file modes bind)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    namespace = _mount_namespace()
    if namespace is not None:
        prefix = namespace + ["sh", "-c", f'mount -t tmpfs -o size=256m tmpfs {cache} && exec "$@"', "sh"]
        path, hits, misses, warnings = _heal_run(site, "remount-ro", prefix=prefix, NUMBA_CACHE_DIR=str(cache))
        reason = "Read-only file system"
    else:
        path, hits, misses, warnings = _heal_run(site, "chmod-ro", prefix=_as_another_user(),
                                                 NUMBA_CACHE_DIR=str(cache))
        reason = "Permission denied"
    assert path.startswith(str(cache)) and misses > 0
    assert len(warnings) == 1 and f"cannot write Numba's cache in {path} ({reason})" in warnings[0], warnings


def test_two_writers_of_one_function_never_share_a_data_file(tmp_path, monkeypatch):
    """Two processes saving entries of one function at once (a compile-ahead helper and the
    call it helps): the second read the index before the first wrote it.  Numbered by that
    index, both entries took data file 1, and whichever index was written last could name
    the other key's code; named by key, each file holds its own key's entry."""
    from tblock.kernels import cache
    monkeypatch.setattr(cache, "CACHE_PATH", str(tmp_path))
    first = cache.CacheFile(str(tmp_path), "f-1.py311", "stamp")
    second = cache.CacheFile(str(tmp_path), "f-1.py311", "stamp")
    monkeypatch.setattr(second, "_load_index", lambda: {})          # its stale view of the index
    first.save(("a",), "entry a")
    name_a = first._load_index()[("a",)]
    second.save(("b",), "entry b")
    index = first._load_index()
    assert list(index) == [("b",)] and index[("b",)] != name_a       # the last writer's index: b alone
    assert first._load_data(name_a) == "entry a" and first.load(("b",)) == "entry b"
