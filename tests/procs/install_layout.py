"""The install layout seen from outside the checkout (tests/test_packaging.py):
python install_layout.py CHECK, run with the working directory elsewhere.

    kernels         imports tblock.kernels and prints its name
    bare_kernels    imports a bare "kernels" (must fail: it exists only as tblock.kernels)
    worked_example  prints the shape of the worked example's input (package data)
    git_commit      prints the commit tblock.report records (None outside its own checkout)
"""

import sys


def kernels():
    import tblock.kernels
    import tblock.kernels.validate  # noqa: F401
    print(tblock.kernels.__name__)


def bare_kernels():
    import kernels  # noqa: F401  (an ImportError, unless another project's `kernels` is installed)
    print(kernels.__file__)


def worked_example():
    import tblock
    print(tblock.load_worked_example().H_in.shape)


def git_commit():
    from tblock.report import git_commit
    print(git_commit())


if __name__ == "__main__":
    {"kernels": kernels, "bare_kernels": bare_kernels, "worked_example": worked_example,
     "git_commit": git_commit}[sys.argv[1]]()
