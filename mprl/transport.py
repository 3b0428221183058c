"""Moving experience and weights between processes through shared memory.

:class:`Rollouts` is the trajectory transport of the actor-learner shape (the torchbeast
"monobeast" design): a fixed number of rollout slots, each a set of preallocated shared-memory
tensors described by a spec, and two queues that carry slot *indices* only. A worker takes a
free slot, writes a rollout into it in place and hands the index to the learner; the learner
reads the slot and gives the index back. Nothing is pickled but small ints, and when the learner
is slower the workers block on the free queue (back-pressure) instead of piling up data.

:class:`Weights` publishes a model from the train process to the workers: the learner updates
the shared model inside :meth:`Weights.writing`, which bumps a version counter around the write
(a sequence lock); a worker's :meth:`Weights.pull` copies the shared parameters into its local
model only when the version moved, and retries if the learner wrote meanwhile. The learner never
waits for a reader.

Both are created by an algorithm's ``make_shared`` function in the main process, before the
children are spawned, and reach every child through ``ctx.state``. The learner's side never
touches the Manager, and neither does a worker's per-step path.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import queue
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from mprl import preflight

FieldSpec = tuple[Sequence[int], torch.dtype]  # (shape of one slot, dtype)
POLL_S = 0.1  # how often blocked calls look at the stop flag


class Rollouts:
    """``slots`` rollout buffers in shared memory and the free / full queues of their indices.

    :param spec: ``{name: (shape, dtype)}`` for one slot, e.g. ``{"obs": ((T + 1, E, 4),
        torch.float32), "action": ((T, E), torch.int64)}``. A ``version`` field (the policy
        version a rollout was collected with) and a ``source`` field (the worker rank) are added.
    :param slots: how many rollouts can be in flight; about 2 per worker keeps workers busy
        while the learner reads.
    """

    def __init__(self, spec: Mapping[str, FieldSpec], slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        ctx = mp.get_context("spawn")
        full_spec = {**spec, "version": ((), torch.int64), "source": ((), torch.int64)}
        nbytes = sum(
            slots * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            for shape, dtype in full_spec.values()
        )
        preflight.check_shm(nbytes, f"{slots} rollout slots")
        self.slots = slots
        self.buffers = {
            name: torch.zeros((slots, *shape), dtype=dtype).share_memory_()
            for name, (shape, dtype) in full_spec.items()
        }
        self._free: Any = ctx.Queue()
        self._full: Any = ctx.Queue()
        for i in range(slots):
            self._free.put(i)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers.values())

    def slot(self, index: int) -> dict[str, torch.Tensor]:
        """The tensors of slot ``index`` (views into shared memory: write them in place)."""
        return {name: t[index] for name, t in self.buffers.items()}

    @staticmethod
    def _get(q: Any, stop: Callable[[], bool], timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not stop():
            wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if wait <= 0:
                return None
            try:
                return int(q.get(timeout=wait))
            except queue.Empty:
                continue
        return None

    def acquire(self, stop: Callable[[], bool], timeout: float | None = None) -> int | None:
        """A free slot's index for a worker to fill; blocks while all are in use (back-pressure).

        Returns ``None`` once ``stop()`` is true (pass ``ctx.should_stop``) or on timeout.
        """
        return self._get(self._free, stop, timeout)

    def commit(self, index: int) -> None:
        """Hand a filled slot to the learner."""
        self._full.put(index)

    def take(self, stop: Callable[[], bool], timeout: float | None = None) -> int | None:
        """A filled slot's index for the learner; ``None`` once ``stop()`` is true or on timeout."""
        return self._get(self._full, stop, timeout)

    def release(self, index: int) -> None:
        """Give a slot back to the workers once its data has been used."""
        self._free.put(index)

    def take_batch(
        self, n: int, stop: Callable[[], bool]
    ) -> tuple[list[int], dict[str, torch.Tensor]] | None:
        """``n`` filled slots, stacked along a new dim 1 (``[T, n, ...]`` for ``[T, ...]``
        fields), copied out so the slots can be released at once. ``None`` when stopping."""
        indices = []
        for _ in range(n):
            index = self.take(stop)
            if index is None:
                for i in indices:  # not used: give them back
                    self.release(i)
                return None
            indices.append(index)
        batch = {
            name: torch.stack([t[i] for i in indices], dim=1 if t.dim() > 1 else 0)
            for name, t in self.buffers.items()
        }
        for i in indices:
            self.release(i)
        return indices, batch


class Weights:
    """Version counter for publishing the shared model from the learner to the workers.

    The learner updates the shared model (``ctx.model``) in place inside :meth:`writing`;
    workers call :meth:`pull` to copy it into their local model when it changed. A sequence
    lock: the counter is odd while a write is in progress, so a reader that saw it change
    retries; the learner never waits for readers.
    """

    def __init__(self) -> None:
        self._seq = torch.zeros(1, dtype=torch.int64).share_memory_()

    @property
    def version(self) -> int:
        """Number of completed updates."""
        return int(self._seq[0]) // 2

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Wrap the learner's in-place update of the shared model (``optimizer.step()``)."""
        self._seq[0] += 1  # odd: a write is in progress
        try:
            yield
        finally:
            self._seq[0] += 1

    def pull(self, shared: torch.nn.Module, local: torch.nn.Module, have: int = -1) -> int:
        """Copy ``shared``'s parameters into ``local`` if they are newer than version ``have``;
        return the version ``local`` now holds."""
        while True:
            before = int(self._seq[0])
            if before % 2:  # the learner is writing: it is quick, look again
                time.sleep(0)
                continue
            if before // 2 == have:
                return have
            with torch.no_grad():
                for dst, src in zip(local.parameters(), shared.parameters(), strict=True):
                    dst.copy_(src)
            if int(self._seq[0]) == before:
                return before // 2
