"""The install layout: kernels/ exists only as tblock.kernels, the data ships with the package."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import proc

import tblock

pytestmark = pytest.mark.subprocess


def _run(check, cwd):
    """tests/procs/install_layout.py's ``check``, run in ``cwd`` (outside the checkout)."""
    return subprocess.run(proc("install_layout", check), cwd=cwd, capture_output=True, text=True, timeout=300)


def test_kernels_only_as_tblock_kernels(tmp_path):
    # run from outside the checkout, so the repository root is not on sys.path
    ok = _run("kernels", tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "tblock.kernels"
    bare = _run("bare_kernels", tmp_path)
    if bare.returncode == 0:
        # another project's `kernels` (Hugging Face's, which transformers 5 brings): not tblock's
        found = Path(bare.stdout.strip()).resolve().parent
        ours = Path(tblock.__file__).resolve().parent
        assert found not in (ours / "kernels", ours.parent / "kernels") and ours not in found.parents, found
    else:
        assert "No module named 'kernels'" in bare.stderr


def test_worked_example_is_package_data(tmp_path):
    out = _run("worked_example", tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(4, 8)"


def test_console_script_module_form(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tblock", "--help"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert "report" in out.stdout and "lesson" in out.stdout


def test_version_option(tmp_path):
    import importlib.metadata

    import tblock
    out = subprocess.run([sys.executable, "-m", "tblock", "--version"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"tblock {tblock.__version__}"
    assert importlib.metadata.version("tblock-cpu") == tblock.__version__


def test_report_records_a_commit_only_for_its_own_checkout(tmp_path):
    """A copy of the package inside someone else's repository (a venv in a project) records
    no commit; once the repository tracks the package, it records that repository's HEAD."""
    import shutil
    from conftest import copy_package
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "project"
    site = copy_package(repo / "venv" / "site-packages")
    git = lambda *a: subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *a],
                                    capture_output=True, text=True, check=True).stdout.strip()
    git("init", "-q")
    (repo / "README").write_text("someone else's project")
    git("add", "README")
    git("commit", "-q", "-m", "theirs")
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = lambda: subprocess.run(proc("install_layout", "git_commit"), cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=120)
    assert run().stdout.strip() == "None"
    git("add", "venv")
    git("commit", "-q", "-m", "vendored tblock")
    assert run().stdout.strip() == git("rev-parse", "--short", "HEAD")


@pytest.mark.slow
def test_the_sdist_holds_the_tests_their_data_and_the_licence(tmp_path):
    """Built from a copy of the source tree (an sdist run in the checkout would rewrite its egg-info)."""
    import shutil
    import tarfile
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    src = tmp_path / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache", ".benchmarks", ".hypothesis",
        "tblock-report", "lesson13-figures", "*.so", "_build"))
    try:
        import build  # noqa: F401
        cmd = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path / "dist")]
    except ImportError:         # the `build` frontend is optional; setuptools makes the same sdist
        # -I: the source tree is not on sys.path, where its kernels/ would hide an installed
        # `kernels` package that a setuptools plugin imports (Hugging Face's egg_info writer)
        cmd = [sys.executable, "-I", "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path / "dist")]
    made = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    [sdist] = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        pkg_info = tar.extractfile(next(n for n in tar.getnames() if n.count("/") == 1 and n.endswith("/PKG-INFO")))
        meta = pkg_info.read().decode()
    tests = {str(p.relative_to(root)) for p in (root / "tests").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert {"tests/conftest.py", "tests/data/demo_reference.json", "LICENSE"} <= names
    assert tests <= names, sorted(tests - names)
    assert "License-Expression: MIT" in meta and "License-File: LICENSE" in meta
    assert "Copyright (c) 2026 the tblock authors" in (root / "LICENSE").read_text()
    assert {"tblock/web/index.html", "tblock/web/demo.css", "tblock/web/demo.js"} <= names


@pytest.mark.slow
def test_the_wheel_ships_the_demo_page(tmp_path):
    """A non-editable install has the page's files: `tblock demo --export` from the unpacked wheel."""
    import shutil
    import zipfile
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    src = tmp_path / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache", ".benchmarks", ".hypothesis",
        "tblock-report", "lesson13-figures", "*.so", "_build", "tests", "bench", "docs"))
    made = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        assert {"tblock/web/index.html", "tblock/web/demo.css", "tblock/web/demo.js"} <= set(z.namelist())
        z.extractall(site)
    out = subprocess.run([sys.executable, "-m", "tblock", "demo", "--export", str(tmp_path / "page")], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "page" / "demo.js").read_bytes() == (root / "tblock" / "web" / "demo.js").read_bytes()
    assert (tmp_path / "page" / "runs.js").stat().st_size > 1_000_000        # 80 runs
