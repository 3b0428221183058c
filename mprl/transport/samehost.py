"""A hub's transport fields in memory that the processes of its machine map.

A process on the same machine as the run's hub (on Ray, the train process) uses the hub's own
objects (:mod:`mprl.transport.memory`), mapped into its process, as the local backend's
processes do: a worker hands its rollouts over, reads the newest weights and adds replay rows
with no call. On a machine whose cores are all busy, a call and its answer cost a worker about
a fifth of its time (see benchmarks/README.md, "Workers on the learner's machine: shared
memory").

The hub's process lays a field's tensors out in an anonymous file (``memfd_create``) and keeps
it open; the field's :class:`Arena` (pickled with the field to every process) says where. A
process maps it through ``/proc/<hub pid>/fd/<fd>``, and uses it only when it is on the same
boot of the same machine and the file starts with the arena's random token: a process on another
node (or in another container, with other pids) finds no such file, or another one, and calls
the hub. No name is ever made, so nothing is left in ``/dev/shm`` however the run ends: the
memory is freed with the last process that maps it.
"""

from __future__ import annotations

import mmap
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from mprl.transport.memory import (
    MemoryRollouts,
    MemoryWeights,
    TensorHolder,
    published_tensors,
)

ALIGN = 64  # every tensor starts on a cache line
TOKEN_BYTES = 16


def boot_id() -> str:
    """This boot of this machine ("" where the system does not say)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@attrs.frozen
class Arena:
    """Where a transport field's shared memory is: the hub's process ``pid`` holds it open as
    ``fd``; ``layout`` rebuilds the field's object (``kind``) over it."""

    boot: str
    pid: int
    fd: int
    size: int
    token: bytes
    kind: type
    layout: dict[str, Any]


def _plan(value: Any, offset: list[int]) -> Any:
    """``value``'s layout: each tensor's ``(offset, shape, dtype)``, placed from ``offset[0]``."""
    if isinstance(value, torch.Tensor):
        at = -(-offset[0] // ALIGN) * ALIGN
        offset[0] = at + value.numel() * value.element_size()
        return ("tensor", at, tuple(value.shape), value.dtype)
    if isinstance(value, torch.nn.Module):
        return ("module", [_plan(t, offset) for t in published_tensors(value)])
    if isinstance(value, dict):
        return ("dict", {k: _plan(v, offset) for k, v in value.items()})
    return ("value", value)


def _build(plan: Any, base: torch.Tensor) -> Any:
    kind = plan[0]
    if kind == "tensor":
        _, at, shape, dtype = plan
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return base[at : at + nbytes].view(dtype).view(shape)
    if kind == "module":
        return TensorHolder([_build(p, base) for p in plan[1]])
    if kind == "dict":
        return {k: _build(p, base) for k, p in plan[1].items()}
    return plan[1]


def _copy(dst: Any, src: Any) -> None:
    if isinstance(src, torch.Tensor):
        dst.copy_(src)
    elif isinstance(src, torch.nn.Module):
        for d, s in zip(published_tensors(dst), published_tensors(src), strict=True):
            d.copy_(s)
    elif isinstance(src, dict):
        for k in src:
            _copy(dst[k], src[k])


def _rebuild(kind: type, view: mmap.mmap, layout: Mapping[str, Any]) -> Any:
    base = torch.frombuffer(view, dtype=torch.uint8)
    obj = kind.__new__(kind)
    obj.__setstate__({name: _build(plan, base) for name, plan in layout.items()})
    obj._view = view  # the mapping lives as long as the object that reads it
    return obj


def make(obj: MemoryRollouts | MemoryWeights) -> tuple[Arena, Any] | None:
    """Move ``obj`` (made with ``share=False``) into a new arena of this process: the arena,
    and ``obj`` rebuilt over it. ``None`` where this system has no ``memfd_create``."""
    if not hasattr(os, "memfd_create") or not boot_id():
        return None
    state = obj.__getstate__()
    offset = [TOKEN_BYTES]
    layout = {name: _plan(value, offset) for name, value in state.items()}
    size = max(offset[0], ALIGN)
    try:
        fd = os.memfd_create("mprl-transport", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        view = mmap.mmap(fd, size)
    except OSError:
        return None
    token = secrets.token_bytes(TOKEN_BYTES)
    view[:TOKEN_BYTES] = token
    arena = Arena(boot_id(), os.getpid(), fd, size, token, type(obj), layout)
    shared = _rebuild(type(obj), view, layout)
    with torch.no_grad():
        for name, value in state.items():
            _copy(getattr(shared, name), value)
    return arena, shared


def open_arena(arena: Arena | None) -> Any | None:
    """The arena's object as this process maps it; ``None`` unless this process shares the
    hub's memory (same machine, same boot, the hub's file there with the arena's token)."""
    if arena is None or arena.boot != boot_id():
        return None
    try:
        fd = os.open(f"/proc/{arena.pid}/fd/{arena.fd}", os.O_RDWR)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size != arena.size:
            return None
        view = mmap.mmap(fd, arena.size)
    except OSError:
        return None
    finally:
        os.close(fd)
    if view[:TOKEN_BYTES] != arena.token:
        view.close()
        return None
    return _rebuild(arena.kind, view, arena.layout)
