"""The schema's transport fields across Ray nodes: rollouts and weights, one hop each.

The run's :class:`Hub` lives in the train process's actor. A worker commits a rollout with one
call to it (the data inside the call when small, else a reference into Ray's object store, which
the learner reads zero-copy on its node); the learner takes rollouts in commit order and
publishes weights with no remote call at all. The answer to a commit carries the rank's queued
count (back-pressure: ``slots_per_worker`` rollouts not yet taken, as on the local backend) and
any newer weights, so a worker's next acquire and pull usually cost no call either.

Every wait is a remote call of at most :data:`REMOTE_WAIT_S` (:data:`WAIT_SLICE_S` in the hub's
own process), so a waiting process looks at the run's stop flag (and beats its heartbeat) that
often; the driver's stop also wakes every wait in the hub (:meth:`Hub.stop_waits`), so a stop is
seen at once; waits return ``None`` once the run stops, as on the local backend. The slices are
not shorter because a worker held back by the learner waits in them: every slice is a call the
hub's process (the learner's) serves, about 1 ms of its CPU, per waiting worker.

A replay buffer lives in the hub too. With a declared replay ratio (:class:`ReplayPace`) the
learner's ``sample`` waits on the hub's condition, in its own process; a worker decides whether
it is ahead from the counts its last batch's answer brought back (plus the rows it has not
sent), with no call, and only when it is ahead waits in one remote call that returns once the
learner has caught up by half the lead: a worker far ahead makes one call per half lead of rows,
not one per look.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import ray
import torch

from mprl.backends.ray import samehost
from mprl.backends.tensors import (
    MAX_PAUSE_S,
    TensorReplay,
    TensorRollouts,
    TensorWeights,
    _floating,
)
from mprl.schema import Dims, ReplayPace, RowSpec

#: the longest one wait in the hub's own process lasts (and a remote one once the run stops), so
#: stop checks and heartbeats come at least this often
WAIT_SLICE_S = 0.1
#: the longest one remote wait lasts while the run goes on (the driver's stop ends it early)
#: why: see benchmarks/README.md, "`ray_scaling.py`: the scaling curve and a projection"
REMOTE_WAIT_S = 1.0
#: a remote call that should answer at once but does not within this long is an error
CALL_TIMEOUT_S = 60.0
#: the longest a call to the hub waits as the run starts (the backend's ``startup_timeout_s``:
#: the hub's actor is placed and imports torch and the plugin first)
START_TIMEOUT_S = 180.0


def _never() -> bool:
    return False


class Hub:
    """The run's meeting point for transport, hosted by the train process's actor (so the
    learner takes rollouts and publishes weights with no remote call) or, in a run without
    one, by an actor of its own. Thread-safe: each call runs in one of the actor's threads.

    Per rollouts field: a queue of ``(rank, payload)`` in commit order and how many each rank has
    queued. Per weights field: the newest ``(version, payload)``. A payload is a
    :func:`_pack`: the data itself when small, else a reference into the object store.
    """

    def __init__(self) -> None:
        self.queues: dict[str, deque[tuple[int, list[Any]]]] = {}
        self.queued: dict[str, dict[int, int]] = {}
        self.weights: dict[str, tuple[int, list[Any]]] = {}
        self.counters: dict[str, int] = {}
        self.replays: dict[str, TensorReplay] = {}
        #: per rollouts or weights field, its shared memory for this machine's processes
        #: (:mod:`~mprl.backends.ray.samehost`)
        self.arenas: dict[str, TensorRollouts | TensorWeights] = {}
        #: per weights field published by the learner this hub lives with: its model, packed
        #: only when a version of it is asked for (:meth:`_payload`), under :attr:`publishing`
        self.live: dict[str, torch.nn.Module] = {}
        #: held by the learner while it updates a live model (``RayWeights.publishing``)
        self.publishing = threading.Lock()
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        #: per (field, rank), where that rank's worker waits for a rollout slot: woken when
        #: its rollouts are taken, not by every commit and update (as ``_changed`` is: with
        #: every waiting worker woken at each, the hub's cost per rollout grew with the workers)
        self._rooms: dict[tuple[str, int], threading.Condition] = {}
        self.stopping = False  # the run is stopping: waits are short (see stop_waits)

    def stop_waits(self) -> None:
        """The run is stopping: every wait in progress returns now (its caller then sees the
        stop flag), and later ones last :data:`WAIT_SLICE_S` at most."""
        with self._changed:
            self.stopping = True
            self._changed.notify_all()
            for room in self._rooms.values():
                room.notify_all()

    def _wait_for(
        self, ready: Callable[[], bool], timeout: float, on: threading.Condition | None = None
    ) -> None:
        """``on.wait_for(ready, timeout)`` (``_changed`` by default; the lock held), woken
        early by the run's stop."""
        on = on or self._changed
        if self.stopping:
            on.wait_for(ready, min(timeout, WAIT_SLICE_S))
        else:
            on.wait_for(lambda: ready() or self.stopping, timeout)

    def _room(self, field: str, rank: int) -> threading.Condition:
        """Where ``rank`` waits for a slot of ``field`` (the lock held)."""
        room = self._rooms.get((field, rank))
        if room is None:
            room = self._rooms[(field, rank)] = threading.Condition(self._lock)
        return room

    def _until(self, ready: Callable[[], Any], timeout: float) -> Any:
        with self._changed:
            self._wait_for(lambda: ready() is not None, timeout)
            return ready()

    # -- rollouts ------------------------------------------------------------------------------

    def put(
        self, field: str, rank: int, payload: list[Any], have: Mapping[str, int]
    ) -> tuple[int, dict[str, tuple[int, list[Any]]]]:
        """Queue a rollout. The answer, read at the worker's next acquire (so it costs no call
        of its own), is the rank's queued count and the weights newer than the worker's."""
        with self._changed:
            self.queues.setdefault(field, deque()).append((rank, payload))
            counts = self.queued.setdefault(field, {})
            counts[rank] = counts.get(rank, 0) + 1
            self._changed.notify_all()
            newer = {f: w for f, w in self.weights.items() if w[0] > have.get(f, -1)}
        newer = {f: self._payload(f) if not w[1] else w for f, w in newer.items()}
        return counts[rank], newer

    def room(self, field: str, rank: int, limit: int, timeout: float) -> bool | None:
        counts = self.queued.setdefault(field, {})
        with self._changed:
            self._wait_for(lambda: counts.get(rank, 0) < limit, timeout, self._room(field, rank))
            return True if counts.get(rank, 0) < limit else None

    def take(self, field: str, n: int, timeout: float) -> list[list[Any]] | None:
        """Up to ``n`` payloads in commit order; ``None`` when none came within ``timeout``."""
        queue = self.queues.setdefault(field, deque())
        with self._changed:
            self._wait_for(lambda: bool(queue), timeout)
            out, ranks = [], set()
            while queue and len(out) < n:
                rank, payload = queue.popleft()
                self.queued[field][rank] -= 1
                out.append(payload)
                ranks.add(rank)
            for rank in ranks:  # the ranks taken from have room again
                self._room(field, rank).notify_all()
            return out or None

    def arena_rollouts(
        self, field: str, spec: RowSpec, workers: int, slots_per_worker: int
    ) -> samehost.Arena | None:
        """Rollout slots in shared memory, for the workers on this machine."""
        made = samehost.make(TensorRollouts(spec, workers, slots_per_worker, False, True))
        if made is None:
            return None
        self.arenas[field] = made[1]
        return made[0]

    def arena_weights(self, field: str) -> samehost.Arena | None:
        """The newest weights in shared memory (kept up to date by every publish), for the
        workers on this machine."""
        version, payload = self._payload(field)
        (arrays,) = _unpack([payload])
        holder = samehost._Holder([torch.from_numpy(np.array(a)) for a in arrays])
        made = samehost.make(TensorWeights(holder, False, True))
        if made is None:
            return None
        made[1].load({"version": version})
        self.arenas[field] = made[1]
        return made[0]

    def forget(self, field: str, rank: int) -> None:
        """Drop what ``rank`` queued (its process is gone, and its stored objects with it)."""
        with self._changed:
            queue = self.queues.setdefault(field, deque())
            kept = [(r, payload) for r, payload in queue if r != rank]
            queue.clear()
            queue.extend(kept)
            self.queued.setdefault(field, {})[rank] = 0
            self._changed.notify_all()
            self._room(field, rank).notify_all()

    # -- weights -------------------------------------------------------------------------------

    def publish(self, field: str, version: int, payload: list[Any]) -> None:
        with self._changed:
            newest = version >= self.weights.get(field, (-1, []))[0]
            if newest:
                self.weights[field] = (version, payload)
                self.live.pop(field, None)
            self._changed.notify_all()
        arena = self.arenas.get(field)
        if newest and isinstance(arena, TensorWeights):
            (arrays,) = _unpack([payload])
            arena.put(arrays, version)

    def publish_live(self, field: str, version: int, model: torch.nn.Module) -> None:
        """The learner in this process published ``version`` of ``model``: packed when a
        process asks for it, not now (a learner updating hundreds of times a second would put
        every version in the object store, and most are never read)."""
        arena = self.arenas.get(field)
        if isinstance(arena, TensorWeights):  # (its caller holds publishing)
            arena.put(arena._tensors(model), version)
        with self._changed:
            self.weights[field] = (version, [])
            self.live[field] = model
            self._changed.notify_all()

    def _payload(self, field: str) -> tuple[int, list[Any]]:
        """The newest ``(version, payload)`` of ``field``, packing a live model's now (once
        per version): its tensors copied while the learner is not updating them."""
        with self._changed:
            version, payload = self.weights.get(field, (0, []))
            model = self.live.get(field)
        if payload or model is None:
            return version, payload
        with self.publishing:
            version = self.weights[field][0]
            arrays = [t.detach().cpu().numpy().copy() for t in _floating(model)]
        packed = _pack(arrays, sum(a.nbytes for a in arrays))
        with self._changed:
            if self.weights[field][0] == version:
                self.weights[field] = (version, packed)
        return version, packed

    def set_version(self, field: str, version: int) -> None:
        with self._changed:
            self.weights[field] = (version, self.weights.get(field, (0, []))[1])
            arena = self.arenas.get(field)
            if isinstance(arena, TensorWeights):
                arena.load({"version": version})
            self._changed.notify_all()

    def version(self, field: str) -> int:
        return self.weights.get(field, (0, []))[0]

    def latest(self, field: str, have: int) -> tuple[int, list[Any]] | None:
        if self.weights.get(field, (0, []))[0] == have:
            return None
        version, payload = self._payload(field)
        return (version, payload) if version != have and payload else None

    def wait_newer(self, field: str, newer_than: int, timeout: float) -> int | None:
        def ready() -> int | None:
            version = self.weights.get(field, (0, []))[0]
            return version if version > newer_than else None

        return self._until(ready, timeout)

    # -- counters and replay buffers -----------------------------------------------------------

    def counter_add(self, field: str, n: int) -> None:
        with self._changed:
            self.counters[field] = self.counters.get(field, 0) + n

    def counter_value(self, field: str) -> int:
        return self.counters.get(field, 0)

    def counter_load(self, field: str, value: int) -> None:
        with self._changed:
            self.counters[field] = value

    def replay_init(
        self,
        field: str,
        row: RowSpec,
        capacity: int,
        workers: int,
        pace: ReplayPace | None = None,
    ) -> None:
        self.replays[field] = TensorReplay(row, capacity, workers, share=False, pace=pace)

    def replay_add(self, field: str, rank: int, rows: Mapping[str, np.ndarray]) -> None:
        replay = self.replays[field]
        if not 0 <= rank < replay.workers:
            raise RuntimeError("only a worker adds rows to a replay buffer")
        replay.write(rank, {name: np.asarray(value) for name, value in rows.items()})

    def replay_size(self, field: str) -> int:
        return self.replays[field].size()

    def replay_sample(self, field: str, n: int) -> dict[str, torch.Tensor] | None:
        """A worker's sample: drawn as it is, counted, never waiting (the ratio paces the
        learner, who samples in this process)."""
        replay = self.replays[field]
        with self._changed:
            if replay.pace is not None:
                replay._count_sample(n)
                self._changed.notify_all()
            return replay.draw(n)

    def replay_wait_size(self, field: str, n: int, timeout: float) -> int | None:
        replay = self.replays[field]
        return self._until(lambda: replay.size() if replay.size() >= n else None, timeout)

    def replay_room(self, field: str, timeout: float) -> dict | None:
        """A worker ahead of the replay ratio waits here until it may go on; the answer is
        :meth:`info` (its cache's refresh), ``None`` after ``timeout``."""
        replay = self.replays[field]
        pace = replay.pace
        assert pace is not None

        def room() -> bool | None:
            return True if pace.worker_resumes(*replay.counts()) else None

        return self.info() if self._until(room, timeout) else None

    def replay_state(self, field: str) -> dict[str, Any]:
        return self.replays[field].state()

    def replay_load(self, field: str, state: Mapping[str, Any]) -> bool:
        return self.replays[field].load(state)

    def flush(self, rank: int, counters: Mapping[str, int], rows: Mapping[str, list]) -> dict:
        """A process's batched counter adds and replay rows, in the order it made them; the
        answer is :meth:`info` (its caches' refresh)."""
        for field, n in counters.items():
            self.counter_add(field, n)
        for field, parts in rows.items():
            for part in parts:
                self.replay_add(field, rank, part)
        if rows:
            with self._changed:  # a learner waiting for rows
                self._changed.notify_all()
        return self.info()

    def info(self) -> dict[str, dict[str, Any]]:
        """What every process caches between calls: weights versions, counter totals and each
        replay buffer's ``(added, sampled, want)``."""
        return {
            "weights": {f: w[0] for f, w in self.weights.items()},
            "counters": dict(self.counters),
            "replays": {f: r.counts() for f, r in self.replays.items()},
        }


