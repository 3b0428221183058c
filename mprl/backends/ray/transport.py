"""The schema's transport fields across Ray nodes: rollouts and weights through Ray's object store.

Bulk data never goes through an actor: a worker puts a committed rollout in the object store
(``ray.put``, one copy, zero-copy reads on the learner's node) and hands its reference to the
run's :class:`Hub`, a small async actor on the driver's node that keeps only references and
counts. The hub gives the learner references in commit order and tells a worker when its rank
has room again (``slots_per_worker`` rollouts not yet taken: the local backend's back-pressure).
Weights are published the same way: the learner puts its floating-point tensors and the hub
keeps the newest reference and its version.

Every wait is a remote call of at most :data:`WAIT_SLICE_S`, so a waiting process looks at the
run's stop flag (and beats its heartbeat) that often; waits return ``None`` once the run stops,
as on the local backend.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import ray
import torch

from mprl.backends.tensors import _floating
from mprl.schema import RowSpec

#: the longest one remote wait lasts, so stop checks and heartbeats come at least this often
WAIT_SLICE_S = 0.1
#: a remote call that should answer at once but does not within this long is an error
CALL_TIMEOUT_S = 60.0


def _never() -> bool:
    return False


class Hub:
    """The run's meeting point for transport (an async Ray actor on the driver's node).

    Per rollouts field: a queue of ``(rank, [ref])`` in commit order and how many each rank has
    queued. Per weights field: the newest ``(version, [ref])``. References travel wrapped in a
    list, so Ray hands them over instead of resolving them.
    """

    def __init__(self) -> None:
        self.queues: dict[str, deque[tuple[int, list[Any]]]] = {}
        self.queued: dict[str, dict[int, int]] = {}
        self.weights: dict[str, tuple[int, list[Any]]] = {}
        self._changed: asyncio.Condition | None = None

    def _cond(self) -> asyncio.Condition:
        if self._changed is None:  # made on the actor's event loop
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        async with self._cond():
            self._cond().notify_all()

    async def _until(self, ready: Callable[[], Any], timeout: float) -> Any:
        cond = self._cond()
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(lambda: ready() is not None), timeout)
            except asyncio.TimeoutError:
                return None
        return ready()

    # -- rollouts ------------------------------------------------------------------------------

    async def put(self, field: str, rank: int, ref: list[Any]) -> None:
        self.queues.setdefault(field, deque()).append((rank, ref))
        counts = self.queued.setdefault(field, {})
        counts[rank] = counts.get(rank, 0) + 1
        await self._notify()

    async def room(self, field: str, rank: int, limit: int, timeout: float) -> bool:
        counts = self.queued.setdefault(field, {})
        found = await self._until(lambda: True if counts.get(rank, 0) < limit else None, timeout)
        return bool(found)

    async def take(self, field: str, n: int, timeout: float) -> list[list[Any]] | None:
        """Up to ``n`` references in commit order; ``None`` when none came within ``timeout``."""
        queue = self.queues.setdefault(field, deque())
        await self._until(lambda: True if queue else None, timeout)
        out = []
        while queue and len(out) < n:
            rank, ref = queue.popleft()
            self.queued[field][rank] -= 1
            out.append(ref)
        if not out:
            return None
        await self._notify()  # the ranks taken from have room again
        return out

    async def forget(self, field: str, rank: int) -> None:
        """Drop what ``rank`` queued (its process is gone: its objects went with it)."""
        queue = self.queues.setdefault(field, deque())
        kept = [(r, ref) for r, ref in queue if r != rank]
        queue.clear()
        queue.extend(kept)
        self.queued.setdefault(field, {})[rank] = 0
        await self._notify()

    # -- weights -------------------------------------------------------------------------------

    async def publish(self, field: str, version: int, ref: list[Any]) -> None:
        if version >= self.weights.get(field, (-1, []))[0]:
            self.weights[field] = (version, ref)
        await self._notify()

    async def set_version(self, field: str, version: int) -> None:
        self.weights[field] = (version, self.weights.get(field, (0, []))[1])
        await self._notify()

    async def version(self, field: str) -> int:
        return self.weights.get(field, (0, []))[0]

    async def latest(self, field: str, have: int) -> tuple[int, list[Any]] | None:
        version, ref = self.weights.get(field, (0, []))
        return (version, ref) if version != have and ref else None

    async def wait_newer(self, field: str, newer_than: int, timeout: float) -> int | None:
        def ready() -> int | None:
            version = self.weights.get(field, (0, []))[0]
            return version if version > newer_than else None

        return await self._until(ready, timeout)


def _get(ref: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
    return ray.get(ref, timeout=timeout)


class _Bound:
    """A transport field as one process uses it (see :mod:`mprl.backends.tensors`)."""

    _slot = -1
    _stop: Callable[[], bool] = staticmethod(_never)

    def __init__(self, hub: Any, field: str) -> None:
        self.hub, self.field = hub, field

    def bind(self, slot: int, stop: Callable[[], bool]) -> Any:
        bound = copy.copy(self)
        bound._slot, bound._stop = slot, stop
        bound._local()
        return bound

    def _local(self) -> None:
        pass

    def _waiting(self, call: Callable[[float], Any], timeout: float | None) -> Any:
        """``call(slice_s)`` (a remote wait) until it gives a value other than ``None``;
        ``None`` once the run stops or after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._stop():  # first: data that keeps coming must not keep a stopped run going
                return None
            left = WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
            found = _get(call(max(0.0, min(WAIT_SLICE_S, left))))
            if found is not None:
                return found
            if deadline is not None and time.monotonic() >= deadline:
                return None


