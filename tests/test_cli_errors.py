"""Every ``tblock`` command error is one line on stderr and exit status 2 (issue #31): more
threads than the cores, sizes no machine's memory holds, a broken tokenizer.json."""

import pytest
from conftest import cli_run, one_line_error
from test_gpt2 import hf_config, random_tensors, write_checkpoint

from tblock import _runtime
from tblock.perf import usable_cores
from tblock.report import options

TINY = ["--d-model", "16", "--n-heads", "2", "--T-list", "4", "--backends", "numpy", "--repeats", "1",
        "--target-time", "0", "--ceiling-sizes", "32", "--no-plots", "--peers", "none"]


@pytest.mark.slow     # a whole report run
def test_more_threads_than_the_cores_are_refused(tmp_path, capsys):
    """Issue #31: --threads above the cores was accepted; numba capped it silently at its
    pool and the BLAS took it as given, so the report timed two different counts."""
    top = min(usable_cores(), _runtime.pool_size())
    rc, out, err = cli_run(capsys, "report", *TINY, "--threads", top + 1, "--out", tmp_path / "r")
    one_line_error(rc, err, "report", "--threads must be at most", f"got {top + 1}")
    assert list(tmp_path.iterdir()) == []
    rc, out, err = cli_run(capsys, "report", *TINY, "--threads", top, "--out", tmp_path / "r")
    assert rc == 0, err


@pytest.mark.parametrize("args, needle", [
    (["--d-model", 1 << 20, "--n-heads", 1, "--T-list", 4], "--d-model 1048576 with T up to 4 needs at least"),
    (["--d-model", 16, "--n-heads", 2, "--T-list", 10**13], "with T up to 10000000000000 needs at least"),
    (["--d-model", 16, "--n-heads", 2, "--T-list", 4, "--ceiling-sizes", 10**7], "--ceiling-sizes 10000000 needs"),
], ids=["d_model", "T", "ceiling"])
def test_sizes_no_memory_holds_are_refused_before_anything_runs(tmp_path, capsys, args, needle):
    """Issue #31: a MemoryError traceback after the report had started (or, where the
    system overcommits, the machine filling up)."""
    if options.physical_memory() is None:
        pytest.skip("this system does not say how much memory it has (os.sysconf)")
    rc, out, err = cli_run(capsys, "report", "--backends", "numpy", "--repeats", "1", "--peers", "none", *args,
                       "--out", tmp_path / "r")
    one_line_error(rc, err, "report", needle, "GiB", "this machine has")
    assert out == "" and list(tmp_path.iterdir()) == []


def test_an_out_of_memory_error_is_one_line(tmp_path, capsys, monkeypatch):
    """What the bound above cannot see coming is still one line."""
    def too_big(*a, **k):
        raise MemoryError("Unable to allocate 9.00 TiB for an array")
    monkeypatch.setattr("tblock.report.prepare_all", too_big)
    rc, out, err = cli_run(capsys, "report", *TINY, "--out", tmp_path / "r")
    one_line_error(rc, err, "report", "out of memory", "9.00 TiB")
    assert not (tmp_path / "r").exists()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import numpy as np
    root = tmp_path_factory.mktemp("cli") / "ckpt"
    shape = dict(vocab_size=37, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    write_checkpoint(root, random_tensors(np.random.default_rng(31), 37, 16, 16, 1), hf_config(**shape))
    return root


@pytest.mark.parametrize("content", [b"", b"{ not json", b'{"model": {"type": "NoSuchModel"}}', b"\xff\xfe\x00"],
                         ids=["empty", "not-json", "unknown-model", "binary"])
@pytest.mark.parametrize("prompt", [["--ids", 1, 2], ["--prompt", "w1 w2"]], ids=["ids", "prompt"])
def test_a_broken_tokenizer_json_is_one_line(checkpoint, tmp_path, capsys, content, prompt):
    """Issue #31: with a tokenizer.json beside the checkpoint, generate reads it even for
    --ids (to print the text), and a broken one gave the tokenizers package's traceback."""
    pytest.importorskip("tokenizers", reason="the text extra (tokenizers) is not installed")
    root = tmp_path / "ckpt"
    root.mkdir()
    for f in checkpoint.iterdir():
        (root / f.name).write_bytes(f.read_bytes())
    (root / "tokenizer.json").write_bytes(content)
    rc, out, err = cli_run(capsys, "generate", root, *prompt, "-n", 2, "--temperature", 0)
    one_line_error(rc, err, "generate", str(root / "tokenizer.json"), "not a tokenizers file")
    assert out == ""


def test_a_truncated_checkpoint_is_one_line(checkpoint, tmp_path, capsys):
    """Issue #31: a malformed checkpoint printed a traceback; the loader's error naming the
    file is the whole message."""
    root = tmp_path / "ckpt"
    root.mkdir()
    for f in checkpoint.iterdir():
        data = f.read_bytes()
        (root / f.name).write_bytes(data[:len(data) // 2] if f.suffix == ".safetensors" else data)
    rc, out, err = cli_run(capsys, "generate", root, "--ids", 1, "-n", 1)
    one_line_error(rc, err, "generate", "model.safetensors")
    assert out == ""
