"""The run directory: resolved config, metrics, checkpoints and the summary, all on disk."""

from __future__ import annotations

import contextlib
import csv
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

CSV_COLUMNS = ("wall", "step", "source", "name", "value")
#: one encoder for every record (json.dumps with ``default=`` builds one per call)
_to_json = json.JSONEncoder(default=str).encode


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once: os.umask can only be read by setting it


def atomic_write(path: Path, write: Any) -> None:
    """Write through a temp file in the same directory, fsync, then ``os.replace``.

    A reader (or a crash mid-write) sees the old file or the new one, never half of one.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would make it: every file of a run alike
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _json_bytes(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode()


LOCK = ".lock"  # held (flock) by the process running in the directory; it holds that pid


class RunDir:
    """``config.json``, ``metrics.jsonl``, ``checkpoints/last.pt`` and ``summary.json``.

    :meth:`create` and :meth:`reopen` lock the directory for the process until :meth:`close`:
    a second run (or a resume) in it is refused naming the pid that holds it. The kernel drops
    the lock when its process dies, however it dies, so a stale lock is simply taken over.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self._metrics: Any = None
        self._lock: int | None = None

    def _take_lock(self) -> None:
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
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
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock = fd

    @classmethod
    def create(cls, path: str | Path | None, plugin: str, env: str) -> RunDir:
        """Create a new run directory; an existing non-empty one is refused (nothing is lost)."""
        if path is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            path = Path("runs") / f"{plugin}-{env.replace('/', '_')}-{stamp}-{os.getpid()}"
        p = Path(path)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise UsageError(
                f"run directory {str(p)!r} already exists and is not empty; choose another "
                "--run-dir or remove it"
            )
        try:
            p.mkdir(parents=True, exist_ok=True)
            (p / "checkpoints").mkdir(exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create run directory {str(p)!r}: {exc}") from None
        run = cls(p)
        run._take_lock()
        return run

    @classmethod
    def reopen(cls, path: str | Path) -> RunDir:
        """An existing run directory, to resume into: metrics are appended."""
        p = Path(path)
        if not (p / "checkpoints").is_dir():
            raise UsageError(f"{str(p)!r} is not a run directory (it has no checkpoints/)")
        run = cls(p)
        run._take_lock()  # before anything is touched: another process may be writing here
        for stale in p.glob("**/.*.tmp"):  # a write cut short by a crash of the last session
            stale.unlink(missing_ok=True)
        return run

    def write_json(self, name: str, data: Mapping[str, Any]) -> Path:
        target = self.path / name
        atomic_write(target, lambda f: f.write(_json_bytes(data)))
        return target

    def append_metrics(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append to ``metrics.jsonl`` (every record whole) and ``metrics.csv`` (long format:
        a ``wall,step,source,name,value`` row per numeric value, for spreadsheets and pandas)."""
        if self._metrics is None:
            self._metrics = (self.path / "metrics.jsonl").open("a", encoding="utf-8")
            self._csv_file = (self.path / "metrics.csv").open("a", encoding="utf-8", newline="")
            self._csv = csv.writer(self._csv_file)
            if self._csv_file.tell() == 0:
                self._csv.writerow(CSV_COLUMNS)
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

    def save_checkpoint(self, payload: Mapping[str, Any], name: str = "last.pt") -> Path:
        target = self.checkpoints / name
        atomic_write(target, lambda f: torch.save(dict(payload), f))
        return target

    def discard(self) -> None:
        """Remove a run directory made by :meth:`create` before anything ran in it (it holds
        only ``config.json`` and an empty ``checkpoints/``), so the same command can be rerun."""
        with contextlib.suppress(OSError):
            (self.path / LOCK).unlink(missing_ok=True)  # still ours: the directory goes
            (self.path / "config.json").unlink(missing_ok=True)
            self.checkpoints.rmdir()
            self.path.rmdir()

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
