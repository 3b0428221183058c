"""Checks before a run starts anything: shared memory and open files for what it will share.

Two classic failures of multi-process PyTorch happen long after start, with cryptic messages:
a container's small ``/dev/shm`` (``Bus error`` in a child), and ``Too many open files`` when
the ``file_descriptor`` sharing strategy keeps one descriptor per shared tensor. Both are
predictable from what the run is about to share, so they are checked up front.
"""

from __future__ import annotations

import os
import resource
import shutil
from collections.abc import Iterable

import torch
import torch.multiprocessing

from mprl.errors import UsageError

SHM = "/dev/shm"
MIB = 2**20
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


def check_shm(nbytes: int, what: str, shm: str = SHM) -> None:
    """Raise :class:`UsageError` with the fix when ``nbytes`` do not fit in ``/dev/shm``."""
    if not os.path.isdir(shm):
        return
    free = shutil.disk_usage(shm).free
    if nbytes > free:
        raise UsageError(
            f"the run needs about {nbytes / MIB:,.0f} MiB of shared memory for {what}, but "
            f"{shm} has {free / MIB:,.0f} MiB free. Fix: free space in {shm}, give it more "
            f"(docker run --shm-size=8g; or mount -o remount,size=8G {shm}), or make it smaller"
        )


def check(*, shm_bytes: int, storages: int, processes: int, shm: str = SHM) -> list[str]:
    """Raise :class:`UsageError` when the run cannot fit; return notes on what was adjusted.

    :param shm_bytes: bytes the run puts in shared memory (model, optimizer state, tensors).
    :param storages: how many shared storages (one open file each, with ``file_descriptor``).
    :param processes: how many child processes the run starts.
    """
    notes = []
    check_shm(shm_bytes, "its model, optimizer state and shared tensors", shm)
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
