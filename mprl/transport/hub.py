"""A run's transport held by one process, the hub, and reached by the others through calls.

The hub keeps each transport field of the run in the one memory implementation
(:mod:`mprl.transport.memory`): its own process uses them in place (on Ray, the hub lives in
the train process's actor, so the learner takes rollouts, publishes weights and samples rows
with no call), the processes of its machine map them (:mod:`mprl.transport.samehost`), and
every other process calls the hub's methods through a link (:mod:`mprl.transport.client`). So
a rollout, a version of the weights or a replay row is in one store, whichever way it came in.

The hub imports no Ray: a link calls its methods (a Ray actor's method on the Ray backend, a
plain call in tests), each in a thread of the hub's process. A waiting call is bounded by its
``timeout`` and ends early when what it waits for comes (a write through the hub or by its own
process wakes it at once; a write by a mapping process is seen within
:data:`~mprl.transport.memory.MAX_PAUSE_S`) or when the run stops (:meth:`Hub.stop_waits`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from mprl.schema import ReplayPace, RowSpec
from mprl.transport import samehost
from mprl.transport.memory import (
    MemoryCounter,
    MemoryReplay,
    MemoryRollouts,
    MemoryWeights,
    TensorHolder,
    copy_in,
)

#: the longest one wait lasts once the run is stopping (a wait then only finishes its look)
WAIT_SLICE_S = 0.1

Store = MemoryRollouts | MemoryWeights | MemoryReplay | MemoryCounter
#: what a hub answers about itself, for the caches of the processes that call it: per field,
#: the weights' version, the counter's total, the replay buffer's ``(added, sampled, want)``
Info = dict[str, dict[str, Any]]


class Hub:
    """A run's transport fields, by name, and the calls that reach them from other processes.

    Thread-safe: each call runs in one of the host's threads. ``(event, field, rank)`` keys a
    condition that waiting calls sleep on: ``room`` (a rank's rollout slot was freed),
    ``arrived`` (rollouts or rows came in), ``published`` (weights), ``sampled`` (the learner
    drew rows: workers ahead of a replay ratio may go on).
    """

    def __init__(self) -> None:
        self.fields: dict[str, Store] = {}
        self._lock = threading.RLock()
        self._conditions: dict[tuple[str, str, int], threading.Condition] = {}
        self._views: dict[tuple[str, int], Any] = {}
        self._read: dict[str, tuple[int, list[np.ndarray]]] = {}  # newest weights read
        #: held while a learner of this process updates a model it publishes: a read of the
        #: learner's state (a checkpoint) waits for a whole update
        self.publishing = threading.Lock()
        self.stopping = False

    # -- making the fields (as the run starts) -------------------------------------------------

    def _keep(self, field: str, store: Store, same_host: bool) -> samehost.Arena | None:
        """Keep ``store`` as ``field`` (moved into memory this machine's processes can map
        when ``same_host``); the arena that says where that memory is, or ``None``."""
        made = samehost.make(store) if same_host else None
        arena, kept = made if made is not None else (None, store)
        kept._nap = self._nap
        kept._changed = self._changed
        kept._field = field
        with self._lock:
            self.fields[field] = kept
            self._read.pop(field, None)
        return arena

    def make_rollouts(
        self, field: str, spec: RowSpec, workers: int, slots_per_worker: int, same_host: bool
    ) -> samehost.Arena | None:
        store = MemoryRollouts(spec, workers, slots_per_worker, share=False, sleep=True)
        return self._keep(field, store, same_host)

    def make_weights(
        self, field: str, arrays: Sequence[np.ndarray], same_host: bool
    ) -> samehost.Arena | None:
        holder = TensorHolder([torch.from_numpy(np.array(a)) for a in arrays])
        return self._keep(field, MemoryWeights(holder, share=False, sleep=True), same_host)

    def make_replay(
        self,
        field: str,
        row: RowSpec,
        capacity: int,
        workers: int,
        pace: ReplayPace | None,
        same_host: bool,
    ) -> samehost.Arena | None:
        store = MemoryReplay(row, capacity, workers, share=False, sleep=True, pace=pace)
        return self._keep(field, store, same_host)

    def make_counter(self, field: str, processes: int, same_host: bool) -> samehost.Arena | None:
        return self._keep(field, MemoryCounter(processes, share=False), same_host)

    # -- waiting -------------------------------------------------------------------------------

    def _condition(self, event: str, field: str = "", rank: int = -1) -> threading.Condition:
        key = (event, field, rank)
        found = self._conditions.get(key)
        if found is None:
            found = self._conditions[key] = threading.Condition(self._lock)
        return found

    def _changed(self, event: str, field: str = "", rank: int = -1) -> None:
        """What a store of this hub calls when it changed (see ``_Bound._changed``)."""
        if event == "arrived":  # one condition for every field: what the hub's own waits nap on
            field, rank = "", -1
        with self._lock:
            self._condition(event, field, rank).notify_all()
            if event == "published":
                self._read.pop(field, None)

    def _nap(self, seconds: float) -> None:
        """How a wait of this process's own on a store naps: on ``arrived``, which a write
        through the hub ends at once."""
        with self._lock:
            if not self.stopping:
                self._condition("arrived").wait(seconds)

    def _until(
        self, ready: Callable[[], Any], timeout: float, event: str, field: str, rank: int = -1
    ) -> Any:
        """``ready()``'s value once it is not ``None``, waiting on ``(event, field, rank)`` for
        at most ``timeout`` (:data:`WAIT_SLICE_S` once stopping); ``None`` if it never was."""
        with self._lock:
            found = ready()
            if found is None and not self.stopping:
                self._condition(event, field, rank).wait_for(
                    lambda: ready() is not None or self.stopping, timeout
                )
                found = ready()
            elif found is None:
                self._condition(event, field, rank).wait_for(
                    lambda: ready() is not None, min(timeout, WAIT_SLICE_S)
                )
                found = ready()
            return found

    def stop_waits(self) -> None:
        """The run is stopping: every wait in progress returns now (its caller then sees the
        stop flag), and later ones last :data:`WAIT_SLICE_S` at most."""
        with self._lock:
            self.stopping = True
            for condition in self._conditions.values():
                condition.notify_all()

    def _view(self, field: str, rank: int) -> Any:
        """``field`` as the hub uses it for a remote ``rank`` (its slot; its cursor kept)."""
        view = self._views.get((field, rank))
        if view is None:
            view = self.fields[field].bind(rank, lambda: self.stopping)
            self._views[(field, rank)] = view
        return view

    # -- rollouts ------------------------------------------------------------------------------

    def room(self, field: str, rank: int, timeout: float) -> bool | None:
        """Wait until ``rank`` has a free slot: ``True``, or ``None`` after ``timeout``."""
        store: MemoryRollouts = self.fields[field]  # type: ignore[assignment]
        return self._until(
            lambda: True if store.free_slots(rank) else None, timeout, "room", field, rank
        )

    def put(
        self, field: str, rank: int, data: Mapping[str, np.ndarray], have: Mapping[str, int]
    ) -> tuple[int, dict[str, tuple[int, list[np.ndarray]]], Info]:
        """Commit a remote worker's rollout into a free slot of its rank (it sends one only when
        the answer to its last put said there was one; a put as the run stops is dropped).
        The answer, read at the worker's next acquire (so it costs no call of its own): the
        rank's free slots left, the weights newer than ``have`` and :meth:`info`."""
        view = self._view(field, rank)
        index = view.acquire(0.0)
        while index is None and not self.stopping:
            self.room(field, rank, WAIT_SLICE_S)
            index = view.acquire(0.0)
        if index is not None:
            slot = view.slot(index)
            for name, value in data.items():
                copy_in(slot[name], value)
            view.commit(index)
        newer = {}
        for name, version in have.items():
            found = self.latest(name, version)
            if found is not None:
                newer[name] = found
        return view.free_slots(rank), newer, self.info()

    def take_batch(self, field: str, n: int, timeout: float) -> dict[str, torch.Tensor] | None:
        """A remote learner's batch (see :meth:`mprl.transport.RolloutSlots.take_batch`)."""
        store = self.fields[field]
        return self._view(field, store.workers).take_batch(n, timeout)  # type: ignore[union-attr]

    # -- weights -------------------------------------------------------------------------------

    def version(self, field: str) -> int:
        return self.fields[field].version  # type: ignore[union-attr]

    def latest(self, field: str, have: int) -> tuple[int, list[np.ndarray]] | None:
        """The newest weights, unless ``have`` is their version: read once per version."""
        store: MemoryWeights = self.fields[field]  # type: ignore[assignment]
        if store.version == have:
            return None
        with self._lock:
            read = self._read.get(field)
        if read is None or read[0] != store.version:
            read = store.read()
            with self._lock:
                self._read[field] = read
        return read if read[0] != have else None

    def wait_newer(self, field: str, newer_than: int, timeout: float) -> int | None:
        store: MemoryWeights = self.fields[field]  # type: ignore[assignment]

        def ready() -> int | None:
            version = store.version
            return version if version > newer_than else None

        return self._until(ready, timeout, "published", field)

    def publish(self, field: str, version: int, arrays: Sequence[np.ndarray]) -> None:
        """A remote learner's weights, as ``version``."""
        store: MemoryWeights = self.fields[field]  # type: ignore[assignment]
        if version > store.version:
            store.put(arrays, version)

    @contextmanager
    def publishing_model(self, field: str, model: torch.nn.Module) -> Iterator[None]:
        """A learner of this process updates ``model`` and publishes it (under
        :attr:`publishing`)."""
        with self.publishing, self._view(field, -1).publishing(model):
            yield

    def set_version(self, field: str, version: int) -> None:
        self.fields[field].load({"version": version})  # type: ignore[union-attr,arg-type]
        self._changed("published", field)

    # -- counters and replay buffers -----------------------------------------------------------

    def value(self, field: str) -> int:
        return self.fields[field].value  # type: ignore[union-attr]

    def load_counter(self, field: str, value: int) -> None:
        self.fields[field].load(value)  # type: ignore[union-attr,arg-type]

    def flush(
        self,
        rank: int,
        counters: Mapping[str, int],
        rows: Mapping[str, Sequence[Mapping[str, np.ndarray]]],
    ) -> Info:
        """A remote process's counter adds and replay rows, in the order it made them; the
        answer is :meth:`info` (its caches' refresh)."""
        for field, n in counters.items():
            self._view(field, rank).add(n)
        for field, parts in rows.items():
            store: MemoryReplay = self.fields[field]  # type: ignore[assignment]
            if not 0 <= rank < store.workers:
                raise RuntimeError("only a worker adds rows to a replay buffer")
            for part in parts:
                store.write(rank, part)
        return self.info()

    def size(self, field: str) -> int:
        return self.fields[field].size()  # type: ignore[union-attr]

    def wait_size(self, field: str, n: int, timeout: float) -> int | None:
        store: MemoryReplay = self.fields[field]  # type: ignore[assignment]
        return self._until(lambda: store.size() if store.size() >= n else None, timeout,
                           "arrived", "")  # fmt: skip

    def sample(
        self, field: str, rank: int, n: int, timeout: float
    ) -> dict[str, torch.Tensor] | None:
        """A remote process's sample, waiting up to ``timeout`` for a declared ratio to allow
        it (``None`` then); without one, drawn at once (``None`` while the buffer is empty)."""
        return self._view(field, rank).sample(n, timeout=timeout)

    def replay_room(self, field: str, timeout: float) -> Info | None:
        """A remote worker ahead of the replay ratio waits here until it may go on; the
        answer is :meth:`info`, ``None`` after ``timeout``."""
        store: MemoryReplay = self.fields[field]  # type: ignore[assignment]
        pace = store.pace
        assert pace is not None

        def room() -> bool | None:
            return True if pace.worker_resumes(*store.counts()) else None

        return self.info() if self._until(room, timeout, "sampled", field) else None

    def replay_state(self, field: str) -> dict[str, Any]:
        return self.fields[field].state()  # type: ignore[union-attr,return-value]

    def replay_load(self, field: str, state: Mapping[str, Any]) -> bool:
        return bool(self.fields[field].load(state))  # type: ignore[union-attr]

    def info(self) -> Info:
        """What every process caches between calls: weights versions, counter totals and each
        replay buffer's ``(added, sampled, want)``."""
        out: Info = {"weights": {}, "counters": {}, "replays": {}}
        for field, store in list(self.fields.items()):
            if isinstance(store, MemoryWeights):
                out["weights"][field] = store.version
            elif isinstance(store, MemoryCounter):
                out["counters"][field] = store.value
            elif isinstance(store, MemoryReplay):
                out["replays"][field] = store.counts()
        return out
