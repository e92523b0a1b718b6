"""``tblock generate MODEL --input IN --output OUT``: the batch job over files (issue #34).

Expected records come from ``model.generate`` on each prompt alone (not from the job's
code); a resumed job's output is compared byte for byte with an uninterrupted run's."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import cli_run, one_line_error
from test_gpt2 import hf_config, random_tensors, write_checkpoint

from tblock import GPT2
from tblock.batch_job import Progress
from tblock.jobs import JobOutput, derived_seed

VOCAB, N_POS, D, LAYERS, HEADS = 101, 48, 32, 2, 4
SHAPE = dict(vocab_size=VOCAB, n_positions=N_POS, n_embd=D, n_layer=LAYERS, n_head=HEADS)
WORDS = [f"w{i}" for i in range(VOCAB - 1)] + ["[UNK]"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A random GPT-2 (test_generate's: strong positions, so continuations vary) with a
    word-level tokenizer.json of VOCAB words w0 ... w99, [UNK]."""
    tokenizers = pytest.importorskip("tokenizers", reason="the text extra (tokenizers) is not installed")
    root = tmp_path_factory.mktemp("job") / "ckpt"
    tensors = random_tensors(np.random.default_rng(18), VOCAB, N_POS, D, LAYERS)
    tensors["transformer.wpe.weight"] *= 4
    write_checkpoint(root, tensors, hf_config(**SHAPE))
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece()      # joins the words with spaces
    tok.save(str(root / "tokenizer.json"))
    return root


@pytest.fixture(scope="module")
def model(ckpt):
    return GPT2.from_pretrained(ckpt)


