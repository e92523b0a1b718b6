"""``report --out``, ``lesson --out`` and ``demo --export`` (issue #31): never delete, replace
or write through a user's files without ``--force``, never remove or rename the folder itself
(a mount point, the working directory), and a folder that cannot be made is one line on
stderr and exit status 2.  Each case as a user would hit it: the command line, in a child
process where the folder is the working directory or a mount point."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_run, one_line_error

from tblock.lesson import FIGURES, demo_server

# the smallest report: one backend, one T, no plots, no peers
TINY = ["--d-model", "16", "--n-heads", "2", "--T-list", "4", "--backends", "numpy", "--repeats", "1",
        "--target-time", "0", "--ceiling-sizes", "32", "--no-plots", "--peers", "none"]
REPORT = ["report.json", "report.md"]


def tblock_cmd(*args):
    return [sys.executable, "-m", "tblock", *map(str, args)]


def tree(folder):
    """Every entry under ``folder``: its name, and its bytes or where it links to."""
    return sorted((str(p.relative_to(folder)), os.readlink(p) if p.is_symlink() else
                   p.read_bytes() if p.is_file() else None) for p in Path(folder).rglob("*"))


def _mount_namespace():
    """The prefix of a command run in a private mount namespace, or None where this process
    may not make one (it needs root, or unprivileged user namespaces)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    prefix = ["unshare", "-m", "--propagation", "private"]
    probe = subprocess.run(prefix + ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/mnt"], capture_output=True)
    return prefix if probe.returncode == 0 else None


# ---- report --out ----------------------------------------------------------------------

@pytest.mark.subprocess
def test_report_into_a_mount_point(tmp_path):
    """Issue #31: the report was built beside --out and renamed onto it, and renaming a mount
    point fails with EBUSY: the run failed at the end, lost the report and left a folder
    beside it.  Here a tmpfs of its own is mounted on --out (a mount namespace, so nothing
    outside the test sees it) and the report is written there twice, the second replacing
    the first."""
    prefix = _mount_namespace()
    if prefix is None:
        pytest.skip("mounting a tmpfs needs root and mount namespaces (unshare -m), not available here")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cmd = tblock_cmd("report", *TINY, "--out", mnt)
    script = 'mount -t tmpfs -o size=64m tmpfs "$0" && "$@" && "$@" && mountpoint -q "$0" && ls -A "$0"'
    p = subprocess.run(prefix + ["sh", "-c", script, str(mnt), *cmd], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(p.stdout.split()[-2:]) == REPORT         # what the mount held at the end
    assert [e.name for e in tmp_path.iterdir()] == ["mnt"]  # nothing left beside it


@pytest.mark.slow     # a whole report run
def test_the_report_folder_itself_is_never_renamed_or_removed(tmp_path, capsys, monkeypatch):
    """The same without a mount: renaming or removing the --out folder itself fails, as on
    a mount point (EBUSY); the report is written anyway, twice."""
    out = tmp_path / "rep"
    out.mkdir()
    real_rename, real_replace, real_rmdir = os.rename, os.replace, os.rmdir

    def refuse(real):
        def call(src, *rest, **kw):
            if os.path.abspath(src) == str(out):
                raise OSError(16, "Device or resource busy", str(src))
            return real(src, *rest, **kw)
        return call
    for name, real in (("rename", real_rename), ("replace", real_replace), ("rmdir", real_rmdir)):
        monkeypatch.setattr(os, name, refuse(real))
    for _ in range(2):
        rc, out_text, err = cli_run(capsys, "report", *TINY, "--out", out)
        assert rc == 0, err
        assert sorted(p.name for p in out.iterdir()) == REPORT
    assert [e.name for e in tmp_path.iterdir()] == ["rep"]


@pytest.mark.subprocess
def test_report_into_the_working_directory_keeps_it(tmp_path):
    """Issue #31: ``--out .`` renamed the working directory away, deleted it and made a new
    one in its place.  Now the files go into it, and the folder stays the same folder."""
    here = tmp_path / "work"
    here.mkdir()
    inode = here.stat().st_ino
    for _ in range(2):          # the second run replaces the first's report
        p = subprocess.run(tblock_cmd("report", *TINY, "--out", "."), cwd=here, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        assert here.stat().st_ino == inode
        assert sorted(e.name for e in here.iterdir()) == REPORT
    assert [e.name for e in tmp_path.iterdir()] == ["work"]


@pytest.mark.subprocess
def test_the_working_directory_with_other_files_needs_force(tmp_path):
    here = tmp_path / "work"
    here.mkdir()
    (here / "notes.txt").write_text("precious")
    p = subprocess.run(tblock_cmd("report", *TINY, "--out", "."), cwd=here, capture_output=True, text=True,
                       timeout=600)
    one_line_error(p.returncode, p.stderr, "report", "--out '.'", "notes.txt", "--force")
    assert tree(here) == [("notes.txt", b"precious")]
    p = subprocess.run(tblock_cmd("report", *TINY, "--out", ".", "--force"), cwd=here, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(e.name for e in here.iterdir()) == ["notes.txt", *REPORT]
    assert (here / "notes.txt").read_text() == "precious"


@pytest.mark.slow     # a whole report run
def test_force_replaces_a_symlink_never_what_it_points_to(tmp_path, capsys):
    outside = tmp_path / "mine.md"
    outside.write_text("the user's own notes")
    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.md").symlink_to(outside)
    rc, _, err = cli_run(capsys, "report", *TINY, "--out", out)
    one_line_error(rc, err, "report", "report.md", "refusing")
    assert (out / "report.md").is_symlink()
    rc, _, err = cli_run(capsys, "report", *TINY, "--out", out, "--force")
    assert rc == 0, err
    assert not (out / "report.md").is_symlink() and "tblock report" in (out / "report.md").read_text()
    assert outside.read_text() == "the user's own notes"


# ---- demo --export ---------------------------------------------------------------------

def test_export_never_overwrites_a_users_page(tmp_path, capsys):
    """Issue #31: --export wrote index.html over the user's own, and through a symlink."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<h1>my home page</h1>")
    (site / "other.txt").write_text("kept")
    target = tmp_path / "elsewhere.js"
    target.write_text("// the user's script")
    (site / "demo.js").symlink_to(target)
    before = tree(site)
    rc, _, err = cli_run(capsys, "demo", "--export", site)
    one_line_error(rc, err, "demo", "--export", "demo.js, index.html", "refusing", "--force")
    assert tree(site) == before and target.read_text() == "// the user's script"


def test_export_replaces_an_earlier_export_and_force_replaces_the_users(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_server.demo_page, "all_runs", lambda temperatures: {"a run": 1})   # the page's work
    site = tmp_path / "site"
    demo_server.export(site)
    first = tree(site)
    assert [name for name, _ in first] == sorted(demo_server.EXPORTED) and "runs.js" in demo_server.EXPORTED
    demo_server.export(site)                   # its own earlier export: replaced without --force
    assert tree(site) == first
    (site / "runs.js").write_text("my own runs.js")     # no longer an export's folder
    (site / "notes.txt").write_text("kept")
    target = tmp_path / "elsewhere.css"
    target.write_text("/* the user's */")
    (site / "demo.css").unlink()
    (site / "demo.css").symlink_to(target)
    with pytest.raises(ValueError, match="refusing"):
        demo_server.export(site)
    demo_server.export(site, force=True)
    assert tree(site) == sorted(first + [("notes.txt", b"kept")])
    assert target.read_text() == "/* the user's */"


# ---- lesson --out ----------------------------------------------------------------------

@pytest.mark.slow     # a whole lesson run, its figures drawn
def test_lesson_never_overwrites_a_users_figure(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="without matplotlib the lesson writes no figures")
    figs = tmp_path / "figs"
    figs.mkdir()
    (figs / FIGURES[1]).write_bytes(b"\x89PNG the user's own picture")
    before = tree(figs)
    rc, out, err = cli_run(capsys, "lesson", "--out", figs)
    one_line_error(rc, err, "lesson", FIGURES[1], "refusing", "--force")
    assert out == "" and tree(figs) == before          # refused before the walk-through
    rc, out, err = cli_run(capsys, "lesson", "--out", figs, "--force")
    assert rc == 0, err
    assert sorted(e.name for e in figs.iterdir()) == sorted(FIGURES)
    assert (figs / FIGURES[1]).read_bytes() != b"\x89PNG the user's own picture"
    rc, out, err = cli_run(capsys, "lesson", "--out", figs)      # its own figures: replaced
    assert rc == 0, err
    assert [e.name for e in tmp_path.iterdir()] == ["figs"]


# ---- folders that cannot be made ---------------------------------------------------------

COMMANDS = {"report": ["report", *TINY, "--out"], "lesson": ["lesson", "--out"], "demo": ["demo", "--export"]}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("where", ["file/sub", "file", "proc", "long"])
def test_a_folder_that_cannot_be_made_is_one_line_and_exit_2(tmp_path, capsys, command, where):
    if command == "lesson":
        pytest.importorskip("matplotlib", reason="without matplotlib the lesson makes no folder")
    (tmp_path / "file").write_text("not a folder")
    folder = {"file/sub": tmp_path / "file" / "sub", "file": tmp_path / "file",
              "proc": Path("/proc/tblock-no-such-folder/out"), "long": tmp_path / ("x" * 300) / "out"}[where]
    rc, out, err = cli_run(capsys, *COMMANDS[command], folder)
    one_line_error(rc, err, command)
    assert out == ""
    assert tree(tmp_path) == [("file", b"not a folder")]
