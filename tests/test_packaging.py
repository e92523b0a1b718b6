"""The install layout: kernels/ exists only as tblock.kernels, the data ships with the package."""

import subprocess
import sys


def _run(code, cwd):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True)


def test_kernels_only_as_tblock_kernels(tmp_path):
    # run from outside the checkout, so the repository root is not on sys.path
    ok = _run("import tblock.kernels, tblock.kernels.validate; print(tblock.kernels.__name__)", tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "tblock.kernels"
    bare = _run("import kernels", tmp_path)
    assert bare.returncode != 0 and "No module named 'kernels'" in bare.stderr


def test_worked_example_is_package_data(tmp_path):
    out = _run("import tblock; ex = tblock.load_worked_example(); print(ex.H_in.shape)", tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(4, 8)"


def test_console_script_module_form(tmp_path):
    out = _run("import sys; sys.argv = ['tblock', '--help']; import runpy; runpy.run_module('tblock', run_name='__main__')", tmp_path)
    assert "report" in out.stdout and "lesson" in out.stdout