def write_lines(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def read_records(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def prompts(n, seed=0, lo=1, hi=20):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]


def job(capsys, ckpt, inp, out, *more):
    return cli_run(capsys, "generate", ckpt, "--input", inp, "--output", out, *more)


# ----------------------------------------------------------------------------- the records


def test_records_equal_generate_for_each_prompt_alone(ckpt, model, tmp_path, capsys):
    """Mixed lengths, ids and text prompts, string and integer ids, per-line parameters
    overriding the command line's; each record is model.generate on its prompt alone."""
    ps = prompts(9, seed=1)
    lines = [{"id": i, "ids": p} for i, p in enumerate(ps[:5])]
    lines += [{"id": "greedy-12", "ids": ps[5], "max_new_tokens": 12},
              {"id": "sampled", "ids": ps[6], "temperature": 0.9, "top_k": 20, "top_p": 0.9, "seed": 4},
              {"id": "hot", "ids": ps[7], "temperature": 1.5, "seed": 11, "max_new_tokens": 0},
              {"id": "text", "prompt": "w5 w17 w3", "top_k": None}]
    greedy_eos = model.generate(ps[8], 10, temperature=0)[len(ps[8]) + 3]   # the 4th new token: an early stop
    lines.append({"id": 99, "ids": ps[8], "eos": int(greedy_eos), "max_new_tokens": 10})
    inp, out = write_lines(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    rc, _, err = job(capsys, ckpt, inp, out, "-n", 7, "--temperature", 0, "--max-batch", 3)
    assert rc == 0, err
    recs = read_records(out)
    assert [r["id"] for r in recs] == [x["id"] for x in lines]              # --order input
    kw = dict(temperature=0.0)
    want = [model.generate(p, 7, **kw) for p in ps[:5]]
    want += [model.generate(ps[5], 12, **kw),
             model.generate(ps[6], 7, temperature=0.9, top_k=20, top_p=0.9, seed=4),
             model.generate(ps[7], 0, temperature=1.5, seed=11),
             model.generate([5, 17, 3], 7, **kw),
             model.generate(ps[8], 10, eos_token_id=int(greedy_eos), **kw)]
    assert want[-1].size < len(ps[8]) + 10                                   # the eos stopped it
    for rec, line, w in zip(recs, lines, want):
        prompt = line.get("ids", [5, 17, 3])
        assert rec["ids"] == w.tolist(), rec["id"]
        assert rec["new_ids"] == w[len(prompt):].tolist()
        assert rec["text"] == " ".join(WORDS[i] for i in rec["new_ids"])
    assert [r["stop"] for r in recs] == ["length"] * 9 + ["eos"]
    assert "10/10 prompts" in err.splitlines()[-1] and "0 bad lines skipped" in err


def test_lines_without_a_seed_draw_from_the_base_seed_and_their_id(ckpt, model, tmp_path, capsys):
    """Sampling without a per-line seed: each line's seed is derived from --seed and its
    id, so the same id gives the same tokens in any order or batch, and the base seed is
    printed."""
    ps = prompts(4, seed=2)
    inp = write_lines(tmp_path / "in.jsonl", [{"id": f"p{i}", "ids": p} for i, p in enumerate(ps)])
    rev = write_lines(tmp_path / "rev.jsonl", [{"id": f"p{i}", "ids": p} for i, p in reversed(list(enumerate(ps)))])
    rc, _, err = job(capsys, ckpt, inp, tmp_path / "a.jsonl", "-n", 6, "--seed", 77, "--max-batch", 4)
    assert rc == 0 and "base seed 77" in err, err
    rc, _, err = job(capsys, ckpt, rev, tmp_path / "b.jsonl", "-n", 6, "--seed", 77, "--max-batch", 1)
    assert rc == 0, err
    a = {r["id"]: r["ids"] for r in read_records(tmp_path / "a.jsonl")}
    b = {r["id"]: r["ids"] for r in read_records(tmp_path / "b.jsonl")}
    assert a == b
    for i, p in enumerate(ps):
        assert a[f"p{i}"] == model.generate(p, 6, seed=derived_seed(77, f"p{i}")).tolist()
    assert len({derived_seed(77, f"p{i}") for i in range(4)} | {derived_seed(78, "p0")}) == 5


def test_order_done_writes_every_id_once(ckpt, model, tmp_path, capsys):
    """--order done: records as prompts finish (short ones first under a batch of all),
    each id once, each record the same as --order input's."""
    ps = prompts(6, seed=3)
    lines = [{"id": i, "ids": p, "max_new_tokens": 2 + 6 * (i % 2 == 0)} for i, p in enumerate(ps)]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    rc, _, err = job(capsys, ckpt, inp, tmp_path / "done.jsonl", "--order", "done", "--temperature", 0,
                     "--max-batch", 6)
    assert rc == 0, err
    rc, _, err = job(capsys, ckpt, inp, tmp_path / "input.jsonl", "--temperature", 0, "--max-batch", 6)
    assert rc == 0, err
    done, ordered = read_records(tmp_path / "done.jsonl"), read_records(tmp_path / "input.jsonl")
    assert sorted(r["id"] for r in done) == list(range(6))
    assert {r["id"]: r for r in done} == {r["id"]: r for r in ordered}
    assert [r["id"] for r in done] != list(range(6))            # the 2-token ones came first
    for r, p in zip(ordered, ps):
        assert r["ids"] == model.generate(p, 2 + 6 * (r["id"] % 2 == 0), temperature=0).tolist()


# ----------------------------------------------------------------------------- bad lines

BAD = [  # (line, reason's words)
    ("not json", "not JSON"),
    ('["a list"]', "must be a JSON object"),
    ({"ids": [1]}, 'no "id"'),
    ({"id": 7}, "neither"),
    ({"id": 8, "ids": [1], "prompt": "w1"}, "both"),
    ({"id": 1.5, "ids": [1]}, '"id" must be a string or an integer'),
    ({"id": True, "ids": [1]}, '"id" must be a string or an integer'),
    ({"id": 9, "ids": []}, "non-empty"),
    ({"id": 10, "ids": [1, "2"]}, '"ids"[1] must be an integer'),
    ({"id": 11, "ids": [1, VOCAB]}, f"not a token id in [0, vocab_size={VOCAB})"),
    ({"id": 12, "ids": [-1]}, "not a token id"),
    ({"id": 13, "ids": [1] * (N_POS - 2)}, f"too long: {N_POS - 2} prompt tokens + max_new_tokens 3"),
    ({"id": 14, "ids": [1], "max_new_tokens": N_POS}, "too long"),
    ({"id": "ok", "ids": [2]}, "duplicate id"),            # the good line "ok" comes first
    ({"id": 15, "ids": [1], "temperature": -1}, "temperature must be >= 0"),
    ({"id": 16, "ids": [1], "top_k": 0}, "top_k must be >= 1"),
    ({"id": 17, "ids": [1], "top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"id": 18, "ids": [1], "seed": -3}, "seed must be >= 0"),
    ({"id": 19, "ids": [1], "eos": VOCAB}, "eos must be a token id"),
    ({"id": 20, "ids": [1], "max_new_tokens": 2.5}, "max_new_tokens must be an integer"),
    ({"id": 21, "ids": [1], "max_tokens": 4}, "unknown key 'max_tokens'"),
    ({"id": 22, "prompt": 5}, '"prompt" must be a string'),
]


def bad_file(tmp_path):
    """The good lines "ok" (line 1) and "ok2" (last), a blank line, then every bad line."""
    lines = [{"id": "ok", "ids": [3, 4]}, "   "] + [b for b, _ in BAD] + [{"id": "ok2", "ids": [5]}]
    return write_lines(tmp_path / "in.jsonl", lines)


def test_bad_lines_are_reported_and_skipped(ckpt, model, tmp_path, capsys):
    inp, out = bad_file(tmp_path), tmp_path / "out.jsonl"
    rc, _, err = job(capsys, ckpt, inp, out, "-n", 3, "--temperature", 0)
    assert rc == 0, err
    assert "Traceback" not in err
    reports = [x for x in err.splitlines() if x.endswith(": skipped")]
    assert len(reports) == len(BAD)
    for (line, words), report in zip(BAD, reports):
        number = 3 + BAD.index((line, words))           # line 1 good, line 2 blank
        assert f"{inp} line {number}: " in report and words in report, (report, words)
    assert f"({len(BAD)} bad lines skipped)" in err
    recs = read_records(out)
    assert [r["id"] for r in recs] == ["ok", "ok2"]
    assert recs[1]["ids"] == model.generate([5], 3, temperature=0).tolist()


def test_on_error_fail_stops_before_generating(ckpt, tmp_path, capsys):
    inp, out = bad_file(tmp_path), tmp_path / "out.jsonl"
    rc, _, err = job(capsys, ckpt, inp, out, "-n", 3, "--on-error", "fail")
    one_line_error(rc, err, "generate", f"{inp} line 3: not JSON", f"{len(BAD) - 1} more bad lines",
                   "nothing generated")
    assert not out.exists() and not (tmp_path / "out.jsonl.job").exists()


def test_a_prompt_line_without_a_tokenizer_is_a_bad_line(ckpt, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).write_bytes((ckpt / f).read_bytes())
    inp = write_lines(tmp_path / "in.jsonl", [{"id": 1, "prompt": "w1"}, {"id": 2, "ids": [1]}])
    rc, _, err = job(capsys, bare, inp, tmp_path / "out.jsonl", "-n", 2, "--on-error", "fail")
    one_line_error(rc, err, "generate", "line 1", "tokenizer.json")
    rc, _, err = job(capsys, bare, inp, tmp_path / "out.jsonl", "-n", 2)
    assert rc == 0 and [r["id"] for r in read_records(tmp_path / "out.jsonl")] == [2], err
    assert "text" not in read_records(tmp_path / "out.jsonl")[0]


@pytest.mark.parametrize("flags, needles", [
    (["--max-batch", 0], ["--max-batch must be >= 1"]),
    (["--temperature", -1], ["temperature must be >= 0"]),
    (["--eos", VOCAB], ["eos must be a token id"]),
])
def test_bad_command_line_values_are_one_line(ckpt, tmp_path, capsys, flags, needles):
    inp = write_lines(tmp_path / "in.jsonl", [{"id": 1, "ids": [1]}])
    rc, _, err = job(capsys, ckpt, inp, tmp_path / "out.jsonl", *flags)
    one_line_error(rc, err, "generate", *needles)
    assert not (tmp_path / "out.jsonl").exists()


def test_input_and_output_go_together(ckpt, tmp_path, capsys):
    inp = write_lines(tmp_path / "in.jsonl", [{"id": 1, "ids": [1]}])
    rc, _, err = cli_run(capsys, "generate", ckpt, "--input", inp)
    one_line_error(rc, err, "generate", "--input needs --output")
    rc, _, err = cli_run(capsys, "generate", ckpt, "--ids", 1, "--output", tmp_path / "o.jsonl")
    one_line_error(rc, err, "generate", "--output is for a batch job")
    rc, _, err = job(capsys, ckpt, inp, inp)
    one_line_error(rc, err, "generate", "is the input file")
    rc, _, err = job(capsys, ckpt, tmp_path / "missing.jsonl", tmp_path / "o.jsonl")
    one_line_error(rc, err, "generate", "missing.jsonl")


# ----------------------------------------------------------------------------- the output file


def test_a_foreign_output_file_is_not_overwritten(ckpt, tmp_path, capsys):
    inp = write_lines(tmp_path / "in.jsonl", [{"id": 1, "ids": [1, 2]}])
    out = tmp_path / "notes.jsonl"
    out.write_text('{"id": 1, "mine": true}\n')
    rc, _, err = job(capsys, ckpt, inp, out, "-n", 2)
    one_line_error(rc, err, "generate", str(out), "not the output of a tblock generate job", "--force")
    assert out.read_text() == '{"id": 1, "mine": true}\n'
    rc, _, err = job(capsys, ckpt, inp, out, "-n", 2, "--force")
    assert rc == 0 and [r["id"] for r in read_records(out)] == [1], err


def test_a_job_of_other_settings_is_not_resumed(ckpt, tmp_path, capsys):
    """Another -n, or the input changed: an error naming the file and the settings that
    differ, the file untouched."""
    inp, out = write_lines(tmp_path / "in.jsonl", [{"id": 1, "ids": [1, 2]}]), tmp_path / "out.jsonl"
    assert job(capsys, ckpt, inp, out, "-n", 2, "--seed", 1)[0] == 0
    before = out.read_bytes()
    rc, _, err = job(capsys, ckpt, inp, out, "-n", 3, "--seed", 1)
    one_line_error(rc, err, "generate", str(out), "max_new_tokens", "--force", "another --output")
    write_lines(inp, [{"id": 1, "ids": [1, 3]}])
    rc, _, err = job(capsys, ckpt, inp, out, "-n", 2, "--seed", 1)
    one_line_error(rc, err, "generate", str(out), "input_sha256")
    assert out.read_bytes() == before


def test_a_torn_last_line_is_cut_and_its_record_written_again(ckpt, tmp_path, capsys):
    """The output of a run killed in the middle of a write: its last records gone, half a
    line at the end. The rerun appends the rest: the same bytes as the whole run."""
    inp = write_lines(tmp_path / "in.jsonl", [{"id": i, "ids": p} for i, p in enumerate(prompts(6, seed=4))])
    whole, part = tmp_path / "whole.jsonl", tmp_path / "part.jsonl"
    assert job(capsys, ckpt, inp, whole, "-n", 5, "--seed", 3)[0] == 0
    assert job(capsys, ckpt, inp, part, "-n", 5, "--seed", 3)[0] == 0
    lines = whole.read_bytes().splitlines(keepends=True)
    part.write_bytes(b"".join(lines[:2]) + lines[2][:len(lines[2]) // 2])
    rc, _, err = job(capsys, ckpt, inp, part, "-n", 5)          # no --seed: the job's own
    assert rc == 0, err
    assert "2 already in" in err and "base seed 3" in err
    assert part.read_bytes() == whole.read_bytes()


def test_an_output_line_that_is_no_record_is_refused(ckpt, tmp_path, capsys):
    inp, out = write_lines(tmp_path / "in.jsonl", [{"id": 1, "ids": [1]}]), tmp_path / "out.jsonl"
    assert job(capsys, ckpt, inp, out, "-n", 1)[0] == 0
    with open(out, "a") as f:
        f.write("garbage\n")
    rc, _, err = job(capsys, ckpt, inp, out, "-n", 1)
    one_line_error(rc, err, "generate", f"{out} line 2 is not a job record")


def test_ctrl_c_stops_cleanly_and_the_rerun_resumes(ckpt, tmp_path, capsys, monkeypatch):
    """A KeyboardInterrupt after the third record: exit 130, three records on disk, a line
    saying how to resume; the rerun gives the uninterrupted run's bytes."""
    inp = write_lines(tmp_path / "in.jsonl", [{"id": i, "ids": p} for i, p in enumerate(prompts(7, seed=5))])
    whole, part = tmp_path / "whole.jsonl", tmp_path / "part.jsonl"
    assert job(capsys, ckpt, inp, whole, "-n", 4, "--seed", 9, "--max-batch", 2)[0] == 0
    write = JobOutput.write

    def interrupted(self, record):
        if len(self.done_ids()) == 3:
            raise KeyboardInterrupt
        write(self, record)
    monkeypatch.setattr(JobOutput, "write", interrupted)
    rc, _, err = job(capsys, ckpt, inp, part, "-n", 4, "--seed", 9, "--max-batch", 2)
    assert rc == 130 and "interrupted: 3 of 7 prompts" in err and "rerun the same command" in err
    assert len(read_records(part)) == 3
    monkeypatch.setattr(JobOutput, "write", write)
    rc, _, err = job(capsys, ckpt, inp, part, "-n", 4, "--seed", 9, "--max-batch", 2)
    assert rc == 0 and "3 already in" in err, err
    assert part.read_bytes() == whole.read_bytes()


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.one_of(st.integers(-2**70, 2**70), st.text(max_size=6)), min_size=1, max_size=8,
                    unique=True),
       cut=st.floats(0, 1))
def test_reopening_keeps_exactly_the_lines_before_a_cut(tmp_path_factory, ids, cut):
    """Records of any ids (unicode, huge integers) cut at any byte: reopening keeps the
    complete lines before the cut, byte for byte, and their ids as done; a write appends."""
    out = tmp_path_factory.mktemp("cut") / "out.jsonl"
    with JobOutput(out, {"k": 1}, force=True) as f:
        for i in ids:
            f.write({"id": i, "ids": [1]})
    data = out.read_bytes()
    at = int(cut * len(data))
    out.write_bytes(data[:at])
    keep = data[:data[:at].rfind(b"\n") + 1]                 # whole lines only
    with JobOutput(out, {"k": 1}) as f:
        assert out.read_bytes() == keep
        assert f.done_ids() == {json.loads(x)["id"] for x in keep.splitlines()}
        f.write({"id": "new", "ids": []} if "new" not in f.done_ids() else {"id": "new2", "ids": []})
    assert out.read_bytes().startswith(keep) and out.read_bytes().count(b"\n") == keep.count(b"\n") + 1


class FakeTty:
    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_the_progress_line_is_redrawn_on_a_terminal():
    tty = FakeTty()
    p = Progress(total=5, before=2, stream=tty)
    p.add(4)
    p.add(6)
    p.finish("done")
    parts = tty.text.split("\r")
    assert parts[1].startswith("3/5 prompts, ") and parts[2].startswith("4/5 prompts, ")
    assert parts[2].endswith(" tokens/s") and parts[3] == "done\n" and "\n" not in "".join(parts[:3])
    assert p.tokens == 10


# ----------------------------------------------------------------------------- SIGKILL

# the CLI in a child process, every record followed by a pause: a kill lands between
# records with some written and some not (the pause is the test's, not the job's)
SLOW_CLI = """
import sys, time
from tblock.jobs import JobOutput
write = JobOutput.write
def slow(self, record):
    write(self, record)
    time.sleep(0.3)
JobOutput.write = slow
from tblock.cli import main
sys.exit(main(sys.argv[1:]))
"""


def complete_lines(path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.subprocess
def test_a_job_killed_mid_run_resumes_to_the_uninterrupted_output(ckpt, tmp_path, capsys):
    """SIGKILL once 1 <= records < all; the rerun (no --seed: the job's base seed, read back)
    writes the rest: the same bytes as an uninterrupted run with that seed, each id once."""
    n = 8
    inp = write_lines(tmp_path / "in.jsonl", [{"id": f"q{i}", "ids": p} for i, p in enumerate(prompts(n, seed=6))])
    out = tmp_path / "out.jsonl"
    script = tmp_path / "slow_cli.py"
    script.write_text(SLOW_CLI)
    args = ["generate", ckpt, "--input", inp, "--output", out, "-n", 6, "--top-k", 30, "--max-batch", 3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, str(script), *map(str, args)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600
        while complete_lines(out) < 1 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL, err.decode()
    assert 1 <= complete_lines(out) < n
    seed = int(re.search(r"base seed (\d+)", err.decode()).group(1))
    rc, _, err = cli_run(capsys, *args)
    assert rc == 0, err
    assert f"base seed {seed}" in err
    whole = tmp_path / "whole.jsonl"
    rc, _, err = cli_run(capsys, *args[:5], whole, *args[6:], "--seed", seed)
    assert rc == 0, err
    assert out.read_bytes() == whole.read_bytes()
    ids = [r["id"] for r in read_records(out)]
    assert ids == [f"q{i}" for i in range(n)]
