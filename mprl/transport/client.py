"""A hub's transport fields as every process of the run uses them (:mod:`mprl.transport.hub`).

A field is the hub's store itself in the hub's own process, the store mapped in a process of
the hub's machine (:mod:`mprl.transport.samehost`), and calls to the hub everywhere else; in
every case the same object, bound to its process, and the same protocol
(:mod:`mprl.transport`). What a process keeps between calls is in its :class:`Endpoint`, one
per process, attached to the fields it was sent (:func:`connect`); nothing is kept at module
level.

Calls go through a :class:`Link`: :class:`Direct` for a hub in the same process (the learner's
own, tests), :class:`mprl_builtin.ray.link.RayLink` for an actor's. A worker's rollout commit is
one call, whose answer (its rank's free slots, newer weights, the hub's counts) it reads at its
next acquire, so while the learner keeps up a worker never waits for an answer; its counter adds
and replay rows go in batches. Every wait is a call of at most :data:`REMOTE_WAIT_S`, so a
waiting process looks at the run's stop flag (and beats its heartbeat) that often; the run's
stop wakes every wait in the hub at once (:meth:`~mprl.transport.hub.Hub.stop_waits`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from mprl.schema import Dims, ReplayPace, RowSpec, SharedState
from mprl.transport import samehost
from mprl.transport.memory import _Bound, copy_in, published_tensors

if TYPE_CHECKING:
    from mprl.transport.hub import Hub, Info

#: the longest one remote wait lasts while the run goes on (the run's stop ends it early)
#: why: see benchmarks/README.md, "`ray_scaling.py`: the scaling curve and a projection"
REMOTE_WAIT_S = 1.0
#: the longest one wait in the hub's own process lasts between two stop checks
LOCAL_WAIT_S = 0.1
#: the longest an answer that should come at once is awaited
ANSWER_TIMEOUT_S = 60.0
#: the longest a call to the hub waits as the run starts (the hub's process is placed and
#: imports torch and the plugin first)
START_TIMEOUT_S = 180.0
#: a process's counter adds and replay rows go to the hub every FLUSH_S, or FLUSH_ROWS rows
FLUSH_S = 0.05
FLUSH_ROWS = 1024


class Link(Protocol):
    """How a process calls its run's hub."""

    #: what a call raises once the hub's process is gone
    errors: tuple[type[BaseException], ...]

    def call(self, method: str, *args: Any) -> Any:
        """Start ``hub.method(*args)``; what :meth:`get` takes the answer from."""
        ...

    def get(self, pending: Any, timeout: float) -> Any:
        """The answer of a call, waiting up to ``timeout`` (``TimeoutError`` past it)."""
        ...

    def ready(self, pending: Any, timeout: float) -> bool:
        """Whether the answer is there, waiting up to ``timeout`` for it."""
        ...


class Direct:
    """The link to a hub in this process: a call runs at once, in the caller's thread."""

    errors: tuple[type[BaseException], ...] = ()

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.hub, method)(*args)

    def get(self, pending: Any, timeout: float) -> Any:
        return pending

    def ready(self, pending: Any, timeout: float) -> bool:
        return True


