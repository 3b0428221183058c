"""Opening the files of a run directory in place without following what was planted there.

A run writes into files it opens in place (its lock, ``metrics.jsonl``, ``metrics.csv``, each
child's stack file). A symbolic link at one of those paths would make the run write through it,
into whatever file it names; a FIFO would block the run for ever. :func:`open_regular` opens
only a regular file (``O_NOFOLLOW``, then ``fstat``) and raises :class:`NotRegularFile` for
anything else; :func:`open_new` replaces whatever is at the path by a new file;
:func:`exists_as` says whether a regular file (or a directory) is at a path, refusing anything
else there the same way. Files written whole are replaced atomically instead
(``mprl.host.rundir.atomic_write``), which never follows a link either. A leaf: the host and
the backends both import it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class NotRegularFile(OSError):
    """A path that mprl would write in place is not a regular file (a link, a FIFO, ...)."""


def _what(path: str | Path, st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a symbolic link (to {os.readlink(path)!r})"
        except OSError:
            return "a symbolic link"
    return next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")


def _refuse(path: str | Path, st: os.stat_result, wanted: str = "a regular file") -> NotRegularFile:
    return NotRegularFile(
        errno.EINVAL, f"{str(path)!r} is {_what(path, st)}, not {wanted}", str(path)
    )


def exists_as(path: str | Path, *, directory: bool = False) -> bool:
    """Whether a regular file (``directory``: a directory) is at ``path`` itself, a symbolic
    link there not followed: False when nothing is; anything else there (a link, even to one, a
    FIFO, a device, a directory where a file is wanted or the reverse) raises
    :class:`NotRegularFile` naming it and what it is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not (stat.S_ISDIR if directory else stat.S_ISREG)(st.st_mode):
        raise _refuse(path, st, "a directory" if directory else "a regular file")
    return True


def open_regular(path: str | Path, flags: int, mode: int = 0o666) -> int:
    """``os.open(path, flags, mode)`` for a regular file only: a symbolic link at ``path`` is
    not followed, and it, a FIFO, a device or a directory raise :class:`NotRegularFile` (no
    file is opened that could block or have side effects). Returns the descriptor."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st)
    try:  # O_NONBLOCK: a FIFO put there since cannot block the open
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:  # a link or a FIFO put there since the lstat
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            try:
                st = os.lstat(path)
            except OSError:
                raise exc from None
            if not stat.S_ISREG(st.st_mode):
                raise _refuse(path, st) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_new(path: str | Path, flags: int, mode: int = 0o666) -> int:
    """An opener for ``open(path, "w", opener=open_new)``: whatever is at ``path`` (an old file,
    or a link planted in its place) is removed, not followed, and a new regular file is made
    there (``O_EXCL``: a link put back meanwhile fails the open instead of being written
    through)."""
    Path(path).unlink(missing_ok=True)
    flags &= ~os.O_TRUNC
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def no_room(path: str | Path) -> str:
    """Why a write to ``path`` got ``ENOSPC``, in words: its file system has no inodes left
    (a file cannot be made however many bytes are free: ``df -i``), or the disk is full."""
    for at in (Path(path), *Path(path).parents):
        try:
            st = os.statvfs(at)
        except OSError:
            continue
        if st.f_files and not st.f_favail:
            return "its file system has no free inodes left"
        break
    return "the disk is full"


def held_by(run_dir: str | Path) -> str | None:
    """The pid that holds the run directory ``run_dir`` (its ``.lock``, locked by the run going
    on in it), as it wrote it there (``"?"`` where it wrote none); ``None`` when no process
    holds it. The lock is opened through no link and without blocking on a FIFO."""
    try:
        fd = open_regular(Path(run_dir) / ".lock", os.O_RDONLY)
    except OSError:  # none there (or not a regular file: no run could hold it)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
    finally:
        os.close(fd)  # our own shared lock, if we got it, goes with it
