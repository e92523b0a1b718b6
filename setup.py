"""Build hook for the C reference; everything else about the package is in pyproject.toml.

cffi compiles c_ref/ into the extension ``tblock._cref`` (backend "c"). The build is
optional: without a working C compiler the package still installs, and backend="c"
then raises tblock.BackendUnavailable with instructions.
"""

import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

# what a missing or failing C compiler raises
COMPILER_ERRORS = (CCompilerError, ExecError, PlatformError, OSError)


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when an extension cannot be compiled."""

    def run(self):
        try:
            super().run()
        except COMPILER_ERRORS as e:
            self._skip("the build", e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except COMPILER_ERRORS as e:
            self._skip(ext.name, e)

    def _skip(self, what, error):
        print(f"WARNING: could not compile {what} ({type(error).__name__}: {error}); "
              "tblock installs without the C reference (backend 'c'). Install a C compiler "
              "and reinstall (pip install -e .) to build it.", file=sys.stderr)


setup(
    cffi_modules=["c_ref/build_cref.py:ffibuilder"],
    cmdclass={"build_ext": OptionalBuildExt},
)