class Endpoint:
    """One process's end of its run's hub: the link, and what the process keeps between calls.

    :param link: how this process calls the hub.
    :param hub: the hub, when it lives in this process (its fields are used in place).
    """

    def __init__(self, link: Link, hub: Hub | None = None) -> None:
        self.link, self.hub = link, hub
        #: the hub's versions and totals as of the last answer (:meth:`note`)
        self.info: Info = {"weights": {}, "counters": {}, "replays": {}}
        #: per weights field, the newest ``(version, arrays)`` a commit's answer brought
        self.hints: dict[str, tuple[int, list[np.ndarray]]] = {}
        #: per weights field, the newest version this process heard of any way
        self.seen: dict[str, int] = {}
        self._mapped: dict[str, Any] = {}
        # counter adds and replay rows not sent yet (see send())
        self.rank = -1
        self.counters: dict[str, int] = {}
        self.rows: dict[str, list[dict[str, np.ndarray]]] = {}
        self.n_rows = 0
        self.in_flight = 0  # rows of the batch sent last, until its answer is read
        self._sent_at = time.monotonic()
        self._answer: Any = None
        self._lock = threading.Lock()

    def call(self, method: str, *args: Any) -> Any:
        return self.link.call(method, *args)

    def get(self, pending: Any, timeout: float = ANSWER_TIMEOUT_S) -> Any:
        return self.link.get(pending, timeout)

    def ask(self, method: str, *args: Any, timeout: float = ANSWER_TIMEOUT_S) -> Any:
        """Call the hub and wait for the answer."""
        return self.get(self.call(method, *args), timeout)

    def store(self, field: str, arena: samehost.Arena | None) -> Any:
        """``field``'s store as this process uses it in place: the hub's own, or mapped on the
        hub's machine; ``None``: this process reaches it through calls."""
        if self.hub is not None:
            return self.hub.fields[field]
        if field not in self._mapped:
            self._mapped[field] = samehost.open_arena(arena)
        return self._mapped[field]

    def note(self, info: Info | None) -> None:
        """Refresh the cache of the hub's versions and totals (answers may come out of order:
        the newest count wins)."""
        if not info:
            return
        for key in ("weights", "counters"):
            cache = self.info[key]
            for field, value in info.get(key, {}).items():
                cache[field] = max(value, cache.get(field, value))
        replays = self.info["replays"]
        for field, counts in info.get("replays", {}).items():  # (added, sampled, want)
            had = replays.get(field, counts)
            replays[field] = tuple(max(a, b) for a, b in zip(counts, had, strict=True))

    def due(self) -> None:
        """Send the batch if it is big or old enough."""
        if self.n_rows >= FLUSH_ROWS or time.monotonic() - self._sent_at >= FLUSH_S:
            self.send()

    def send(self) -> None:
        """Send the batched counter adds and replay rows, after the previous batch's answer
        (so they arrive in order, and a process far ahead of the hub waits)."""
        with self._lock:
            if self._answer is not None:
                self.note(self.get(self._answer))
                self._answer, self.in_flight = None, 0
            if self.counters or self.rows:
                counters, rows = self.counters, self.rows
                self.in_flight = self.n_rows
                self.counters, self.rows, self.n_rows = {}, {}, 0
                self._answer = self.call("flush", self.rank, counters, rows)
            self._sent_at = time.monotonic()

    def flush(self) -> None:
        """Send what is batched and take the answer (the process's function has returned).
        With the hub's process gone (the run is failing) the batch is lost, as a dead
        worker's is."""
        try:
            self.send()
            self.send()  # the second takes the first's answer
        except (*self.link.errors, TimeoutError):
            pass


def connect(state: SharedState, endpoint: Endpoint) -> None:
    """Attach ``endpoint`` to the hub fields of ``state``, as a process gets it (unpickled)."""
    for value in vars(state).values():
        if isinstance(value, _HubField):
            value.endpoint = endpoint


class _HubField(_Bound):
    """A transport field held by a hub, as one process uses it (bound as a memory field is:
    :class:`mprl.transport.memory._Bound`); its endpoint is this process's, never pickled."""

    endpoint: Endpoint

    def __init__(self, endpoint: Endpoint, field: str, arena: samehost.Arena | None) -> None:
        self.endpoint, self.field, self.arena = endpoint, field, arena
        self._local()

    def __getstate__(self) -> dict[str, Any]:  # to another process: without this one's end
        return {k: v for k, v in self.__dict__.items() if k not in ("endpoint", "_bound")}

    def _local(self) -> None:
        self._bound: Any = None  # the store bound to this process, once looked for

    def _store(self) -> Any:
        """The store, in place and bound to this process, or ``None`` (through calls)."""
        if self._bound is None:
            store = self.endpoint.store(self.field, self.arena)
            self._bound = False if store is None else store.bind(self._slot, self._stop)
        return self._bound or None

    def _call(self, method: str, *args: Any) -> Any:
        return self.endpoint.call(method, self.field, *args)

    def _waiting(self, call: Callable[[float], Any], timeout: float | None) -> Any:
        """``call(slice_s)`` (a wait in the hub) until it gives a value other than ``None``;
        ``None`` once the run stops or after ``timeout``."""
        endpoint = self.endpoint
        deadline = None if timeout is None else time.monotonic() + timeout
        if endpoint.counters or endpoint.rows:  # what it waits for may need them: send them
            endpoint.send()
        piece = LOCAL_WAIT_S if endpoint.hub is not None else REMOTE_WAIT_S
        while True:
            if self._stop():  # first: data that keeps coming must not keep a stopped run going
                return None
            left = piece if deadline is None else deadline - time.monotonic()
            found = endpoint.get(call(max(0.0, min(piece, left))), ANSWER_TIMEOUT_S + piece)
            if found is not None:
                return found
            if deadline is not None and time.monotonic() >= deadline:
                return None


