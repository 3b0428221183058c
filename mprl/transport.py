"""Moving experience and weights between processes through shared memory.

:class:`Rollouts` is the trajectory transport of the actor-learner shape (after torchbeast's
"monobeast"): a fixed number of rollout slots, each a set of preallocated shared-memory tensors
described by a spec, handed between workers and learner by index. A worker waits for one of its
slots to be free, writes a rollout into it in place and marks it full; the learner takes the
oldest full slots, reads them and frees them. Nothing is pickled, and when the learner is slower
the workers wait for their slots (back-pressure) instead of piling up data.

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
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from mprl import preflight

FieldSpec = tuple[Sequence[int], torch.dtype]  # (shape of one slot, dtype)
MAX_PAUSE_S = 0.001  # the longest a waiting call sleeps between looks


def _wait(
    ready: Callable[[], int | None], stop: Callable[[], bool], timeout: float | None
) -> int | None:
    """Poll ``ready()`` with sleeps backing off from 0.1 ms to :data:`MAX_PAUSE_S` until it
    gives a value; ``None`` once ``stop()`` is true or on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.0001
    while True:
        found = ready()
        if found is not None:
            return found
        if stop() or (deadline is not None and time.monotonic() >= deadline):
            return None
        time.sleep(pause)
        pause = min(pause * 2, MAX_PAUSE_S)


FREE, FULL, TAKEN = 0, 1, -1  # a slot's states; TAKEN: the learner is reading it


class Rollouts:
    """Rollout buffers in shared memory, ``slots_per_worker`` of them for each worker rank.

    :param spec: ``{name: (shape, dtype)}`` for one slot, e.g. ``{"obs": ((T + 1, E, 4),
        torch.float32), "action": ((T, E), torch.int64)}``. A ``version`` field (the policy
        version a rollout was collected with) and a ``source`` field (the worker rank) are added.
    :param workers: the number of worker ranks.
    :param slots_per_worker: rollouts a worker can have in flight: more keep it busy while the
        learner is busy, and make the rollouts the learner reads older.

    Each slot belongs to one rank and has a state, ``FREE``, ``FULL`` or ``TAKEN``, in a shared
    tensor. Only the owning worker turns a slot ``FULL`` (after writing it), only the learner
    turns it ``TAKEN`` (while reading it) and ``FREE`` (after), so no lock is needed, and a
    worker killed at any instruction leaves nothing locked: its restart simply carries on with
    its rank's slots. (A ``multiprocessing.Queue`` of indices would not survive that: a worker
    blocked in ``get()`` holds the queue's reader lock, and killing it wedges the queue for
    everyone.) Waiting sides look at the states every millisecond or so.
    """

    def __init__(self, spec: Mapping[str, FieldSpec], workers: int, slots_per_worker: int = 2):
        if workers < 1 or slots_per_worker < 1:
            raise ValueError(
                f"workers and slots_per_worker must be >= 1: {workers}, {slots_per_worker}"
            )
        slots = workers * slots_per_worker
        full_spec = {**spec, "version": ((), torch.int64), "source": ((), torch.int64)}
        nbytes = sum(
            slots * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            for shape, dtype in full_spec.values()
        )
        preflight.check_shm(nbytes, f"{slots} rollout slots")
        self.workers, self.slots_per_worker, self.slots = workers, slots_per_worker, slots
        self.buffers = {
            name: torch.zeros((slots, *shape), dtype=dtype).share_memory_()
            for name, (shape, dtype) in full_spec.items()
        }
        self._state = torch.zeros(slots, dtype=torch.int64).share_memory_()
        self._seq = torch.zeros(slots, dtype=torch.int64).share_memory_()  # commit order
        self._views()

    def _views(self) -> None:
        self._state_np, self._seq_np = self._state.numpy(), self._seq.numpy()
        self._cursor = 0  # which of its slots a worker fills next (per process)
        self._taken: list[dict[str, torch.Tensor]] = []  # copied out, not yet batched (learner)

    def __getstate__(self) -> dict[str, Any]:
        local = ("_cursor", "_taken")
        return {k: v for k, v in self.__dict__.items() if not k.endswith("_np") and k not in local}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._views()

    def slot(self, index: int) -> dict[str, torch.Tensor]:
        """The tensors of slot ``index`` (views into shared memory: write them in place)."""
        return {name: t[index] for name, t in self.buffers.items()}

    def acquire(self, rank: int, stop: Callable[[], bool], timeout: float | None = None):
        """The index of rank ``rank``'s next slot, once the learner has freed it (back-pressure:
        a worker ahead of the learner waits here). ``None`` once ``stop()`` is true (pass
        ``ctx.should_stop``) or on timeout."""
        index = rank * self.slots_per_worker + self._cursor

        def ready() -> int | None:
            return index if self._state_np[index] == FREE else None

        found = _wait(ready, stop, timeout)
        if found is not None:
            self._cursor = (self._cursor + 1) % self.slots_per_worker
        return found

    def commit(self, index: int) -> None:
        """Hand a filled slot to the learner."""
        self._seq_np[index] = time.monotonic_ns()
        self._state_np[index] = FULL  # after the data and the order: the learner reads it next

    def take(self, stop: Callable[[], bool], timeout: float | None = None) -> int | None:
        """The oldest filled slot's index for the learner; ``None`` once ``stop()`` is true or
        on timeout. Give it back with :meth:`release` once read."""

        def ready() -> int | None:
            full = np.flatnonzero(self._state_np == FULL)
            return int(full[np.argmin(self._seq_np[full])]) if full.size else None

        index = _wait(ready, stop, timeout)
        if index is not None:
            self._state_np[index] = TAKEN  # neither free nor offered again
        return index

    def release(self, index: int) -> None:
        """Give a slot back to its worker once its data has been used."""
        self._state_np[index] = FREE

    def take_batch(self, n: int, stop: Callable[[], bool]) -> dict[str, torch.Tensor] | None:
        """``n`` filled slots, stacked along a new dim 1 (``[T, n, ...]`` for ``[T, ...]``
        fields) in worker-rank order, so that a synchronous learner's batch, and with it a seeded
        run, does not depend on which worker finished first. Each slot is copied out and freed
        as soon as it is full, not once all ``n`` are: a worker writing its next rollout finds a
        free slot instead of waiting for the batch. ``None`` when stopping; the rollouts copied
        so far open the next call's batch."""
        while len(self._taken) < n:
            index = self.take(stop)
            if index is None:
                return None
            self._taken.append({name: t[index].clone() for name, t in self.buffers.items()})
            self.release(index)
        taken, self._taken = self._taken[:n], self._taken[n:]
        taken.sort(key=lambda part: int(part["source"]))  # stable: a rank's own order kept
        return {
            name: torch.stack([part[name] for part in taken], dim=1 if t.dim() > 1 else 0)
            for name, t in self.buffers.items()
        }


