"""Checks before a run starts anything: shared memory and open files for what it will share.

Two classic failures of multi-process PyTorch happen long after start, with cryptic messages:
a container's small ``/dev/shm`` (``Bus error`` in a child), and ``Too many open files`` when
the ``file_descriptor`` sharing strategy keeps one descriptor per shared tensor. Both are
predictable from what the run is about to share, so they are checked up front.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import resource
import shutil
from collections.abc import Callable, Iterable

import torch
import torch.multiprocessing

from mprl.backends.processes import CHILD_BYTES, GIB, KIB, MIB, check_memory, size_text
from mprl.errors import UsageError

__all__ = ["CHILD_BYTES", "GIB", "KIB", "MIB", "check", "check_memory", "size_text"]

SHM = "/dev/shm"
#: each shared storage is a file of its own in ``/dev/shm``, of whole pages
PAGE = mmap.PAGESIZE
#: descriptors each child costs the main process (sentinel, pipes) with room to spare
FDS_PER_CHILD = 8
FDS_SPARE = 64


def shared_bytes(tensors: Iterable[torch.Tensor]) -> tuple[int, int]:
    """(bytes, number of storages) that sharing ``tensors`` takes; shared storages count once."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values()), len(seen)


def _fix(shm: str) -> str:
    return (
        f"Fix: free space in {shm}, give it more (docker run --shm-size=8g; or mount -o "
        f"remount,size=8G {shm}), or make it smaller"
    )


def check_shm(nbytes: int, what: str, shm: str = SHM) -> None:
    """Raise :class:`UsageError` with the fix when ``nbytes`` do not fit in ``/dev/shm``."""
    if not os.path.isdir(shm):
        return
    free = shutil.disk_usage(shm).free
    if nbytes > free:
        raise UsageError(
            f"the run needs about {size_text(nbytes)} of shared memory for {what}, but "
            f"{shm} has {size_text(free)} free. {_fix(shm)}"
        )


def share(put: Callable[[], None], what: str, shm: str = SHM) -> None:
    """``put()``: put ``what`` in shared memory. If ``shm`` fills up meanwhile (something else
    took it since :func:`check`), torch raises and leaves the file it could not fill there:
    it is removed, and the error says what to do. Nothing else of the run exists yet."""
    pattern = f"torch_{os.getpid()}_"
    before = _own_files(shm, pattern)
    try:
        put()
    except RuntimeError as exc:
        text = str(exc)
        if "shared memory" not in text and "shm" not in text:
            raise
        for name in _own_files(shm, pattern) - before:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(shm, name))
        free = shutil.disk_usage(shm).free if os.path.isdir(shm) else 0
        raise UsageError(
            f"could not put {what} in shared memory ({text.strip().splitlines()[0]}); {shm} "
            f"has {size_text(free)} free. {_fix(shm)}"
        ) from None


def _own_files(shm: str, prefix: str) -> set[str]:
    try:
        return {name for name in os.listdir(shm) if name.startswith(prefix)}
    except OSError:
        return set()


def check(*, shm_bytes: int, storages: int, processes: int, shm: str = SHM) -> list[str]:
    """Raise :class:`UsageError` when the run cannot fit; return notes on what was adjusted.

    :param shm_bytes: bytes the run puts in shared memory (model, optimizer state, tensors).
    :param storages: how many shared storages (one open file each, with ``file_descriptor``).
    :param processes: how many child processes the run starts.
    """
    # each storage is a file of whole pages: a thousand tensors of one float take 4 MiB
    check_shm(shm_bytes + storages * PAGE, "its model, optimizer state and shared tensors", shm)
    notes = check_memory(processes, shared_bytes=shm_bytes)  # what is shared is memory too
    if torch.multiprocessing.get_sharing_strategy() == "file_descriptor":
        open_now = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 16
        need = open_now + storages + FDS_PER_CHILD * processes + FDS_SPARE
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if need > soft:
            if hard != resource.RLIM_INFINITY and need > hard:
                raise UsageError(
                    f"the run needs about {need} open files ({storages} shared tensors with "
                    f"torch's 'file_descriptor' sharing strategy, {processes} processes), but "
                    f"the open-file limit is {hard} (`ulimit -Hn`). Fix: raise it (`ulimit -n "
                    f"{2 * need}` as root, LimitNOFILE= for systemd, --ulimit nofile={2 * need} "
                    "for docker), or call torch.multiprocessing.set_sharing_strategy"
                    "('file_system') before mprl.run()"
                )
            target = need * 2 if hard == resource.RLIM_INFINITY else min(hard, need * 2)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            notes.append(f"raised the open-file limit from {soft} to {target} for {need} files")
    return notes