class HubRollouts(_HubField):
    """:class:`mprl.transport.RolloutSlots`. Away from the hub's machine a worker's slots are
    its own tensors and a commit sends one to the hub, into a free slot of its rank there."""

    def __init__(
        self,
        endpoint: Endpoint,
        field: str,
        arena: samehost.Arena | None,
        spec: RowSpec,
        workers: int,
        slots_per_worker: int,
    ) -> None:
        self.spec = {**spec, "version": ((), torch.int64), "source": ((), torch.int64)}
        self.workers, self.slots_per_worker = workers, slots_per_worker
        super().__init__(endpoint, field, arena)

    def _local(self) -> None:
        super()._local()
        self._buffers: dict[str, torch.Tensor] | None = None
        self._cursor = 0
        self._put: Any = None  # the answer of this worker's last commit, until read
        self._full = False  # the last answer read said the rank had no free slot left

    def _slots(self) -> dict[str, torch.Tensor]:
        if self._buffers is None:
            self._buffers = {
                name: torch.zeros((self.slots_per_worker, *shape), dtype=dtype)
                for name, (shape, dtype) in self.spec.items()
            }
            self._buffers["version"].fill_(-1)
        return self._buffers

    def slot(self, index: int) -> dict[str, torch.Tensor]:
        store = self._store()
        if store is not None:
            return store.slot(index)
        return {name: t[index] for name, t in self._slots().items()}

    def acquire(self, timeout: float | None = None) -> int | None:
        """A slot to fill. Remotely, a worker fills its next slot while its last commit's
        answer travels; once an answer said its rank had no free slot left, it waits here for
        room before it fills, so its rollout is played with the newest weights, as on the
        local backend."""
        store = self._store()
        if store is not None:
            return store.acquire(timeout)
        if not 0 <= self._slot < self.workers:
            raise RuntimeError("only a worker acquires rollout slots (the learner takes them)")
        if self._stop():
            return None
        full = self._full and self._put is not None and self._answer()
        if full and self._room(timeout) is None:
            return None
        index = self._cursor
        self._cursor = (self._cursor + 1) % self.slots_per_worker
        return index

    def _answer(self) -> bool:
        """Read the last commit's answer: newer weights (the next pull needs no call), the
        hub's counts, whether the rank had no free slot left."""
        endpoint = self.endpoint
        free, newer, info = endpoint.get(self._put)
        self._put = None
        endpoint.hints.update(newer)
        endpoint.note(info)
        self._full = free == 0
        return self._full

    def _room(self, timeout: float | None) -> bool | None:
        rank = self._slot
        return self._waiting(lambda s: self._call("room", rank, s), timeout)

    def commit(self, index: int) -> None:
        """Remotely: send the slot to the hub in one call (a commit as the run stops is
        dropped, as a rollout in flight would be)."""
        store = self._store()
        if store is not None:
            store.commit(index)
            return
        if self._put is not None and self._answer() and self._room(None) is None:
            return
        slot = self.slot(index)
        data = {name: t.numpy() for name, t in slot.items()}  # copied by the call
        self._put = self._call("put", self._slot, data, dict(self.endpoint.seen))

    def take_batch(self, n: int, timeout: float | None = None) -> dict[str, torch.Tensor] | None:
        store = self._store()
        if store is not None:
            return store.take_batch(n, timeout)
        return self._waiting(lambda s: self._call("take_batch", n, s), timeout)


