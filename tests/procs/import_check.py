"""What `import tblock` loads, in a fresh interpreter: python import_check.py CHECK.

    submodules     tblock.lesson loads on first use, and brings its analysis
    gpt2           neither safetensors nor GPT2's module until tblock.GPT2 is asked for
    no_peer        tblock.peers imports no peer library; prints the ones loaded ([] expected)
    nothing_compiled  Numba is loaded, no kernel compiled; prints loaded, #signatures x2
    threading_layer   prints Numba's configured threading layer after importing tblock
"""

import sys


def submodules():
    import tblock
    assert "tblock.lesson" not in sys.modules
    assert tblock.lesson.run_lesson and "tblock.lesson.analysis" in sys.modules


def gpt2():
    import tblock  # noqa: F401
    before = set(sys.modules)
    from tblock import GPT2
    assert "safetensors" not in before, "import tblock loaded safetensors"
    assert GPT2.__module__ not in before, f"import tblock loaded {GPT2.__module__}"


def no_peer():
    import tblock.peers
    tblock.peers.peer_versions()
    print(sorted(m for m in ("torch", "onnx", "onnxruntime", "openvino") if m in sys.modules))


def nothing_compiled():
    import tblock  # noqa: F401
    from tblock.kernels.block import block_parallel, block_serial
    print("numba" in sys.modules, len(block_parallel.signatures), len(block_serial.signatures))


def threading_layer():
    import tblock  # noqa: F401  # isort: skip  (first: whatever it does at import is done)
    import numba
    print(numba.config.THREADING_LAYER)


if __name__ == "__main__":
    {"submodules": submodules, "gpt2": gpt2, "no_peer": no_peer, "nothing_compiled": nothing_compiled,
     "threading_layer": threading_layer}[sys.argv[1]]()