class Weights:
    """Version counter for publishing the shared model from the learner to the workers.

    The learner updates the shared model (``ctx.model``) in place inside :meth:`writing`;
    workers call :meth:`pull` to copy it into their local model when it changed. A sequence
    lock: the counter is odd while a write is in progress, so a reader that saw it change
    retries; the learner never waits for readers.
    """

    def __init__(self) -> None:
        self._seq = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._local()

    def _local(self) -> None:
        self._seq_np = self._seq.numpy()
        # (local, shared, their parameters) of the last pull: listing the parameters of a
        # small model costs as much as copying them (per process)
        self._params: tuple[Any, Any, list[torch.Tensor], list[torch.Tensor]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_seq": self._seq}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local()

    @property
    def version(self) -> int:
        """Number of completed updates."""
        return int(self._seq_np[0]) // 2

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps: the version, so a resumed run counts on from it."""
        return {"version": self.version}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self._seq[0] = 2 * int(state["version"])

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Wrap the learner's in-place update of the shared model (``optimizer.step()``)."""
        self._seq_np[0] += 1  # odd: a write is in progress
        try:
            yield
        finally:
            self._seq_np[0] += 1

    def wait(
        self, newer_than: int, stop: Callable[[], bool], timeout: float | None = None
    ) -> int | None:
        """Sleep until an update newer than version ``newer_than`` is complete and no write is
        in progress; return that version. ``None`` once ``stop()`` is true or on timeout.

        The worker's side of a synchronous algorithm's barrier: it sleeps (backing off to a
        millisecond), holds no lock, and a process killed while waiting wedges nobody.
        """

        def ready() -> int | None:
            seq = int(self._seq_np[0])
            return seq // 2 if seq % 2 == 0 and seq // 2 > newer_than else None

        return _wait(ready, stop, timeout)

    def pull(self, shared: torch.nn.Module, local: torch.nn.Module, have: int = -1) -> int:
        """Copy ``shared``'s parameters into ``local`` if they are newer than version ``have``;
        return the version ``local`` now holds."""
        cached = self._params
        if cached is None or cached[0] is not local or cached[1] is not shared:
            self._params = (local, shared, list(local.parameters()), list(shared.parameters()))
        while True:
            before = int(self._seq_np[0])
            if before % 2:  # the learner is writing: it is quick, look again
                time.sleep(0)
                continue
            if before // 2 == have:
                return have
            with torch.no_grad():
                for dst, src in zip(self._params[2], self._params[3], strict=True):
                    dst.copy_(src)
            if int(self._seq_np[0]) == before:
                return before // 2