class HubWeights(_HubField):
    """:class:`mprl.transport.WeightBroadcast`. The hub's learner publishes in place; a worker
    away from the hub's machine copies the newest version from a commit's answer or a call."""

    def _local(self) -> None:
        super()._local()
        self._version: int | None = None

    @property
    def version(self) -> int:
        store = self._store()
        if store is not None:
            return store.version
        if self._version is None:
            self._version = int(self.endpoint.get(self._call("version")))
        return self._version

    @contextmanager
    def publishing(self, model: torch.nn.Module) -> Iterator[None]:
        hub = self.endpoint.hub
        if hub is not None:  # the learner with its hub
            with hub.publishing_model(self.field, model):
                yield
            return
        yield
        version = self.version + 1
        arrays = [t.detach().cpu().numpy().copy() for t in published_tensors(model)]
        self.endpoint.get(self._call("publish", version, arrays))
        self._version = version

    def wait(self, newer_than: int, timeout: float | None = None) -> int | None:
        store = self._store()
        if store is not None:
            return store.wait(newer_than, timeout)
        version = self._waiting(lambda s: self._call("wait_newer", newer_than, s), timeout)
        if version is None or self._stop():  # published as the run stopped: see the protocol
            return None
        seen = self.endpoint.seen
        seen[self.field] = max(version, seen.get(self.field, -1))
        return version

    def pull(self, model: torch.nn.Module, have: int = -1) -> int:
        store = self._store()
        if store is not None:
            return store.pull(model, have)
        endpoint, field = self.endpoint, self.field
        hint = endpoint.hints.pop(field, None)
        newest = max(endpoint.info["weights"].get(field, have + 1), endpoint.seen.get(field, -1))
        if hint is not None and hint[0] >= endpoint.seen.get(field, -1):
            found: tuple[int, list[np.ndarray]] | None = hint
        elif newest <= have:
            found = None  # nothing newer as of the last answer (or wait): no call
        else:
            found = endpoint.get(self._call("latest", have))
        if found is None or found[0] == have:
            return have
        version, arrays = found
        endpoint.seen[field] = max(version, endpoint.seen.get(field, -1))
        with torch.no_grad():
            for dst, src in zip(published_tensors(model), arrays, strict=True):
                copy_in(dst, src)
        self._version = version
        return version

    _known = 0  # the version the driver last read

    def state(self) -> dict[str, int]:
        try:
            self._known = int(self.endpoint.get(self._call("version"), 10.0))
        except (*self.endpoint.link.errors, TimeoutError):  # its process is gone: the last
            pass
        return {"version": self._known}

    def load(self, state: Mapping[str, Any]) -> None:
        self.endpoint.get(self._call("set_version", int(state["version"])))


class HubCounter(_HubField):
    """:class:`mprl.transport.SharedCounter`. Away from the hub's machine, adds go in the
    process's batch, and :attr:`value` is the hub's total as of the last answer plus what the
    process added since."""

    def add(self, n: int = 1) -> None:
        store = self._store()
        if store is not None:
            store.add(n)
            return
        if self._slot < 0:
            raise RuntimeError("a counter is added to by the processes of a run")
        endpoint = self.endpoint
        endpoint.rank = self._slot
        endpoint.counters[self.field] = endpoint.counters.get(self.field, 0) + n
        endpoint.due()

    @property
    def value(self) -> int:
        store = self._store()
        if store is not None:
            return store.value
        endpoint = self.endpoint
        mine = endpoint.counters.get(self.field, 0)  # added here, not sent yet
        known = endpoint.info["counters"].get(self.field)
        if self._slot < 0 or known is None:  # the driver, or unknown yet
            return int(endpoint.get(self._call("value"))) + mine
        return known + mine

    def load(self, value: int) -> None:
        self.endpoint.get(self._call("load_counter", int(value)))


class HubReplay(_HubField):
    """:class:`mprl.transport.ReplayStore`. Away from the hub's machine a worker's rows go in
    its process's batch, visible to the learner within :data:`FLUSH_S`; with a declared replay
    ratio it decides whether it is ahead from the counts of the hub's last answer plus the rows
    it has not sent, and only then waits, in one call that returns once the learner has caught
    up by half the lead (so the workers together may be a batch past ``max_lead``)."""

    def __init__(
        self,
        endpoint: Endpoint,
        field: str,
        arena: samehost.Arena | None,
        capacity: int,
        pace: ReplayPace | None,
    ) -> None:
        self.capacity, self.pace = capacity, pace
        super().__init__(endpoint, field, arena)

    def add(self, **rows: torch.Tensor) -> None:
        store = self._store()
        if store is not None:
            store.add(**rows)
            return
        if self._slot < 0:
            raise RuntimeError("only a worker adds rows to a replay buffer")
        data = {
            name: (v.detach().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)).copy()
            for name, v in rows.items()
        }
        self._keep_pace()
        endpoint = self.endpoint
        endpoint.rank = self._slot
        endpoint.rows.setdefault(self.field, []).append(data)
        endpoint.n_rows += len(next(iter(data.values())))
        endpoint.due()

    def _keep_pace(self) -> None:
        pace, endpoint = self.pace, self.endpoint
        if pace is None or pace.lead is None or self._stop():
            return
        added, sampled, want = endpoint.info["replays"].get(self.field, (0, 0, 0))
        if pace.worker_waits(added + endpoint.in_flight + endpoint.n_rows, sampled, want):
            endpoint.note(self._waiting(lambda s: self._call("replay_room", s), None))

    def size(self) -> int:
        store = self._store()
        return store.size() if store is not None else int(self.endpoint.get(self._call("size")))

    def wait_size(self, n: int, timeout: float | None = None) -> int | None:
        store = self._store()
        if store is not None:
            return store.wait_size(n, timeout)
        return self._waiting(lambda s: self._call("wait_size", n, s), timeout)

    def sample(
        self, n: int, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor] | None:
        store = self._store()
        if store is not None:
            return store.sample(n, generator)
        if self.pace is None:  # never waits: drawn at once
            return self.endpoint.get(self._call("sample", self._slot, n, 0.0))
        return self._waiting(lambda s: self._call("sample", self._slot, n, s), None)

    def state(self) -> dict[str, Any]:
        return self.endpoint.get(self._call("replay_state"), 600.0)

    def load(self, state: Mapping[str, Any]) -> bool:
        return bool(self.endpoint.get(self._call("replay_load", dict(state)), 600.0))


