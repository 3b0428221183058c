"""The run directory: resolved config, metrics, checkpoints and the summary, all on disk."""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from mprl.errors import UsageError
from mprl.files import NotRegularFile, no_room, open_regular

CSV_COLUMNS = ("wall", "step", "source", "name", "value")
#: one encoder for every record (json.dumps with ``default=`` builds one per call)
_to_json = json.JSONEncoder(default=str).encode


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once: os.umask can only be read by setting it


#: the most a write of :func:`atomic_write` hands the file system at once: a cut (``cut``) is
#: seen between two of them, so a write of gigabytes stops within one
CHUNK = 4 << 20


class WriteCut(Exception):
    """An :func:`atomic_write` cut short on purpose (its ``cut`` said so): nothing was replaced."""


class _Chunked:
    """The file :func:`atomic_write` hands its writer: each write goes to the file system in
    chunks of :data:`CHUNK` bytes, and stops (:class:`WriteCut`) between two of them once
    ``cut()`` is true."""

    def __init__(self, f: Any, cut: Any) -> None:
        self.f, self.cut, self.was_cut = f, cut, False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), CHUNK):
            if self.cut():
                self.was_cut = True
                raise WriteCut
            self.f.write(view[start : start + CHUNK])
        return len(view)

    def flush(self) -> None:
        self.f.flush()


def atomic_write(path: Path, write: Any, cut: Any = None) -> None:
    """Write through a temp file in the same directory, fsync, then ``os.replace``.

    A reader (or a crash mid-write) sees the old file or the new one, never half of one. The old
    file is left as it is until the new one is whole: a write that fails, or is cut short, leaves
    it. ``cut``: a function asked between chunks of the write, and before the replace; once it
    returns true the write stops with :class:`WriteCut` (the temp file removed, the old file
    kept). An OSError that names the temp file names ``path`` instead: its name is random, and
    the same failure says the same words each time.
    """
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # no directory, a read-only one, a full disk
        _name_target(exc, "", path)
        raise
    chunked = None
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would make it: every file of a run alike
        with os.fdopen(fd, "wb") as f:
            if cut is not None:
                chunked = _Chunked(f, cut)
            write(f if chunked is None else chunked)
            f.flush()
            os.fsync(f.fileno())
        if cut is not None and cut():
            raise WriteCut
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if chunked is not None and chunked.was_cut and not isinstance(exc, WriteCut):
            raise WriteCut from None  # (torch.save says "unexpected pos" for it)
        _name_target(exc, tmp, path)
        raise


def _name_target(exc: BaseException, tmp: str, path: Path) -> None:
    """``exc`` (or the OSError behind it, as torch.save raises it) naming ``path``, not the
    temp file ``tmp``, or one like it (:func:`tempfile.mkstemp` tries several names)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.filename is not None:
            name = os.path.basename(os.fsdecode(exc.filename))
            if exc.filename == tmp or (name.startswith(f".{path.name}.") and name.endswith(".tmp")):
                exc.filename = str(path)
            return
        exc = exc.__context__  # type: ignore[assignment]


def _json_bytes(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode()


LOCK = ".lock"  # held (flock) by the process running in the directory; it holds that pid
METRICS = ("metrics.jsonl", "metrics.csv")

_FIXES = {
    errno.ENOSPC: "free some space",
    errno.EDQUOT: "free some space (the disk quota is spent)",
    errno.EFBIG: "raise the file size limit (ulimit -f)",
    errno.EROFS: "make it writable",
    errno.EACCES: "make it writable",
    errno.EPERM: "make it writable",
}


def _name_max(path: Path) -> int:
    """The longest file name (bytes) the file system of ``path``'s deepest existing parent
    takes; 255 where it cannot be asked."""
    limit = 255
    for parent in reversed(path.parents):
        try:
            limit = os.pathconf(parent, "PC_NAME_MAX")
        except (OSError, ValueError):
            break
    return limit


def refusal(run: Path, exc: OSError, *, resume: bool) -> UsageError:
    """The one line that says why the run directory ``run`` cannot be made (``resume``: resumed
    into) before the run starts, and what to do: ``exc`` is what the file system said."""
    what = "cannot resume into" if resume else "cannot create"
    other = "choose another --run-dir"
    if resume:
        other = "resume into a new directory with --run-dir NEW_DIR"
    text = exc.strerror or str(exc)
    if isinstance(exc, NotRegularFile):
        cause, fix = text, f"mprl writes only regular files there: remove it, or {other}"
    elif exc.errno == errno.ENAMETOOLONG:
        limit = _name_max(run)
        longest = max(run.parts, key=lambda part: len(os.fsencode(part)))
        size = len(os.fsencode(longest))
        cause = (
            f"a name in it is {size} bytes long, more than the {limit} its file system allows "
            f"({text})"
            if size > limit
            else f"the path is {len(os.fsencode(str(run)))} bytes long ({text})"
        )
        fix = "give a shorter path" if resume else "choose a shorter --run-dir"
    else:
        name = exc.filename
        if name is not None:
            with contextlib.suppress(ValueError):
                name = str(Path(name).relative_to(run))
            if name in (".", str(run)):
                name = None
        cause = f"{name}: {text}" if name else text
        if exc.errno == errno.EROFS:
            cause = f"{name or 'it'} is on a read-only file system"
        if exc.errno == errno.ENOSPC and (room := no_room(run)) != "the disk is full":
            cause += f" ({room})"
        fix = f"{_FIXES[exc.errno]}, or {other}" if exc.errno in _FIXES else other
    return UsageError(f"{what} run directory {str(run)!r}: {cause}; {fix}")


def _check_writable(*dirs: Path) -> None:
    """An OSError (EROFS or EACCES, naming the directory) for one this process cannot write."""
    effective = os.access in os.supports_effective_ids
    for d in dirs:
        if not os.access(d, os.W_OK | os.X_OK, effective_ids=effective):
            read_only = os.statvfs(d).f_flag & os.ST_RDONLY
            code = errno.EROFS if read_only else errno.EACCES
            raise OSError(code, "not writable: " + os.strerror(code), str(d))


def _end_line(fd: int) -> None:
    """Make the file end with a newline: a line cut short by a kill of the last session stays
    a line of its own (readers skip it) instead of taking the next session's first record."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")


