"""cffi build script of the C reference: compiles c_ref/tblock_ref.c into ``tblock._cref``.

Used by setup.py (``cffi_modules=["c_ref/build_cref.py:ffibuilder"]``), so ``pip install .``
and ``pip install -e .`` compile it. The declarations handed to cffi are read from
tblock_ref.h (between its cffi-cdef markers), so the header stays the single source.

Run on its own (``python c_ref/build_cref.py``) it builds into c_ref/_build/ for debugging.
"""

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
# Through setup.py, setuptools refuses absolute paths in setup() arguments: name the files
# relative to the working directory of the build, the folder of setup.py. Run on its own,
# cffi compiles from inside its tmpdir, so the paths must be absolute there.
SRC_DIR = HERE if __name__ == "__main__" else os.path.relpath(HERE)
HEADER = os.path.join(SRC_DIR, "tblock_ref.h")
SOURCE = os.path.join(SRC_DIR, "tblock_ref.c")
BEGIN, END = "---- cffi-cdef-begin ----", "---- cffi-cdef-end ----"


def header_declarations(path: str = HEADER) -> str:
    """The text between the two marker comments of the header, comments included."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.index(BEGIN)
    start = text.index("*/", start) + 2           # skip the rest of the marker comment
    stop = text.rindex("/*", 0, text.index(END))  # stop before the end marker's comment
    return text[start:stop]


ffibuilder = FFI()
ffibuilder.cdef(header_declarations())
ffibuilder.set_source(
    "tblock._cref",
    '#include "tblock_ref.h"',
    sources=[SOURCE],
    include_dirs=[SRC_DIR],
    libraries=["m"],
    # plain C99; no fast-math, and no fused multiply-adds that would change the rounding
    extra_compile_args=["-std=c99", "-O2", "-ffp-contract=off"],
    depends=[HEADER],
    # a failed compile must not fail the install (setup.py warns); optional also tells
    # setuptools not to copy the missing library into the tree of an editable install
    optional=True,
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=os.path.join(HERE, "_build"), verbose=True)
