"""Checks before a run starts anything: shared memory and open files for what it will share.

Two classic failures of multi-process PyTorch happen long after start, with cryptic messages:
a container's small ``/dev/shm`` (``Bus error`` in a child), and ``Too many open files`` when
the ``file_descriptor`` sharing strategy keeps one descriptor per shared tensor. Both are
predictable from what the run is about to share, so they are checked up front.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import resource
import shutil
from collections.abc import Callable, Iterable

import torch
import torch.multiprocessing

from mprl.backends import base
from mprl.errors import UsageError

SHM = "/dev/shm"
KIB, MIB, GIB = 2**10, 2**20, 2**30
#: each shared storage is a file of its own in ``/dev/shm``, of whole pages
PAGE = mmap.PAGESIZE
#: the memory of one child of its own: torch, gymnasium and an env imported (see
#: benchmarks/README.md, "A child's memory: 160 MiB")
CHILD_BYTES = 160 * MIB
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


def size_text(nbytes: float) -> str:
    """``nbytes`` for a message: MiB from 1 MiB up, KiB below (never "0 MiB" for 300 KiB)."""
    if nbytes >= MIB:
        return f"{nbytes / MIB:,.0f} MiB"
    return f"{math.ceil(nbytes / KIB):,} KiB"


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


def check_memory(processes: int, available: int | None = None) -> list[str]:
    """Refuse a run whose child processes cannot fit the machine's memory; a note when they
    take most of it, or when each would get little of a core. ``available``: the free memory
    (default: what the machine says)."""
    available = base.available_memory() if available is None else available
    need = processes * CHILD_BYTES
    notes = []
    if available is not None and need > available:
        raise UsageError(
            f"the run would start {processes} processes of about {CHILD_BYTES // MIB} MiB each "
            f"(torch and the envs in every one): {need / GIB:.1f} GiB, more than the "
            f"{available / GIB:.1f} GiB this machine has available. Use fewer workers "
            f"(--workers {max(1, available // CHILD_BYTES - 2)} at most here)"
        )
    if available is not None and need > 0.8 * available:
        notes.append(
            f"{processes} processes take about {need / GIB:.1f} GiB of the "
            f"{available / GIB:.1f} GiB available: the machine may start swapping"
        )
    cores = os.cpu_count() or 1
    if processes > 4 * cores:
        notes.append(
            f"{processes} processes on {cores} cores: each gets about {100 * cores // processes}% "
            "of a core, and starting them takes a while (start-up gets more time accordingly)"
        )
    return notes


def check(*, shm_bytes: int, storages: int, processes: int, shm: str = SHM) -> list[str]:
    """Raise :class:`UsageError` when the run cannot fit; return notes on what was adjusted.

    :param shm_bytes: bytes the run puts in shared memory (model, optimizer state, tensors).
    :param storages: how many shared storages (one open file each, with ``file_descriptor``).
    :param processes: how many child processes the run starts.
    """
    notes = check_memory(processes)
    # each storage is a file of whole pages: a thousand tensors of one float take 4 MiB
    check_shm(shm_bytes + storages * PAGE, "its model, optimizer state and shared tensors", shm)
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
