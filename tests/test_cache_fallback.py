"""Import never fails over Numba's cache (issue #13): a read-only installation run by a user
whose HOME and TMPDIR are read-only caches in the system's temporary directory, and with
no writable temporary directory either it caches nothing; either way with one warning,
and the numpy and numba backends both run."""

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
    """The command prefix that runs a child without root's power to write anywhere."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root writes into read-only folders, and setpriv (util-linux) is not here to drop root")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


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
        script = " && ".join(f"mount --bind {d} {d} && mount -o remount,bind,ro {d}" for d in dirs)
        prefix = namespace + ["sh", "-c", script + ' && exec "$@"', "sh"] + user
        args = ()
    else:                               # no namespace: the child is told its temporary directory is read-only
        prefix = user
        args = (read_only_world / "home",)
    cache, warning = _run(prefix, read_only_world, *args)
    assert cache == "None"
    assert "or a temporary directory; the kernels are compiled again in every process" in warning
    assert "NUMBA_CACHE_DIR" in warning