class RunDir:
    """``config.json``, ``metrics.jsonl``, ``checkpoints/last.pt`` and ``summary.json``.

    :meth:`create` and :meth:`reopen` lock the directory for the process until :meth:`close`:
    a second run (or a resume) in it is refused naming the pid that holds it. The kernel drops
    the lock when its process dies, however it dies, so a stale lock is simply taken over.
    Every file of the directory that is opened in place (the lock, the metrics) is opened only
    if it is a regular file (:func:`mprl.files.open_regular`): a link planted there is refused,
    never written through. A directory that cannot be made or written is refused (a
    :class:`UsageError` naming it) before the run starts; :meth:`discard` removes what
    :meth:`create` made.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self._metrics: Any = None
        self._lock: int | None = None
        self._made: list[Path] | None = None  # the directories create() made, outer first

    def _take_lock(self) -> None:
        fd = open_regular(self.path / LOCK, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise UsageError(
                f"run directory {str(self.path)!r} is in use by another mprl process (pid "
                f"{holder}); wait for it to end or stop it (kill -INT {holder}), or choose "
                "another --run-dir"
            ) from None
        self._lock = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def _mkdirs(self, target: Path) -> None:
        """``target`` and its missing parents, each one made recorded (to be discarded)."""
        assert self._made is not None
        missing = []
        for d in (target, *target.parents):
            if d.exists():
                break
            missing.append(d)
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:  # made meanwhile by someone else: not ours to remove
                continue
            self._made.append(d)

    @classmethod
    def create(cls, path: str | Path | None, plugin: str, env: str) -> RunDir:
        """Create a new run directory; an existing non-empty one is refused (nothing is lost).

        One that cannot be made or written (a full disk, a read-only file system, a name too
        long) is refused with a :class:`UsageError` naming it, what was made of it removed.
        """
        if path is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            path = Path("runs") / f"{plugin}-{env.replace('/', '_')}-{stamp}-{os.getpid()}"
        p = Path(path)
        run = cls(p)
        run._made = []
        try:
            if p.exists() and (not p.is_dir() or any(p.iterdir())):
                raise UsageError(
                    f"run directory {str(p)!r} already exists and is not empty; choose another "
                    "--run-dir or remove it"
                )
            run._mkdirs(run.checkpoints)
            run._take_lock()
        except OSError as exc:
            run.discard()
            raise refusal(p, exc, resume=False) from None
        return run

    @classmethod
    def reopen(cls, path: str | Path) -> RunDir:
        """An existing run directory, to resume into: metrics are appended, from a new line.

        A directory this process cannot write, or one with a link or a FIFO where the lock or
        the metrics are, is refused (a :class:`UsageError` naming it) before anything in it is
        touched.
        """
        p = Path(path)
        try:
            is_run = (p / "checkpoints").is_dir()
        except OSError as exc:
            raise refusal(p, exc, resume=True) from None
        if not is_run:
            raise UsageError(f"{str(p)!r} is not a run directory (it has no checkpoints/)")
        run = cls(p)
        try:
            _check_writable(p, run.checkpoints)
            run._take_lock()  # before anything is touched: another process may be writing here
            for folder in (p, run.checkpoints):  # a write cut short by a crash of the last session
                for stale in folder.glob(".*.tmp"):
                    stale.unlink(missing_ok=True)
            run._open_metrics()
        except OSError as exc:
            run.close()
            raise refusal(p, exc, resume=True) from None
        return run

    def write_json(self, name: str, data: Mapping[str, Any]) -> Path:
        target = self.path / name
        atomic_write(target, lambda f: f.write(_json_bytes(data)))
        return target

    def write_config(self, config: Mapping[str, Any]) -> Path:
        """Write ``config.json`` before the run starts: a failure (a full disk) is a
        :class:`UsageError` naming the directory (the directory is left as it is: see
        :meth:`discard`)."""
        try:
            return self.write_json("config.json", config)
        except OSError as exc:
            if exc.filename is None:  # a failed write() or fsync() names no file
                exc = OSError(exc.errno, exc.strerror, str(self.path / "config.json"))
            raise refusal(self.path, exc, resume=self._made is None) from None

    def _open_metrics(self) -> None:
        """Open ``metrics.jsonl`` and ``metrics.csv`` to append to (regular files only), each
        ending in a newline (:func:`_end_line`), the CSV's header written when it is new."""
        files = []
        try:
            for name in METRICS:
                fd = open_regular(self.path / name, os.O_RDWR | os.O_APPEND | os.O_CREAT)
                try:
                    _end_line(fd)
                except BaseException:
                    os.close(fd)
                    raise
                files.append(os.fdopen(fd, "a", encoding="utf-8", newline=""))
            self._csv = csv.writer(files[1])
            if files[1].tell() == 0:
                self._csv.writerow(CSV_COLUMNS)
        except BaseException:
            for f in files:
                f.close()
            raise
        self._metrics, self._csv_file = files

    def append_metrics(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append to ``metrics.jsonl`` (every record whole) and ``metrics.csv`` (long format:
        a ``wall,step,source,name,value`` row per numeric value, for spreadsheets and pandas)."""
        if self._metrics is None:
            self._open_metrics()
        lines, rows = [], []
        for record in records:
            lines.append(_to_json(record))
            head = (record.get("wall"), record.get("step"), record.get("source"))
            rows.extend(
                (*head, name, value)
                for name, value in record.items()
                if name not in CSV_COLUMNS and isinstance(value, int | float)
            )
        if lines:
            self._metrics.write("\n".join(lines) + "\n")
        self._csv.writerows(rows)
        self._metrics.flush()
        self._csv_file.flush()

    def save_checkpoint(
        self, payload: Mapping[str, Any], name: str = "last.pt", cut: Any = None
    ) -> Path:
        """Write ``payload`` to ``checkpoints/NAME`` atomically; ``cut``: as
        :func:`atomic_write` takes it (a Ctrl-C that asks to exit without the checkpoint)."""
        target = self.checkpoints / name
        atomic_write(target, lambda f: torch.save(dict(payload), f), cut)
        return target

    def discard(self) -> None:
        """Remove what :meth:`create` made, before anything ran in the directory (its lock,
        ``config.json``, metrics not yet written, ``checkpoints/``, the directory and parents
        it made), so that the same command can be rerun; a directory that was there before is
        left, emptied of those. Closes the run directory (of a reopened one, only that)."""
        if self._made is not None:
            names = (LOCK, "config.json", *METRICS)
            for name in names:  # still ours, the lock too: the directory goes
                with contextlib.suppress(OSError):
                    (self.path / name).unlink(missing_ok=True)
            for made in reversed(self._made):
                with contextlib.suppress(OSError):
                    made.rmdir()
            if self.path not in self._made:  # the user's own (empty) directory
                with contextlib.suppress(OSError):
                    self.checkpoints.rmdir()
        self.close()

    def close(self) -> None:
        """Close the metrics files and give the directory's lock back."""
        if self._metrics is not None:
            self._metrics.close()
            self._csv_file.close()
            self._metrics = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