class RayRollouts(_Bound):
    """:class:`mprl.transport.RolloutSlots` across nodes. A worker's slots are its own tensors;
    :meth:`commit` puts the slot in the object store; the learner's :meth:`take_batch` gets the
    oldest committed ones. A rollout whose worker died before the learner read it is dropped
    (its object went with its owner): it is collected again, as after a resume."""

    def __init__(
        self, hub: Any, field: str, spec: RowSpec, workers: int, slots_per_worker: int
    ) -> None:
        super().__init__(hub, field)
        self.spec = {**spec, "version": ((), torch.int64), "source": ((), torch.int64)}
        self.workers, self.slots_per_worker = workers, slots_per_worker

    def _local(self) -> None:
        self._buffers: dict[str, torch.Tensor] | None = None
        self._cursor = 0
        self._taken: list[dict[str, np.ndarray]] = []
        self.lost = 0  # rollouts whose worker died before they were read

    def _slots(self) -> dict[str, torch.Tensor]:
        if self._buffers is None:
            self._buffers = {
                name: torch.zeros((self.slots_per_worker, *shape), dtype=dtype)
                for name, (shape, dtype) in self.spec.items()
            }
            self._buffers["version"].fill_(-1)
        return self._buffers

    def slot(self, index: int) -> dict[str, torch.Tensor]:
        return {name: t[index] for name, t in self._slots().items()}

    def acquire(self, timeout: float | None = None) -> int | None:
        if not 0 <= self._slot < self.workers:
            raise RuntimeError("only a worker acquires rollout slots (the learner takes them)")
        rank, limit = self._slot, self.slots_per_worker

        def room(slice_s: float) -> Any:
            return self.hub.room.remote(self.field, rank, limit, slice_s)

        if self._waiting(room, timeout) is None:
            return None
        index = self._cursor
        self._cursor = (self._cursor + 1) % self.slots_per_worker
        return index

    def commit(self, index: int) -> None:
        slot = self.slot(index)
        slot["source"].fill_(self._slot)
        ref = ray.put({name: t.numpy() for name, t in slot.items()})  # copied into the store
        self.hub.put.remote(self.field, self._slot, [ref])

    def take_batch(self, n: int, timeout: float | None = None) -> dict[str, torch.Tensor] | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._taken) < n:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            want = n - len(self._taken)

            def take(slice_s: float, want: int = want) -> Any:
                return self.hub.take.remote(self.field, want, slice_s)

            refs = self._waiting(take, left)
            if refs is None:
                return None
            for (ref,) in refs:
                try:
                    self._taken.append(_get(ref))
                except (ray.exceptions.RayError, TimeoutError):
                    self.lost += 1  # its worker died before the learner got it
        taken, self._taken = self._taken[:n], self._taken[n:]
        taken.sort(key=lambda part: int(part["source"]))  # stable: a rank's own order kept
        return {
            name: torch.from_numpy(
                np.stack([part[name] for part in taken], axis=1 if len(shape) else 0)
            )
            for name, (shape, _) in self.spec.items()
        }


class RayWeights(_Bound):
    """:class:`mprl.transport.WeightBroadcast` across nodes: the learner puts its tensors in the
    object store after each publishing block; workers copy the newest into their model."""

    def _local(self) -> None:
        self._version: int | None = None

    @property
    def version(self) -> int:
        if self._version is None:
            self._version = int(_get(self.hub.version.remote(self.field)))
        return self._version

    @contextmanager
    def publishing(self, model: torch.nn.Module) -> Iterator[None]:
        yield
        version = self.version + 1
        ref = ray.put([t.detach().cpu().numpy() for t in _floating(model)])
        self.hub.publish.remote(self.field, version, [ref])
        self._version = version

    def wait(self, newer_than: int, timeout: float | None = None) -> int | None:
        def newer(slice_s: float) -> Any:
            return self.hub.wait_newer.remote(self.field, newer_than, slice_s)

        return self._waiting(newer, timeout)

    def pull(self, model: torch.nn.Module, have: int = -1) -> int:
        found = _get(self.hub.latest.remote(self.field, have))
        if found is None:
            return have
        version, (ref,) = found
        arrays = _get(ref)
        with torch.no_grad():
            for dst, src in zip(_floating(model), arrays, strict=True):
                np.copyto(dst.detach().numpy(), src)
        self._version = version
        return version

    def state(self) -> dict[str, int]:
        return {"version": int(_get(self.hub.version.remote(self.field)))}

    def load(self, state: Mapping[str, Any]) -> None:
        _get(self.hub.set_version.remote(self.field, int(state["version"])))


class RayStateBuilder:
    """Builds a schema's fields for actors on any node: Manager kinds from a Manager server the
    actors reach over TCP, transport through ``hub`` and the object store."""

    def __init__(self, manager: Any, hub: Any, model: torch.nn.Module) -> None:
        self.manager, self.hub, self.model = manager, hub, model
        self._n = 0

    def _name(self, kind: str) -> str:
        self._n += 1
        return f"{kind}{self._n}"

    def rollouts(self, spec: RowSpec, workers: int, slots_per_worker: int) -> RayRollouts:
        return RayRollouts(self.hub, self._name("rollouts"), spec, workers, slots_per_worker)

    def weights(self) -> RayWeights:
        field = self._name("weights")
        ref = ray.put([t.detach().cpu().numpy() for t in _floating(self.model)])
        _get(self.hub.publish.remote(field, 0, [ref]))  # what workers pull before any update
        return RayWeights(self.hub, field)

    def _refused(self, *_: Any) -> Any:  # prepare() refuses these kinds first
        raise NotImplementedError("not available on the ray backend")

    tensor = replay = counter = module = _refused