class HubNotStarted(Exception):
    """The hub did not answer as the run started: its process was not placed, or still
    imported, within :data:`START_TIMEOUT_S` (``reason`` ``None``), or the run was asked to
    stop meanwhile (``reason``: why)."""

    def __init__(self, reason: str | None) -> None:
        super().__init__(reason or f"no answer within {START_TIMEOUT_S:.0f} s")
        self.reason = reason


class HubBuilder:
    """Builds a schema's fields for processes anywhere: Manager kinds from ``manager`` (a
    Manager server every process reaches), transport kinds in the hub ``endpoint`` calls,
    mapped by the processes of the hub's machine unless ``same_host`` is false.

    :param stopping: a reason to stop, or ``None``; asked while the hub does not answer yet.
    """

    def __init__(
        self,
        manager: Any,
        endpoint: Endpoint,
        model: torch.nn.Module,
        make_model: Callable[..., torch.nn.Module],
        same_host: bool = True,
        stopping: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.manager, self.endpoint, self.model = manager, endpoint, model
        self.make_model, self.same_host, self.stopping = make_model, same_host, stopping
        self._made: dict[str, int] = {}  # fields made, by kind (their names: rollouts1 ...)

    def _make(self, kind: str, *args: Any) -> tuple[str, samehost.Arena | None]:
        """Make a field of ``kind`` in the hub: its name, and its arena. The hub's process
        may still be placed and importing, for as long as a starting process may take."""
        self._made[kind] = self._made.get(kind, 0) + 1
        field = f"{kind}{self._made[kind]}"
        link = self.endpoint.link
        pending = link.call(f"make_{kind}", field, *args, self.same_host)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not link.ready(pending, 0.25):
            if (reason := self.stopping()) is not None:
                raise HubNotStarted(reason)
            if time.monotonic() >= deadline:
                raise HubNotStarted(None)
        return field, link.get(pending, ANSWER_TIMEOUT_S)

    def rollouts(self, spec: RowSpec, workers: int, slots_per_worker: int) -> HubRollouts:
        field, arena = self._make("rollouts", spec, workers, slots_per_worker)
        return HubRollouts(self.endpoint, field, arena, spec, workers, slots_per_worker)

    def weights(self) -> HubWeights:
        arrays = [t.detach().cpu().numpy() for t in published_tensors(self.model)]
        field, arena = self._make("weights", arrays)
        return HubWeights(self.endpoint, field, arena)

    def counter(self, processes: int) -> HubCounter:
        field, arena = self._make("counter", processes)
        return HubCounter(self.endpoint, field, arena)

    def replay(
        self, row: RowSpec, capacity: int, workers: int, pace: ReplayPace | None = None
    ) -> HubReplay:
        field, arena = self._make("replay", row, capacity, workers, pace)
        return HubReplay(self.endpoint, field, arena, capacity // workers * workers, pace)

    def module(self, make: Callable[..., torch.nn.Module] | None, dims: Dims) -> torch.nn.Module:
        """A module of each process's own (the driver's follows the train process's, for
        checkpoints)."""
        module = (make or self.make_model)(dims.observation_space, dims.action_space, dims.config)
        if make is None:  # a copy of the model: it starts from the same weights
            module.load_state_dict(self.model.state_dict())
        return module

    def tensor(self, *_: Any) -> Any:  # a backend refuses Tensor fields first
        raise NotImplementedError("a Tensor field is shared memory of one machine")
