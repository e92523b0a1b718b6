"""A folder the user names for a command's files (``report --out``, ``lesson --out``, ``demo
--export``): checked before the work, written at the end, never at the expense of the user's
files.

The rules.  A file tblock is about to write may replace one of the same name only where that
one is tblock's own (the command says how it knows) or ``--force`` was given; other files in
the folder are never touched.  Every file is written into a staging folder inside the target
and renamed into place, so a rename replaces a symlink itself, never what it points to, and
the folder itself is never renamed or removed: the working directory (``--out .``) and a mount
point stay where they are.  On a failure the staging folder goes, and so do the folders this
call created; nothing else changes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable


class OutputError(ValueError):
    """A folder a command cannot write into as asked: the CLI prints it in one line, exit 2.
    ``reason`` reads on its own after the option and the folder."""

    def __init__(self, option: str, given: str, reason: str):
        super().__init__(f"{option} {given!r}: {reason}")
        self.option, self.given, self.reason = option, given, reason


def _entry_exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()       # a dangling symlink is there too


def regular_file(path: Path) -> bool:
    """A plain file, not a symlink (which ``is_file`` follows) or anything else."""
    return path.is_file() and not path.is_symlink()


def foreign(folder: Path, names: Iterable[str], ours: Callable[[Path], bool]) -> list[str]:
    """Those of ``names`` present in ``folder`` that are not tblock's own (``ours``)."""
    return sorted(n for n in names if _entry_exists(folder / n) and not (regular_file(folder / n) and ours(folder / n)))


def _refuse(option: str, given: str, names: list[str]) -> None:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise OutputError(option, given, f"it holds {shown}, which tblock did not write: refusing to replace "
                      "them; choose another folder, or give --force to replace them (other files are "
                      "left alone)")


def check_folder(given: str, option: str, names: Iterable[str], ours: Callable[[Path], bool],
                 force: bool = False) -> Path:
    """Before any work: ``given`` is a folder or can be made one, it is writable (checked by
    making and removing a probe folder, since os.access lies to root), and the files to
    write replace only tblock's own there, unless ``force``.  Returns the absolute path."""
    path = Path(given).expanduser().absolute()
    try:
        if _entry_exists(path):
            if not path.is_dir():
                raise OutputError(option, given, "it exists and is not a folder")
            where = path
            if not force and foreign(path, names, ours):
                _refuse(option, given, foreign(path, names, ours))
        else:
            where = path.parent
            while not _entry_exists(where):
                where = where.parent
            if not where.is_dir():
                raise OutputError(option, given, f"it cannot be created: {where} is not a folder")
    except OSError as e:                # e.g. a name too long for the file system
        raise OutputError(option, given, f"it cannot be used: {e.strerror or e}") from None
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tblock-probe-", dir=where))
    except OSError as e:
        raise OutputError(option, given, f"it is not writable: {e.strerror} in {where}") from None
    return path


def _make_folders(path: Path) -> list[Path]:
    """mkdir -p ``path``; the folders it created, outermost first."""
    missing = []
    while not _entry_exists(path):
        missing.append(path)
        path = path.parent
    made = []
    try:
        for p in reversed(missing):
            p.mkdir()
            made.append(p)
    except BaseException:
        _remove_empty(made)
        raise
    return made


def _remove_empty(folders: list[Path]) -> None:
    for p in reversed(folders):
        try:
            p.rmdir()           # only if still empty: never anything the user put there
        except OSError:
            pass


def write_folder(path: Path, given: str, option: str, fill: Callable[[Path], Iterable[str]],
                 ours: Callable[[Path], bool], force: bool = False, stale: Iterable[str] = ()) -> list[Path]:
    """``fill(staging)`` writes the files into a staging folder and returns their names;
    each then replaces the file of that name in ``path`` (checked again: files may have come
    in during the run), and the ``stale`` names that are tblock's own and were not written
    this time are removed.  Returns the paths written.  OSErrors become OutputError."""
    path = Path(path)
    try:
        made = _make_folders(path)
    except OSError as e:
        raise OutputError(option, given, f"it cannot be created: {e.strerror} ({e.filename})") from None
    staging = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=".tblock-writing-", dir=path))
        names = list(fill(staging))
        if not force and foreign(path, names, ours):
            _refuse(option, given, foreign(path, names, ours))
        old = [n for n in stale if n not in names and regular_file(path / n) and ours(path / n)]
        for n in names:
            os.replace(staging / n, path / n)
        for n in old:
            (path / n).unlink()
        return [path / n for n in names]
    except BaseException as e:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
            staging = None
        _remove_empty(made)
        if isinstance(e, OSError):
            where = f" ({e.filename})" if e.filename else ""
            raise OutputError(option, given, f"the files cannot be written: {e.strerror or e}{where}") from None
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
