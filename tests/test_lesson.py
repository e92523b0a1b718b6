"""``tblock lesson`` end to end: the walk-through prints the lesson's numbers and writes PNGs."""

import subprocess
import sys

import pytest

import tblock
from tblock import lesson

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.subprocess
def test_tblock_lesson_end_to_end(tmp_path):
    pytest.importorskip("matplotlib", reason="the figures need matplotlib (the 'plot' extra)")
    out = tmp_path / "figs"
    run = subprocess.run([sys.executable, "-m", "tblock", "lesson", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    text = run.stdout
    for name in lesson.FIGURES:
        path = out / name
        assert path.is_file(), f"{name} was not written"
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert f"wrote {path}" in text
    # the lesson's numbers, as ours, in the printout
    for needle in ("ours 6.06976910601752", "ours   [0.000000, 0.000000, 0.775304, 0.351612]",
                   "ours   [0.000000, 0.000000, 1.758853, 0.000000]", "lesson 808   ours 808",
                   "lesson 840   ours 840", "ours   [0.000000, 0.328409, 1.110058, 1.712712]",
                   "ours 14.85162630563989", "8 of 8"):
        assert needle in text, needle
    assert "not shipped" not in text and "OUR" not in text      # every number is the lesson's experiment


# The lesson's Systems-lens table to the 4 decimals tblock prints (the lesson: 2.110514497741098 ...)
LESSON_TABLE_4 = {2: ["2.1105", "1.2876", "2.1436", "1.6272"],
                  4: ["3.4271", "1.3965", "2.1436", "1.4987"],
                  8: ["4.2591", "1.2614", "2.1436", "1.3894"]}


@pytest.mark.parametrize("backend", tblock.available_backends())
def test_block_2_and_the_systems_table_print_the_lessons_digits(backend):
    """Block 2 (seed(14)) and the N = 2, 4, 8 stacks (seed(1300)) come from the lesson's own
    generator, so the printed numbers are the lesson's, digit for digit."""
    lines = []
    lesson.walkthrough(backend=backend, out=lines.append)
    block2 = [line.split() for line in lines if "after block 2 |H|" in line]
    assert len(block2) == 1
    assert block2[0][4:8] == ["lesson", "14.85162630563989", "ours", "14.85162630563989"]
    for N, digits in LESSON_TABLE_4.items():
        for who in ("lesson", "ours"):
            row = [line.split() for line in lines if line.split()[:2] == [who, str(N)]]
            assert len(row) == 1, (who, N)
            assert row[0][2:6] == digits, (backend, who, N)


def test_walkthrough_numbers_match_on_every_backend():
    """The printed 'max |diff|' of every comparison row stays at the lesson's print precision."""
    for backend in tblock.available_backends():
        lines = []
        lesson.walkthrough(backend=backend, out=lines.append)
        rows = [line for line in lines if "|diff| " in line and "forward vs central" not in line]
        diffs = [float(line.rsplit("|diff| ", 1)[1].split()[0]) for line in rows]
        assert len(diffs) >= 18
        assert max(diffs) < 6e-7, backend                  # the lesson prints 6 decimals at worst
        shape_rows = [line.split("lesson ", 1)[1].split(" ours ") for line in lines if "lesson (" in line]
        assert len(shape_rows) == 12                       # the walk-through's 11 and block 2's output
        assert all(lesson_shape.strip() == ours.strip() for lesson_shape, ours in shape_rows)


@pytest.mark.subprocess
def test_bad_backend_is_a_clear_error(tmp_path):
    run = subprocess.run([sys.executable, "-m", "tblock", "lesson", "--out", str(tmp_path), "--backend", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "tblock lesson: error: backend must be one of" in run.stderr


@pytest.mark.subprocess
@pytest.mark.parametrize("bad", ["a_file", "a_file/sub"])
def test_an_unusable_out_folder_is_a_clear_error(tmp_path, bad):
    pytest.importorskip("matplotlib", reason="without matplotlib no figure folder is made")
    (tmp_path / "a_file").write_text("not a folder")
    run = subprocess.run([sys.executable, "-m", "tblock", "lesson", "--out", str(tmp_path / bad)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert f"tblock lesson: error: --out '{tmp_path / bad}' cannot hold the figures" in run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""     # refused before the walk-through
    assert (tmp_path / "a_file").read_text() == "not a folder"
