"""The sweep directory on disk: what a sweep opens, writes and removes there, never through a
link (or anything else) planted in its place.

A sweep holds ``SWEEP_DIR/.lock`` and SQLite opens ``optuna.db`` in place: each only as a
regular file (:func:`mprl.files.open_regular`), the database only if it is one. The files a
sweep writes whole (``sweep.json``, ``configs/KEY.toml``, the results and the plot) replace what
is there atomically (:func:`write`) and each run's log is made anew (:func:`open_log`), so a link
at one of those paths is replaced, never written through. Its directories (``configs/``,
``logs/``, ``trials/`` and the run directories in it) are its own, never a link, and a run
directory is removed only where no process holds it (:func:`mprl.files.held_by`), never
through a link (:func:`remove_run_dir`). :func:`check` refuses, before anything starts,
whatever at one of those places is not a regular file or a directory of the sweep's own,
naming it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from mprl.errors import UsageError
from mprl.files import NotRegularFile, exists_as, open_new, open_regular

LOCK = ".lock"  # the sweep's, and a run directory's (held by the run in it, with its pid)
DATABASE = "optuna.db"
SQLITE = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database
#: the files a sweep opens in place or writes whole, and SQLite's own beside its database
FILES = (
    LOCK, "sweep.json", DATABASE, f"{DATABASE}-journal", f"{DATABASE}-wal", f"{DATABASE}-shm",
    "results.csv", "results.json", "sweep.png", "profiles.png",
)  # fmt: skip
#: each directory of a sweep: the names of what it keeps there, and whether those are directories
DIRS = {"configs": ("*.toml", False), "logs": ("*.log", False), "trials": ("*-seed*", True)}
FIX = "a sweep writes only files and directories of its own there, never through a link: remove it"


def refusal(root: Path, exc: NotRegularFile) -> UsageError:
    """The one line refusing sweep directory ``root`` for what :class:`NotRegularFile` names."""
    return UsageError(f"sweep directory {str(root)!r}: {exc.strerror}; {FIX}")


def check(root: Path) -> None:
    """Refuse what is at one of the sweep's places in ``root`` and is not a regular file (or a
    directory, for a directory) of its own: a link (even to one), a FIFO, a device.

    :raises UsageError: naming the first such path and what it is.
    """
    try:
        for name in FILES:
            exists_as(root / name)
        for name, (pattern, is_dir) in DIRS.items():
            if exists_as(root / name, directory=True):
                for path in sorted((root / name).glob(pattern)):
                    exists_as(path, directory=is_dir)
    except NotRegularFile as exc:
        raise refusal(root, exc) from None


def make_dir(root: Path, name: str) -> Path:
    """``root / name``, made if it is missing: a directory of the sweep's own, not a link.

    :raises UsageError: something else is there.
    """
    path = root / name
    try:
        if not exists_as(path, directory=True):
            with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
                path.mkdir()
            exists_as(path, directory=True)
    except NotRegularFile as exc:
        raise refusal(root, exc) from None
    return path


def write(path: Path, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``, atomically: written to a temp file beside
    it, then renamed over it, so a link there is replaced, never followed, and a reader (or a
    crash meanwhile) sees the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)  # as open() makes a file
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_text(path: Path) -> str:
    """The text of regular file ``path`` (a link there is refused, not followed).

    :raises FileNotFoundError: nothing is there. :raises NotRegularFile: something else is.
    """
    with os.fdopen(open_regular(path, os.O_RDONLY), encoding="utf-8") as f:
        return f.read()


def open_log(path: Path) -> BinaryIO:
    """A new file at ``path`` for a run's output: what was there (an earlier session's log, a
    link planted in its place) is replaced, never written through."""
    return open(path, "wb", opener=open_new)


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold ``SWEEP_DIR/.lock`` (with this pid in it) while the sweep runs: a second session
    is refused naming the pid that holds it.

    :raises UsageError: the lock is held, or is not a regular file.
    """
    try:
        fd = open_regular(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except NotRegularFile as exc:
        raise refusal(root, exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UsageError(f"sweep directory {str(root)!r} is in use by pid {holder}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)
    return None


def remove_run_dir(root: Path, path: Path) -> None:
    """Remove run directory ``path`` (in ``root / "trials"``) with all in it, never through a
    link: neither ``trials/`` nor ``path`` may be one, and what is inside is removed, not
    followed.

    :raises UsageError: one of them is not a directory of the sweep's own.
    """
    trials = path.parent
    try:
        exists_as(trials, directory=True)
        exists_as(path, directory=True)
    except NotRegularFile as exc:
        raise refusal(root, exc) from None
    fd = os.open(trials, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if sys.version_info >= (3, 11):  # relative to trials/ as opened: no link on the way
            shutil.rmtree(path.name, dir_fd=fd)
        else:
            shutil.rmtree(path)
    finally:
        os.close(fd)


def check_database(root: Path) -> Path:
    """``SWEEP_DIR/optuna.db``, where the sweep's Optuna study is kept, made here (empty) when
    it is new, so that SQLite never makes it at a link's target.

    :raises UsageError: it is a link (or another file than a regular one), or a file that is
        not a SQLite database, naming it.
    """
    path = root / DATABASE
    try:
        fd = open_regular(path, os.O_RDWR | os.O_CREAT, 0o644)
    except NotRegularFile as exc:
        raise refusal(root, exc) from None
    except OSError as exc:
        raise UsageError(
            f"sweep directory {str(root)!r}: cannot open {str(path)!r}: {exc.strerror}"
        ) from None
    try:
        head = os.pread(fd, len(SQLITE), 0)
    finally:
        os.close(fd)
    if head and head != SQLITE:  # an empty file is a new database to SQLite
        raise UsageError(
            f"sweep directory {str(root)!r}: {str(path)!r} is not a SQLite database (it begins "
            f"{head!r}); it is where the sweep keeps its Optuna study: restore it, or remove it "
            "to start the study anew"
        )
    return path
