import os
import sys
from pathlib import Path

import numpy as np
import pytest

import tblock

# no compile-ahead helper per new build (tblock.backends.numba.ahead): the suite makes
# hundreds, and helpers would take the core its parallel tests run on; test_compile_ahead
# turns it on
os.environ.setdefault("TBLOCK_COMPILE_AHEAD", "0")

# module fixtures that run a whole `tblock report` (seconds each): their tests are slow,
# out of `make test-fast`'s inner loop
REPORT_FIXTURES = {"tiny_report", "tiny", "llama_run"}


def pytest_collection_modifyitems(items):
    for item in items:
        if REPORT_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# the programs tests run in child processes: tests/procs/<name>.py, run by path
PROCS = Path(__file__).resolve().parent / "procs"


def proc(name: str, *args) -> list[str]:
    """The command line running tests/procs/<name>.py with ``args`` in this interpreter."""
    script = PROCS / f"{name}.py"
    if not script.is_file():
        raise ValueError(f"no child program {name!r}: {script} does not exist")
    return [sys.executable, str(script), *map(str, args)]


def cli_run(capsys, *args):
    """``tblock ARGS`` in this process: (exit code, stdout, stderr)."""
    from tblock import cli
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, command, *needles):
    """The CLI's refusal: exit 2, one line on stderr naming the command and each needle."""
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"tblock {command}: error: "), err
    for n in needles:
        assert n in err, (n, err)

# every backend that can run here; the oracle is always among them
BACKENDS = tblock.available_backends()


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


def _int8_ties(X, rel, atol=1e-7) -> np.ndarray:
    """(rows, d / 32) bool: whether a block of 32 of X (..., d) holds an input within
    rel |x / step| + atol steps of a half step of dot "int8"'s rounding (step max|x| / 127:
    tblock.formats.round_inputs)."""
    d = np.shape(X)[-1]
    x = np.asarray(X, np.float64).reshape(-1, tblock.formats.QBLOCK)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    s = x * (127 / np.where(amax > 0, amax, 1))
    near = (np.abs(np.abs(s - np.floor(s)) - 0.5) <= rel * np.abs(s) + atol).any(axis=-1)
    return near.reshape(-1, d // tblock.formats.QBLOCK)


def near_an_int8_tie(X) -> bool:
    """Whether an input of X (..., d) lies so near a tie of dot "int8"'s rounding that
    float32's last bits, where the oracle has float64's, can round it the other way:
    within 5e-7 |x / step| of a half step (a few float32 ulps of x and of the block's
    maximum).  Such a flip in the rows the QKV projection reads moves every later row
    through attention, past a bound meant for float32's rounding alone."""
    return bool(_int8_ties(X, 5e-7).any())


def rows_near_an_int8_tie(trace, pre: bool) -> np.ndarray:
    """(B*T,) bool: the rows whose own rounded inputs after attention lie near an int8 tie:
    W_O's (out_concat), the FFN's (LN2's rows; Post-LN: H_mid) and W_2's (F_post).  They
    come through float32 attention and activations, which put them up to 8e-5 of a step
    from the oracle's (measured: 12 blocks, d 32-96), so the window is 1e-4 of a step; a
    flip there moves only its own row, which at T = 1 or 2 is half the outputs or more."""
    ffn_in = trace.H_norm2 if pre else trace.H_mid
    return (_int8_ties(trace.out_concat, 0, 1e-4).any(axis=1) | _int8_ties(ffn_in, 0, 1e-4).any(axis=1)
            | _int8_ties(trace.F_post, 0, 1e-4).any(axis=1))


def near_the_rounded_oracle(got, want, tie=False, rows=None) -> bool:
    """The block's bound with inputs rounded (dot "int8" or "bf16"): numba's float32
    LayerNorm and attention differ from the oracle's float64 in the last bits, so an input
    that lies at a rounding tie may round one step the other way there; most outputs still
    agree to float32's accuracy (unless such an input is in a row the QKV projection reads:
    tie, near_an_int8_tie), and every one within a few such steps.  rows: (B*T,) bool, rows
    left out of the median (rows_near_an_int8_tie)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.abs(got - want) / np.abs(want).max()
    kept = err if rows is None else err.reshape(rows.size, -1)[~rows]
    return (tie or kept.size == 0 or np.median(kept) < 2e-6) and err.max() < 5e-2


def rel_err(got, want) -> float:
    """max |got - want| / max |want| (the absolute error where want is all zeros)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    scale = np.max(np.abs(want))
    err = np.max(np.abs(got - want))
    return float(err / scale) if scale > 0 else float(err)


def nonzero(rng, shape):
    """Random values bounded away from 0, either sign: a bias or affine that matters."""
    return rng.uniform(0.2, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


def random_weights(cfg, rng, dtype=np.float64) -> tblock.BlockWeights:
    """Weights of ``cfg`` drawn from ``rng``: the lesson's scales for the matrices, and every
    bias and LayerNorm affine the config has bounded away from 0 (so that each one matters)."""
    d, f = cfg.d_model, cfg.d_ff
    w = dict(w_q=rng.standard_normal((d, d)) / np.sqrt(d), w_k=rng.standard_normal((d, d)) / np.sqrt(d),
             w_v=rng.standard_normal((d, d)) / np.sqrt(d), w_o=rng.standard_normal((d, d)) / np.sqrt(d),
             w_ff1=rng.standard_normal((d, f)) * np.sqrt(2.0 / d),
             w_ff2=rng.standard_normal((f, d)) * np.sqrt(2.0 / f))
    if cfg.ffn_bias:
        w.update(b_ff1=nonzero(rng, f), b_ff2=nonzero(rng, d))
    if cfg.ln_affine:
        w.update(ln1_gamma=nonzero(rng, d), ln1_beta=nonzero(rng, d),
                 ln2_gamma=nonzero(rng, d), ln2_beta=nonzero(rng, d))
    if cfg.attn_bias:
        w.update(b_q=nonzero(rng, d), b_k=nonzero(rng, d), b_v=nonzero(rng, d), b_o=nonzero(rng, d))
    return tblock.BlockWeights(**{k: v.astype(dtype) for k, v in w.items()})


def copy_package(dest):
    """tblock as an installation lays it out (kernels/ as tblock/kernels), copied into
    ``dest`` without Numba's caches; returns ``dest`` for PYTHONPATH."""
    import shutil
    from pathlib import Path

    import tblock.kernels
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(tblock.__file__).parent, Path(dest) / "tblock", ignore=skip)
    shutil.rmtree(Path(dest) / "tblock" / "kernels", ignore_errors=True)   # an installed layout may hold one
    shutil.copytree(Path(tblock.kernels.__file__).parent, Path(dest) / "tblock" / "kernels", ignore=skip)
    return Path(dest)