#: the hub this process hosts, by its actor's id (see :func:`serve`)
_HOSTED: dict[str, Hub] = {}


def serve(hub: Hub) -> None:
    """Called by the actor that hosts ``hub``: its own transport calls skip Ray."""
    _HOSTED[ray.get_runtime_context().get_actor_id()] = hub


class _Done:
    """The answer of a call to the hub this process hosts (for :func:`_get`)."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _get(ref: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
    if isinstance(ref, _Done):
        return ref.value
    return ray.get(ref, timeout=timeout)


#: payloads up to this size travel inside the calls (Ray inlines small arguments and answers),
#: larger ones through the object store: a CartPole rollout costs no object-store round trip,
#: an Atari one is not copied through the hub
INLINE_BYTES = 100_000


def _pack(value: Any, nbytes: int) -> list[Any]:
    """``[False, value]`` to send inline, or ``[True, ref]`` once put in the object store (in a
    list, so Ray hands the reference over instead of resolving it)."""
    return [False, value] if nbytes <= INLINE_BYTES else [True, ray.put(value)]


def _unpack(packs: list[list[Any]]) -> list[Any]:
    """The values of ``packs``, the object-store ones fetched in one call."""
    refs = [ref for is_ref, ref in packs if is_ref]
    fetched = iter(_get(refs) if refs else [])
    return [next(fetched) if is_ref else value for is_ref, value in packs]


#: per weights field, the newest ``(version, [ref])`` this process heard of from a rollout
#: commit's answer, and the newest version it saw any way: a worker pulls from the hint instead
#: of asking the hub again, unless it already knows of a newer version (``wait`` told it)
_HINTS: dict[str, tuple[int, list[Any]]] = {}
_SEEN: dict[str, int] = {}
#: the hub's weights versions and counter totals, as of this process's last flush or the
#: driver's last poll (:func:`note`): per-step reads of them cost no call
_INFO: dict[str, dict[str, Any]] = {"weights": {}, "counters": {}, "replays": {}}


def note(info: Mapping[str, Mapping[str, Any]] | None) -> None:
    """Refresh this process's cache of the hub's versions and totals."""
    if info:  # answers may arrive out of order (a poll's is older): keep the newest
        for key in ("weights", "counters"):
            cache = _INFO[key]
            for field, value in info.get(key, {}).items():
                cache[field] = max(value, cache.get(field, value))
        replays = _INFO["replays"]
        for field, counts in info.get("replays", {}).items():  # (added, sampled, want)
            had = replays.get(field, counts)
            replays[field] = tuple(max(a, b) for a, b in zip(counts, had, strict=True))


class _Batch:
    """A worker's counter adds and replay rows not sent yet: sent in one call every
    :data:`FLUSH_S` or :data:`FLUSH_ROWS` rows, each after the previous one was answered (so
    they arrive in order, and a worker far ahead of the hub waits)."""

    def __init__(self) -> None:
        self.hub: Any = None
        self.rank = -1
        self.counters: dict[str, int] = {}
        self.rows: dict[str, list[dict[str, np.ndarray]]] = {}
        self.n_rows = 0
        self.in_flight = 0  # rows of the batch sent last, until its answer is read
        self.sent_at = time.monotonic()
        self.answer: Any = None
        self.lock = threading.Lock()

    def due(self) -> None:
        if self.n_rows >= FLUSH_ROWS or time.monotonic() - self.sent_at >= FLUSH_S:
            self.send()

    def send(self) -> None:
        with self.lock:
            if self.answer is not None:
                note(_get(self.answer))
                self.answer, self.in_flight = None, 0
            if self.hub is not None and (self.counters or self.rows):
                counters, rows = self.counters, self.rows
                self.in_flight = self.n_rows
                self.counters, self.rows, self.n_rows = {}, {}, 0
                self.answer = self.hub.hub_call.remote("flush", self.rank, counters, rows)
            self.sent_at = time.monotonic()


_BATCH = _Batch()
FLUSH_S = 0.05
FLUSH_ROWS = 1024


def flush() -> None:
    """Send what this process batched, and wait for the answer (its function has returned).
    With the hub's host gone (the run is failing) the batch is lost, like a dead worker's."""
    with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
        _BATCH.send()
        _BATCH.send()  # the second takes the first's answer


class _Bound:
    """A transport field as one process uses it (see :mod:`mprl.backends.tensors`)."""

    _slot = -1
    _stop: Callable[[], bool] = staticmethod(_never)
    #: where the field's shared memory is, for the processes on the hub's machine
    arena: samehost.Arena | None = None
    _shm: Any = None  # the arena's object as this process uses it, once looked for
    _looked = False

    def __init__(self, hub: Any, field: str) -> None:
        self.hub, self.field = hub, field  # the hub's host: an actor with hub_call()
        self._hub_id = hub._actor_id.hex()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_shm", "_looked")}

    def _here(self) -> Any:
        """The field's shared memory as this process uses it (bound to its slot), when it is
        on the hub's machine; else ``None``: it goes through Ray."""
        if not self._looked:
            self._looked = True
            hosted = _HOSTED.get(self._hub_id)
            shm = hosted.arenas.get(self.field) if hosted else samehost.open_arena(self.arena)
            self._shm = None if shm is None else shm.bind(self._slot, self._stop)
        return self._shm

    def _call(self, method: str, *args: Any) -> Any:
        """Call the hub: in this process when it hosts it, else remotely (an ObjectRef)."""
        hosted = _HOSTED.get(self._hub_id)
        if hosted is not None:
            return _Done(getattr(hosted, method)(*args))
        return self.hub.hub_call.remote(method, *args)

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
        if _BATCH.counters or _BATCH.rows:  # what it waits for may need them: send them now
            _BATCH.send()
        # a wait in the hub's own process costs no call: short slices; a remote one is a call
        # the hub serves (the driver's stop wakes it: see Hub.stop_waits)
        piece = WAIT_SLICE_S if _HOSTED.get(self._hub_id) is not None else REMOTE_WAIT_S
        while True:
            if self._stop():  # first: data that keeps coming must not keep a stopped run going
                return None
            left = piece if deadline is None else deadline - time.monotonic()
            found = _get(call(max(0.0, min(piece, left))), CALL_TIMEOUT_S + piece)
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
        self._put: Any = None  # the answer of this worker's last commit, until read
        self._behind = False  # the last answer read said this rank's queue was full
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
        shm = self._here()
        if shm is not None:
            return shm.slot(index)
        return {name: t[index] for name, t in self._slots().items()}

    def acquire(self, timeout: float | None = None) -> int | None:
        """A slot to fill. A worker's slots are its own memory (a commit copies its slot
        away), so while the learner keeps up, a worker fills its next slot while its last
        commit's answer travels, and :meth:`commit` reads it. While the learner is behind (the
        last answer read said the rank's queue was full), the worker waits here for that
        answer, and for room, before it fills: its rollout is then played with the newest
        weights, as on the local backend."""
        if not 0 <= self._slot < self.workers:
            raise RuntimeError("only a worker acquires rollout slots (the learner takes them)")
        shm = self._here()
        if shm is not None:
            return shm.acquire(timeout)
        if self._stop():
            return None
        behind = self._behind and self._put is not None and self._answer()
        if behind and self._wait_room(timeout) is None:
            return None
        index = self._cursor
        self._cursor = (self._cursor + 1) % self.slots_per_worker
        return index

    def _answer(self) -> bool:
        """Read the last commit's answer (waiting for it): newer weights, for the worker's
        next pull with no call, and the rank's queued count. Whether the queue was full."""
        queued, hints = _get(self._put)
        self._put = None
        _HINTS.update(hints)
        self._behind = queued >= self.slots_per_worker
        return self._behind

    def _wait_room(self, timeout: float | None) -> bool | None:
        """Wait until the rank has fewer than ``slots_per_worker`` rollouts queued; ``None``
        once the run stops or after ``timeout``."""
        rank, limit = self._slot, self.slots_per_worker

        def room(slice_s: float) -> Any:
            return self._call("room", self.field, rank, limit, slice_s)

        return self._waiting(room, timeout)

    def commit(self, index: int) -> None:
        """Send the slot to the hub in one call, whose answer :meth:`acquire` or the next
        commit reads; when that answer said the rank's queue was full, this waits for room
        first. The hub never holds more than ``slots_per_worker`` of a rank's rollouts, as on
        the local backend (plus, here, the one filled meanwhile). A commit as the run stops
        is dropped, as a rollout in flight would be. On the hub's machine, the slot is shared
        memory and the commit a flag in it, as on the local backend."""
        shm = self._here()
        if shm is not None:
            shm.commit(index)
            return
        if self._put is not None and self._answer() and self._wait_room(None) is None:
            return
        slot = self.slot(index)
        slot["source"].fill_(self._slot)
        data = {name: t.numpy() for name, t in slot.items()}  # copied by the call or the put
        packed = _pack(data, sum(a.nbytes for a in data.values()))
        self._put = self._call("put", self.field, self._slot, packed, dict(_SEEN))

    def take_batch(self, n: int, timeout: float | None = None) -> dict[str, torch.Tensor] | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        hosted = _HOSTED.get(self._hub_id)
        shm = self._here() if hosted is not None else None
        while len(self._taken) < n:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            want = n - len(self._taken)
            if shm is not None and hosted is not None:
                got = self._take_both(shm, hosted, want, left)
                if got is None:
                    return None
                self._taken += got
                continue

            def take(slice_s: float, want: int = want) -> Any:
                return self._call("take", self.field, want, slice_s)

            refs = self._waiting(take, left)
            if refs is None:
                return None
            self._taken += self._unpacked(refs)
        taken, self._taken = self._taken[:n], self._taken[n:]
        taken.sort(key=lambda part: int(part["source"]))  # stable: a rank's own order kept
        return {
            name: torch.from_numpy(
                np.stack([part[name] for part in taken], axis=1 if len(shape) else 0)
            )
            for name, (shape, _) in self.spec.items()
        }

    def _unpacked(self, refs: list[list[Any]]) -> list[dict[str, np.ndarray]]:
        """The rollouts of ``refs``; one whose worker died before it was read is counted lost."""
        try:
            return _unpack(refs)
        except (ray.exceptions.RayError, TimeoutError):  # one by one: keep what is there
            out = []
            for packed in refs:
                try:
                    out += _unpack([packed])
                except (ray.exceptions.RayError, TimeoutError):
                    self.lost += 1  # its worker died before the learner got it
            return out

    def _take_both(
        self, shm: TensorRollouts, hub: Hub, want: int, timeout: float | None
    ) -> list[dict[str, np.ndarray]] | None:
        """Up to ``want`` rollouts from both ways in, in the hub's process: the shared slots
        of the workers on this machine (oldest first), and the hub's queue (the others'). Looks
        at both every 0.1 ms to :data:`MAX_PAUSE_S` (the wait in between is on the hub's queue,
        so another node's commit is seen at once); ``None`` once the run stops or after
        ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0001
        while not self._stop():
            got = []
            while len(got) < want and (index := shm.take(0)) is not None:
                got.append({name: t[index].numpy().copy() for name, t in shm.buffers.items()})
                shm.release(index)
            if len(got) < want:
                refs = hub.take(self.field, want - len(got), 0.0 if got else pause)
                got += self._unpacked(refs) if refs else []
            if got:
                return got
            if deadline is not None and time.monotonic() >= deadline:
                return None
            pause = min(pause * 2, MAX_PAUSE_S)
        return None


class RayWeights(_Bound):
    """:class:`mprl.transport.WeightBroadcast` across nodes: the learner puts its tensors in the
    object store after each publishing block; workers copy the newest into their model."""

    def _local(self) -> None:
        self._version: int | None = None

    def _here(self) -> Any:
        """Shared memory for a process on the hub's machine, not for the hub's own (its
        learner publishes through the hub, which keeps the shared copy up to date)."""
        return None if _HOSTED.get(self._hub_id) is not None else super()._here()

    @property
    def version(self) -> int:
        shm = self._here()
        if shm is not None:
            return shm.version
        if self._version is None:
            self._version = int(_get(self._call("version", self.field)))
        return self._version

    @contextmanager
    def publishing(self, model: torch.nn.Module) -> Iterator[None]:
        hosted = _HOSTED.get(self._hub_id)
        if hosted is not None:  # the learner with its hub: a version is packed when asked for
            with hosted.publishing:
                yield
                version = self.version + 1
                hosted.publish_live(self.field, version, model)
            self._version = version
            return
        yield
        version = self.version + 1
        arrays = [t.detach().cpu().numpy() for t in _floating(model)]
        nbytes = sum(a.nbytes for a in arrays)
        if nbytes <= INLINE_BYTES:  # kept by the hub as they are: not the live parameters
            arrays = [a.copy() for a in arrays]
        self._call("publish", self.field, version, _pack(arrays, nbytes))
        self._version = version

    def wait(self, newer_than: int, timeout: float | None = None) -> int | None:
        shm = self._here()
        if shm is not None:
            return shm.wait(newer_than, timeout)

        def newer(slice_s: float) -> Any:
            return self._call("wait_newer", self.field, newer_than, slice_s)

        version = self._waiting(newer, timeout)
        if version is None or self._stop():  # published as the run stopped: see the protocol
            return None
        _SEEN[self.field] = max(version, _SEEN.get(self.field, -1))
        return version

    def pull(self, model: torch.nn.Module, have: int = -1) -> int:
        shm = self._here()
        if shm is not None:
            return shm.pull(model, have)
        hint = _HINTS.pop(self.field, None)
        if hint is not None and hint[1] and hint[0] >= _SEEN.get(self.field, -1):
            found: tuple[int, list[Any]] | None = hint
        elif (
            max(_INFO["weights"].get(self.field, have + 1), _SEEN.get(self.field, -1)) <= have
            and _HOSTED.get(self._hub_id) is None
        ):
            found = None  # nothing newer as of the last refresh (or wait): no call
        else:
            found = _get(self._call("latest", self.field, have))
        if found is None or found[0] == have:
            return have
        version, packed = found
        _SEEN[self.field] = max(version, _SEEN.get(self.field, -1))
        (arrays,) = _unpack([packed])
        with torch.no_grad():
            for dst, src in zip(_floating(model), arrays, strict=True):
                np.copyto(dst.detach().numpy(), src)
        self._version = version
        return version

    _known = 0  # the version the driver last read

    def state(self) -> dict[str, int]:
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):  # its host is gone
            self._known = int(_get(self._call("version", self.field), timeout=10))
        return {"version": self._known}

    def load(self, state: Mapping[str, Any]) -> None:
        _get(self._call("set_version", self.field, int(state["version"])))


class RayCounter(_Bound):
    """:class:`mprl.transport.SharedCounter` across nodes: adds are batched with the process's
    other hub traffic (see :class:`_Batch`); :attr:`value` is the hub's total as of the last
    refresh (a poll every quarter second, or this process's last flush) plus what this process
    added since."""

    def add(self, n: int = 1) -> None:
        if self._slot < 0:
            raise RuntimeError("a counter is added to by the processes of a run")
        hosted = _HOSTED.get(self._hub_id)
        if hosted is not None:
            hosted.counter_add(self.field, n)
            return
        _BATCH.hub, _BATCH.rank = self.hub, self._slot
        _BATCH.counters[self.field] = _BATCH.counters.get(self.field, 0) + n
        _BATCH.due()

    @property
    def value(self) -> int:
        hosted = _HOSTED.get(self._hub_id)
        if hosted is not None:
            return hosted.counter_value(self.field)
        if self._slot < 0 or self.field not in _INFO["counters"]:  # the driver, or unknown yet
            return int(_get(self._call("counter_value", self.field)))
        return _INFO["counters"][self.field] + _BATCH.counters.get(self.field, 0)

    def load(self, value: int) -> None:
        _get(self._call("counter_load", self.field, int(value)))


class RayReplay(_Bound):
    """:class:`mprl.transport.ReplayStore` across nodes: the buffer lives in the train
    process (the hub's host), where :meth:`sample` reads it with no call; a worker's rows are
    batched and sent in order (see :class:`_Batch`), so they become visible to the learner
    within :data:`FLUSH_S`. A declared replay ratio is kept as the module's docstring says;
    a worker's rows not yet sent count as added when it decides, so the workers together may
    be a batch (:data:`FLUSH_ROWS` rows at most) beyond ``max_lead``."""

    def __init__(self, hub: Any, field: str, capacity: int, pace: ReplayPace | None = None) -> None:
        super().__init__(hub, field)
        self.capacity, self.pace = capacity, pace

    def _hosted_wait(self, hosted: Hub, ready: Callable[[], Any], timeout: float | None) -> Any:
        """``ready()``'s value once it is not ``None``, waiting on the hub's condition in
        slices (stop checks and heartbeats between them); ``None`` once stopping or timed out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stop():
            left = WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
            found = hosted._until(ready, max(0.0, min(WAIT_SLICE_S, left)))
            if found is not None:
                return found
            if deadline is not None and time.monotonic() >= deadline:
                return None
        return None

    def add(self, **rows: torch.Tensor) -> None:
        if self._slot < 0:
            raise RuntimeError("only a worker adds rows to a replay buffer")
        data = {
            name: (v.detach().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)).copy()
            for name, v in rows.items()
        }
        hosted = _HOSTED.get(self._hub_id)
        if hosted is not None:
            hosted.replay_add(self.field, self._slot, data)
            with hosted._changed:
                hosted._changed.notify_all()
            return
        self._keep_pace()
        _BATCH.hub, _BATCH.rank = self.hub, self._slot
        _BATCH.rows.setdefault(self.field, []).append(data)
        _BATCH.n_rows += len(next(iter(data.values())))
        _BATCH.due()

    def _keep_pace(self) -> None:
        """A worker ahead of the replay ratio (as its cache says) waits in the hub."""
        pace = self.pace
        if pace is None or pace.lead is None or self._stop():
            return
        added, sampled, want = _INFO["replays"].get(self.field, (0, 0, 0))
        if not pace.worker_waits(added + _BATCH.in_flight + _BATCH.n_rows, sampled, want):
            return

        def room(slice_s: float) -> Any:
            return self._call("replay_room", self.field, slice_s)

        note(self._waiting(room, None))  # (sends this process's batch first)

    def size(self) -> int:
        hosted = _HOSTED.get(self._hub_id)
        if hosted is not None:
            return hosted.replay_size(self.field)
        return int(_get(self._call("replay_size", self.field)))

    def wait_size(self, n: int, timeout: float | None = None) -> int | None:
        hosted = _HOSTED.get(self._hub_id)
        if hosted is not None:
            replay = hosted.replays[self.field]
            return self._hosted_wait(
                hosted, lambda: replay.size() if replay.size() >= n else None, timeout
            )

        def size(slice_s: float) -> Any:
            return self._call("replay_wait_size", self.field, n, slice_s)

        return self._waiting(size, timeout)

    def sample(
        self, n: int, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor] | None:
        hosted = _HOSTED.get(self._hub_id)
        if hosted is None:
            return _get(self._call("replay_sample", self.field, n))
        replay = hosted.replays[self.field]
        pace = replay.pace
        if pace is not None:
            replay._want_np[0] = n

            def allowed() -> bool | None:
                return None if pace.learner_waits(*replay.counts()) else True

            if self._hosted_wait(hosted, allowed, None) is None:
                return None
            with hosted._changed:  # workers waiting for the learner
                replay._count_sample(n)
                hosted._changed.notify_all()
        return replay.draw(n, generator)

    def state(self) -> dict[str, Any]:
        return _get(self._call("replay_state", self.field), timeout=600)

    def load(self, state: Mapping[str, Any]) -> bool:
        return bool(_get(self._call("replay_load", self.field, dict(state)), timeout=600))


class HubNotStarted(Exception):
    """The run's transport hub did not answer as the run started: its actor was not placed,
    or still imported, within :data:`START_TIMEOUT_S` (``reason`` ``None``), or the run was
    asked to stop meanwhile (``reason``: why)."""

    def __init__(self, reason: str | None) -> None:
        super().__init__(reason or f"no answer within {START_TIMEOUT_S:.0f} s")
        self.reason = reason


class RayStateBuilder:
    """Builds a schema's fields for actors on any node: Manager kinds from a Manager server the
    actors reach over TCP, transport through ``hub`` and the object store, and, unless
    ``same_host`` is false, rollouts and weights in shared memory for the actors on the hub's
    machine (:mod:`~mprl.backends.ray.samehost`)."""

    def __init__(
        self,
        manager: Any,
        hub: Any,
        model: torch.nn.Module,
        make_model: Callable[..., torch.nn.Module],
        same_host: bool = True,
        stopping: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.manager, self.hub, self.model, self.make_model = manager, hub, model, make_model
        self.same_host, self.stopping = same_host, stopping
        self._n = 0

    def _name(self, kind: str) -> str:
        self._n += 1
        return f"{kind}{self._n}"

    def _call(self, method: str, *args: Any) -> Any:
        """A call to the hub as the run starts: its actor may still be placed and importing,
        for as long as the backend gives a starting process (:data:`START_TIMEOUT_S`).
        :class:`HubNotStarted` past that, or once ``stopping()`` gives a reason."""
        ref = self.hub.hub_call.remote(method, *args)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ray.wait([ref], timeout=0.25)[0]:
            if (reason := self.stopping()) is not None:
                raise HubNotStarted(reason)
            if time.monotonic() >= deadline:
                raise HubNotStarted(None)
        return ray.get(ref)

    def rollouts(self, spec: RowSpec, workers: int, slots_per_worker: int) -> RayRollouts:
        field = self._name("rollouts")
        made = RayRollouts(self.hub, field, spec, workers, slots_per_worker)
        if self.same_host:
            args = (field, spec, workers, slots_per_worker)
            made.arena = self._call("arena_rollouts", *args)
        return made

    def weights(self) -> RayWeights:
        field = self._name("weights")
        arrays = [t.detach().cpu().numpy() for t in _floating(self.model)]
        packed = _pack(arrays, sum(a.nbytes for a in arrays))
        self._call("publish", field, 0, packed)  # pulled before any update
        made = RayWeights(self.hub, field)
        if self.same_host:
            made.arena = self._call("arena_weights", field)
        return made

    def counter(self, processes: int) -> RayCounter:
        field = self._name("counter")
        self._call("counter_load", field, 0)  # known to every cache: 0
        return RayCounter(self.hub, field)

    def replay(
        self, row: RowSpec, capacity: int, workers: int, pace: ReplayPace | None = None
    ) -> RayReplay:
        field = self._name("replay")
        self._call("replay_init", field, row, capacity, workers, pace)
        return RayReplay(self.hub, field, capacity // workers * workers, pace)

    def module(self, make: Callable[..., torch.nn.Module] | None, dims: Dims) -> torch.nn.Module:
        """A module of the train process (each process has its own copy; the driver's follows
        the train process's, for checkpoints)."""
        module = (make or self.make_model)(dims.observation_space, dims.action_space, dims.config)
        if make is None:  # a copy of the model: it starts from the same weights
            module.load_state_dict(self.model.state_dict())
        return module

    def tensor(self, *_: Any) -> Any:  # prepare() refuses Tensor fields first
        raise NotImplementedError("a Tensor field is shared memory of one machine")
