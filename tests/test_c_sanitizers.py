"""The C reference under AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer.

Builds c_ref/tests/test_block.c with c_ref/tblock_ref.c into a temporary folder and runs
it: every entry point, good and bad arguments, buffers malloc'ed at their exact lengths.
It must report no sanitizer error, no leak and no failed check. Skipped, with the reason,
only when there is no C compiler or the compiler cannot build and run a sanitized program.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[1]
C_REF = ROOT / "c_ref"
SOURCES = [C_REF / "tests" / "test_block.c", C_REF / "tblock_ref.c"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
SAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


def _compiler():
    return shutil.which("gcc") or shutil.which("cc")


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture(scope="module")
def sanitizing_compiler(tmp_path_factory):
    """The compiler, once it has built and run a trivial sanitized program."""
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (gcc or cc) on PATH")
    tmp = tmp_path_factory.mktemp("probe")
    (tmp / "probe.c").write_text("int main(void) { return 0; }\n")
    built = _run([cc, "-std=c99", *SANITIZE, str(tmp / "probe.c"), "-o", str(tmp / "probe")])
    if built.returncode != 0:
        pytest.skip(f"{cc} cannot build with {' '.join(SANITIZE)}: {built.stderr.strip()[:300]}")
    ran = _run([str(tmp / "probe")], env={**os.environ, **SAN_ENV})
    if ran.returncode != 0:
        pytest.skip(f"a trivial sanitized program does not run here: {(ran.stdout + ran.stderr).strip()[:300]}")
    return cc


def test_c_tests_under_sanitizers(sanitizing_compiler, tmp_path):
    exe = tmp_path / "test_block"
    built = _run([sanitizing_compiler, "-std=c99", "-g", "-O1", *SANITIZE, f"-I{C_REF}",
                  *map(str, SOURCES), "-lm", "-o", str(exe)])
    assert built.returncode == 0, built.stderr
    ran = _run([str(exe)], env={**os.environ, **SAN_ENV})
    output = ran.stdout + ran.stderr
    assert "ERROR: AddressSanitizer" not in output, output[-4000:]
    assert "ERROR: LeakSanitizer" not in output, output[-4000:]
    assert "runtime error" not in output, output[-4000:]
    assert ran.returncode == 0, output[-4000:]
    summary = re.search(r"^(\d+) passed, (\d+) failed$", ran.stdout, re.MULTILINE)
    assert summary, output[-4000:]
    passed, failed = map(int, summary.groups())
    assert failed == 0 and passed > 1000, summary.group(0)


def test_c_reference_compiles_cleanly(tmp_path):
    """Strict C99, every common warning an error: the code a reader checks by eye."""
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (gcc or cc) on PATH")
    strict = ["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Wshadow", "-Wconversion", "-Wstrict-prototypes",
              "-Wmissing-prototypes", "-Wcast-qual", "-Werror"]
    built = _run([cc, *strict, "-O2", "-c", str(C_REF / "tblock_ref.c"), "-o", str(tmp_path / "ref.o")])
    assert built.returncode == 0, built.stderr
    built = _run([cc, "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", f"-I{C_REF}",
                  "-c", str(SOURCES[0]), "-o", str(tmp_path / "test.o")])
    assert built.returncode == 0, built.stderr


# ---------------------------------------------------------------------------------------
# tb_dequantize (the stored formats): c_ref/tests/test_formats.c, its own program

FORMAT_SOURCES = [C_REF / "tests" / "test_formats.c", C_REF / "tblock_ref.c"]


def test_format_tests_under_sanitizers(sanitizing_compiler, tmp_path):
    """Every format by hand, every float16/bfloat16 pattern, random matrices, every error
    path and buffers malloc'ed short of their shapes: no sanitizer report, no failed check."""
    exe = tmp_path / "test_formats"
    built = _run([sanitizing_compiler, "-std=c99", "-g", "-O1", *SANITIZE, f"-I{C_REF}",
                  *map(str, FORMAT_SOURCES), "-lm", "-o", str(exe)])
    assert built.returncode == 0, built.stderr
    ran = _run([str(exe)], env={**os.environ, **SAN_ENV})
    output = ran.stdout + ran.stderr
    for report in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error"):
        assert report not in output, output[-4000:]
    assert ran.returncode == 0, output[-4000:]
    summary = re.search(r"^(\d+) passed, (\d+) failed$", ran.stdout, re.MULTILINE)
    assert summary, output[-4000:]
    passed, failed = map(int, summary.groups())
    assert failed == 0 and passed > 300, summary.group(0)


def test_format_tests_compile_cleanly(tmp_path):
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (gcc or cc) on PATH")
    built = _run([cc, "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", f"-I{C_REF}",
                  "-c", str(FORMAT_SOURCES[0]), "-o", str(tmp_path / "test_formats.o")])
    assert built.returncode == 0, built.stderr
