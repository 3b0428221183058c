"""The one implementation of the transport kinds: tensors in memory.

Rollout slots (:class:`MemoryRollouts`) are preallocated tensors handed between workers and
learner by index (after torchbeast's "monobeast"), weights (:class:`MemoryWeights`) are published
under a sequence lock, a replay buffer (:class:`MemoryReplay`) is a ring of rows per worker with
a sequence number per row, a counter (:class:`MemoryCounter`) a slot per process. No lock is
ever held across processes, so a process killed at any instruction wedges nobody; a waiting side
looks again between naps.

The same objects serve every placement:

- **shared** (the local backend): their tensors in shared memory, read and written by spawned
  processes; a waiting call sleeps between looks;
- **in-process** (the serial backend, :mod:`mprl.testing`): plain tensors; a waiting call hands
  the turn to the other processes instead (its stop check does);
- **held by a hub** (:mod:`mprl.transport.hub`, the Ray backend): in the hub's process, where
  its learner reads them and remote workers' calls write them, or in an anonymous shared file
  that the processes of the hub's machine map (:mod:`mprl.transport.samehost`); a waiting call
  naps on the hub's condition, so a remote write wakes it at once.

Objects are built unbound; each process uses them through :meth:`bind`, which gives them its
slot (the worker rank; ``workers`` for the train process) and its stop check
(``ctx.should_stop``, which is also its heartbeat).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from mprl.schema import Dims, ReplayPace, RowSpec, _never

MAX_PAUSE_S = 0.001  # the longest a waiting call sleeps between looks


class _Bound:
    """What every transport object has: a process binding, numpy views of its counters made
    again in each process (they do not pickle), and how it waits."""

    _slot = -1
    _stop: Callable[[], bool] = staticmethod(_never)
    #: a waiting call naps between looks (``False``: serial, where the stop check hands the
    #: turn on instead)
    _sleep = True
    #: how a waiting call naps: ``time.sleep``, or a hub's condition (a remote write wakes it)
    _nap: Callable[[float], Any] = staticmethod(time.sleep)
    #: held by a hub: called ``(event, field, rank)`` after a change that a waiting call of
    #: another process may wait for (:class:`mprl.transport.hub.Hub`)
    _changed: Callable[[str, str, int], Any] | None = None
    _field = ""
    _shared: tuple[str, ...] = ()

    def bind(self, slot: int, stop: Callable[[], bool]) -> Any:
        """This object as process ``slot`` uses it; its waits end once ``stop()`` is true."""
        bound = copy.copy(self)
        bound._slot, bound._stop = slot, stop
        bound._local()
        return bound

    def _local(self) -> None:
        """Set up what is per process (views, cursors, caches)."""

    def __getstate__(self) -> dict[str, Any]:  # to another process: what it shares
        return {k: v for k, v in self.__dict__.items() if k in self._shared}

    def __copy__(self) -> Any:  # in this process (bind): everything, a hub's wiring too
        copied = type(self).__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local()

    def _notify(self, event: str, rank: int = -1) -> None:
        if self._changed is not None:
            self._changed(event, self._field, rank)

    def _wait(self, ready: Callable[[], Any], timeout: float | None) -> Any:
        """Call ``ready()`` until it gives a value other than ``None``; ``None`` once the stop
        check is true, or on timeout. Between looks it naps, backing off from 0.1 ms to
        :data:`MAX_PAUSE_S` (or, serial, only the stop check: it hands the turn on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0001
        while True:
            found = ready()
            if found is not None:
                return found
            if self._stop() or (deadline is not None and time.monotonic() >= deadline):
                return None
            if self._sleep:
                self._nap(pause)
                pause = min(pause * 2, MAX_PAUSE_S)


def _share(t: torch.Tensor, share: bool) -> torch.Tensor:
    return t.share_memory_() if share else t


FREE, FULL, TAKEN = 0, 1, -1  # a rollout slot's states; TAKEN: the learner is copying it


class MemoryRollouts(_Bound):
    """:class:`mprl.transport.RolloutSlots` over tensors.

    Each slot belongs to one rank and has a state, ``FREE``, ``FULL`` or ``TAKEN``. Only the
    owning worker turns a slot ``FULL`` (after writing it), only the learner turns it ``TAKEN``
    (while copying it) and ``FREE`` (after), so no lock is needed, and a restarted worker simply
    carries on with its rank's slots. (A ``multiprocessing.Queue`` of indices would not survive a
    kill: a worker blocked in ``get()`` holds the queue's reader lock.)
    """

    _shared = ("buffers", "_state", "_seq", "workers", "slots_per_worker", "_sleep")

    def __init__(
        self, spec: RowSpec, workers: int, slots_per_worker: int, share: bool, sleep: bool
    ) -> None:
        slots = workers * slots_per_worker
        full = {**spec, "version": ((), torch.int64), "source": ((), torch.int64)}
        self.workers, self.slots_per_worker, self._sleep = workers, slots_per_worker, sleep
        self.buffers = {
            name: _share(torch.zeros((slots, *shape), dtype=dtype), share)
            for name, (shape, dtype) in full.items()
        }
        self.buffers["version"].fill_(-1)  # no slot holds a rollout yet
        self._state = _share(torch.zeros(slots, dtype=torch.int64), share)
        self._seq = _share(torch.zeros(slots, dtype=torch.int64), share)  # commit order
        self._local()

    def _local(self) -> None:
        self._state_np, self._seq_np = self._state.numpy(), self._seq.numpy()
        self._cursor = 0  # which of its slots this worker fills next
        self._taken: list[dict[str, torch.Tensor]] = []  # copied out, not yet batched

    def slot(self, index: int) -> dict[str, torch.Tensor]:
        return {name: t[index] for name, t in self.buffers.items()}

    def acquire(self, timeout: float | None = None) -> int | None:
        if not 0 <= self._slot < self.workers:
            raise RuntimeError("only a worker acquires rollout slots (the learner takes them)")
        index = self._slot * self.slots_per_worker + self._cursor

        def ready() -> int | None:
            return index if self._state_np[index] == FREE else None

        found = self._wait(ready, timeout)
        if found is not None:
            self._cursor = (self._cursor + 1) % self.slots_per_worker
        return found

    def commit(self, index: int) -> None:
        self.buffers["source"][index] = index // self.slots_per_worker
        self._seq_np[index] = time.monotonic_ns()
        self._state_np[index] = FULL  # after the data and the order: the learner reads it next
        self._notify("arrived")

    def take(self, timeout: float | None = None) -> int | None:
        """Learner: the oldest committed slot, marked taken; give it back with :meth:`release`."""

        def ready() -> int | None:
            full = np.flatnonzero(self._state_np == FULL)
            return int(full[np.argmin(self._seq_np[full])]) if full.size else None

        index = self._wait(ready, timeout)
        if index is not None:
            self._state_np[index] = TAKEN  # neither free nor offered again
        return index

    def release(self, index: int) -> None:
        """Learner: give a slot back to its worker once its data has been used."""
        self._state_np[index] = FREE
        self._notify("room", index // self.slots_per_worker)

    def free_slots(self, rank: int) -> int:
        """How many of ``rank``'s slots are free now."""
        per = self.slots_per_worker
        return int((self._state_np[rank * per : (rank + 1) * per] == FREE).sum())

    def take_batch(self, n: int, timeout: float | None = None) -> dict[str, torch.Tensor] | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._taken) < n:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            index = self.take(left)
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


def published_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """What a published model consists of: its parameters and its floating-point buffers
    (running statistics), in a fixed order."""
    buffers = [b for b in module.buffers() if b.is_floating_point()]
    return [*module.parameters(), *buffers]


def copy_in(dst: torch.Tensor, src: torch.Tensor | np.ndarray) -> None:
    """Copy ``src`` into ``dst`` (on the CPU for an array, which may be a read-only view of
    what a call brought: Ray's zero-copy arrays)."""
    if isinstance(src, torch.Tensor):
        dst.copy_(src)
    else:
        np.copyto(dst.detach().numpy(), src)


class TensorHolder(torch.nn.Module):
    """Tensors in :func:`published_tensors`'s order as a module's buffers: the published
    weights where they are kept apart from any model (a hub's)."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        super().__init__()
        for i, t in enumerate(tensors):
            self.register_buffer(f"t{i}", t)


class MemoryWeights(_Bound):
    """:class:`mprl.transport.WeightBroadcast` over the run's model in shared memory.

    A sequence lock: the counter is odd while the learner writes, so a reader that saw it change
    copies again. A learner whose model is the shared one (``ctx.model``) updates it in place;
    another model (one on a GPU) is copied into the shared one at the end of the block.
    """

    _shared = ("_model", "_seq", "_sleep")

    def __init__(self, model: torch.nn.Module, share: bool, sleep: bool) -> None:
        self._model, self._sleep = model, sleep
        self._seq = _share(torch.zeros(1, dtype=torch.int64), share)
        self._local()

    def _local(self) -> None:
        self._seq_np = self._seq.numpy()
        # (the model of the last call, its tensors): listing the parameters of a small model
        # costs as much as copying them
        self._cache: tuple[Any, list[torch.Tensor]] | None = None
        self._shared_tensors = published_tensors(self._model)

    def _tensors(self, model: torch.nn.Module) -> list[torch.Tensor]:
        if self._cache is None or self._cache[0] is not model:
            self._cache = (model, published_tensors(model))
        return self._cache[1]

    @property
    def version(self) -> int:
        return int(self._seq_np[0]) // 2

    @contextmanager
    def publishing(self, model: torch.nn.Module) -> Iterator[None]:
        tensors = self._tensors(model)
        in_place = tensors[0].data_ptr() == self._shared_tensors[0].data_ptr()
        self._seq_np[0] += 1  # odd: a write is in progress
        try:
            yield
            if not in_place:
                with torch.no_grad():
                    for dst, src in zip(self._shared_tensors, tensors, strict=True):
                        dst.copy_(src)
        finally:
            self._seq_np[0] += 1
            self._notify("published")

    def wait(self, newer_than: int, timeout: float | None = None) -> int | None:
        def ready() -> int | None:
            seq = int(self._seq_np[0])
            return seq // 2 if seq % 2 == 0 and seq // 2 > newer_than else None

        version = self._wait(ready, timeout)
        # after the look: a learner publishes only after it saw the stop
        return None if version is None or self._stop() else version

    def pull(self, model: torch.nn.Module, have: int = -1) -> int:
        tensors = self._tensors(model)
        while True:
            before = int(self._seq_np[0])
            if before % 2:  # the learner is writing: it is quick, look again
                if not self._sleep:
                    self._stop()  # serial: the learner needs the turn to finish
                time.sleep(0)
                continue
            if before // 2 == have:
                return have
            with torch.no_grad():
                for dst, src in zip(tensors, self._shared_tensors, strict=True):
                    dst.copy_(src)
            if int(self._seq_np[0]) == before:
                return before // 2

    def read(self) -> tuple[int, list[np.ndarray]]:
        """The newest published version and copies of its tensors, read whole."""
        while True:
            before = int(self._seq_np[0])
            if before % 2:
                time.sleep(0)
                continue
            arrays = [t.detach().numpy().copy() for t in self._shared_tensors]
            if int(self._seq_np[0]) == before:
                return before // 2, arrays

    def put(self, tensors: Sequence[torch.Tensor | np.ndarray], version: int) -> None:
        """Copy ``tensors`` (a model's, :func:`published_tensors`'s order) in as ``version``: for a
        publisher that numbers the versions itself (a hub's remote learner)."""
        self._seq_np[0] = 2 * version - 1  # odd: a write is in progress
        with torch.no_grad():
            for dst, src in zip(self._shared_tensors, tensors, strict=True):
                copy_in(dst, src)
        self._seq_np[0] = 2 * version
        self._notify("published")

    def state(self) -> dict[str, int]:
        return {"version": self.version}

    def load(self, state: Mapping[str, Any]) -> None:
        self._seq_np[0] = 2 * int(state["version"])


class MemoryReplay(_Bound):
    """:class:`mprl.transport.ReplayStore` over tensors.

    Worker ``w`` owns rows ``[w * per, (w + 1) * per)`` and writes them as a ring; ``heads[w]``
    counts the rows it completed. Each row has a sequence number, odd while the row is written:
    :meth:`sample` reads it before and after copying a row and draws again for any row that was
    odd or changed, so it never returns a torn row.

    With a :class:`mprl.schema.ReplayPace` (a declared replay ratio), each process counts the
    rows it sampled in its own slot of ``sampled`` (the last slot: earlier sessions), the
    learner's batch size is in ``want``, and :meth:`sample` and :meth:`add` wait on them as
    the pace says: the rows added are the sum of ``heads``.
    """

    _shared = (
        "buffers", "_heads", "_stamps", "_sampled", "_want", "workers", "per_worker", "capacity",
        "pace", "_sleep",
    )  # fmt: skip

    def __init__(
        self,
        row: RowSpec,
        capacity: int,
        workers: int,
        share: bool,
        sleep: bool = True,
        pace: ReplayPace | None = None,
    ) -> None:
        self.workers, self.per_worker = workers, capacity // workers
        self.capacity = self.per_worker * workers
        self.pace, self._sleep = pace, sleep
        self.buffers = {
            name: _share(torch.zeros((self.capacity, *shape), dtype=dtype), share)
            for name, (shape, dtype) in row.items()
        }
        self._heads = _share(torch.zeros(workers, dtype=torch.int64), share)
        self._stamps = _share(torch.zeros(self.capacity, dtype=torch.int64), share)
        self._sampled = _share(torch.zeros(workers + 2, dtype=torch.int64), share)
        self._want = _share(torch.zeros(1, dtype=torch.int64), share)
        self._local()

    def _local(self) -> None:
        self._heads_np, self._stamps_np = self._heads.numpy(), self._stamps.numpy()
        self._sampled_np, self._want_np = self._sampled.numpy(), self._want.numpy()
        # rows are written through numpy views (see benchmarks/README.md, "Replay rows through
        # numpy views")
        self._views = {name: t.numpy() for name, t in self.buffers.items()}

    # -- the pace's counts ---------------------------------------------------------------------

    def added(self) -> int:
        """Rows added so far (all workers, earlier sessions included), overwritten ones too."""
        return int(self._heads_np.sum())

    def sampled(self) -> int:
        """Rows sampled so far (all processes, earlier sessions included)."""
        return int(self._sampled_np.sum())

    def counts(self) -> tuple[int, int, int]:
        """``(added, sampled, want)``: what the pace decides on."""
        return self.added(), self.sampled(), int(self._want_np[0])

    def count_sample(self, n: int) -> None:
        """Count ``n`` rows sampled by this process (a declared replay ratio's count)."""
        self._want_np[0] = n
        self._sampled_np[min(max(self._slot, 0), self.workers)] += n
        self._notify("sampled")

    def wait_size(self, n: int, timeout: float | None = None) -> int | None:
        def ready() -> int | None:
            size = self.size()
            return size if size >= n else None

        return self._wait(ready, timeout)

    # -- rows ----------------------------------------------------------------------------------

    def add(self, **rows: torch.Tensor) -> None:
        if not 0 <= self._slot < self.workers:
            raise RuntimeError("only a worker adds rows to a replay buffer")
        pace = self.pace
        if pace is not None and pace.worker_waits(*self.counts()):

            def room() -> bool | None:
                return True if pace.worker_resumes(*self.counts()) else None

            self._wait(room, None)  # stopping: the rows go in all the same
        self.write(self._slot, rows)

    def write(self, rank: int, rows: Mapping[str, Any]) -> None:
        """Append ``rows`` to ``rank``'s ring, never waiting (:meth:`add` checks and waits)."""
        if rows.keys() != self.buffers.keys():
            raise ValueError(f"add() takes the fields {sorted(self.buffers)}, got {sorted(rows)}")
        values = [
            (
                self._views[name],
                value.detach().numpy() if isinstance(value, torch.Tensor) else np.asarray(value),
            )
            for name, value in rows.items()
        ]
        n = len(values[0][1])
        if n > self.per_worker:
            raise ValueError(f"{n} rows at once, more than a worker's {self.per_worker}")
        for (name, _), (buffer, value) in zip(rows.items(), values, strict=True):
            if value.shape[0] != n or value.shape[1:] != buffer.shape[1:]:
                raise ValueError(
                    f"add(): {name} has shape {tuple(value.shape)}, expected "
                    f"{(n, *buffer.shape[1:])} ({n} rows)"
                )
        head = int(self._heads_np[rank])
        start = rank * self.per_worker + head % self.per_worker
        end = rank * self.per_worker + self.per_worker
        # the rows in place: one slice when they do not wrap round the worker's ring (the
        # common case; an index copy per field is the slower way)
        parts = [(slice(start, start + n), slice(0, n))]
        if start + n > end:
            first = end - start
            parts = [
                (slice(start, end), slice(0, first)),
                (slice(end - self.per_worker, end - self.per_worker + n - first), slice(first, n)),
            ]
        for rows_at, _ in parts:
            self._stamps_np[rows_at] += 1  # odd: being written
        for rows_at, taken in parts:
            for buffer, value in values:
                buffer[rows_at] = value[taken]
        for rows_at, _ in parts:
            self._stamps_np[rows_at] += 1  # even: complete
        self._heads_np[rank] = head + n  # after the rows: they are visible from here on
        self._notify("arrived")

    def _sizes(self) -> np.ndarray:
        return np.minimum(self._heads_np, self.per_worker)

    def size(self) -> int:
        return int(self._sizes().sum())

    def sample(
        self, n: int, generator: torch.Generator | None = None, timeout: float | None = None
    ) -> dict[str, torch.Tensor] | None:
        """As :meth:`mprl.transport.ReplayStore.sample`; ``timeout``: ``None`` after that long
        waiting for the ratio (a hub's slice of a remote caller's wait)."""
        pace = self.pace
        if pace is not None:
            self._want_np[0] = n  # before waiting: the workers' bound counts on this batch

            def allowed() -> bool | None:
                return None if pace.learner_waits(*self.counts()) else True

            if self._wait(allowed, timeout) is None:
                return None
            self.count_sample(n)
        return self.draw(n, generator)

    def draw(
        self, n: int, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor] | None:
        """``n`` rows as :meth:`sample` returns them, never waiting and counting nothing."""
        sizes = self._sizes()
        total = int(sizes.sum())
        if total == 0:
            return None
        ends = np.cumsum(sizes)
        where = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        out = {
            name: torch.empty((n, *t.shape[1:]), dtype=t.dtype) for name, t in self.buffers.items()
        }
        while todo.size:
            draw = torch.randint(total, (todo.size,), generator=generator).numpy()
            owner = np.searchsorted(ends, draw, side="right")
            where[todo] = owner * self.per_worker + draw - (ends[owner] - sizes[owner])
            before = self._stamps_np[where[todo]].copy()
            index = torch.from_numpy(where[todo])
            for name, t in self.buffers.items():
                out[name][torch.from_numpy(todo)] = t.index_select(0, index)
            after = self._stamps_np[where[todo]]
            todo = todo[(before % 2 == 1) | (before != after)]  # torn: draw those again
        return out

    def state(self) -> dict[str, Any]:
        return {
            "heads": self._heads.clone(),
            "sampled": torch.tensor(self.sampled()),
            "added": torch.tensor(self.added()),
            **{name: t.clone() for name, t in self.buffers.items()},
        }

    def load(self, state: Mapping[str, Any]) -> bool:
        if state["heads"].shape != self._heads.shape or any(
            state[name].shape != t.shape for name, t in self.buffers.items()
        ):
            return False
        for name, t in self.buffers.items():
            t.copy_(state[name])
        self._heads.copy_(state["heads"])
        self._stamps.zero_()
        self._sampled_np[:] = 0
        self._sampled_np[-1] = self._sampled_after(state)
        return True

    def _sampled_after(self, state: Mapping[str, Any]) -> int:
        """The rows sampled to count on from after loading ``state``: its own count, less the
        ratio's share of rows it had that are not here (rows re-partitioned for another number
        of workers), so the learner is as far ahead or behind as it was; level with the rows
        for a checkpoint without the count, or one that counted none (a buffer declared
        without a ratio counts no rows sampled: the built-in sac's before it declared one,
        which would otherwise resume with a burst of updates for every row it holds)."""
        pace, added = self.pace, self.added()
        saved = state.get("sampled")
        if saved is None or (pace is not None and int(saved) == 0):
            return 0 if pace is None else pace.caught_up(added)
        sampled = int(saved)
        if pace is None or state.get("added") is None:
            return sampled
        return max(0, sampled - round(pace.ratio * (int(state["added"]) - added)))


class MemoryCounter(_Bound):
    """:class:`mprl.transport.SharedCounter`: a slot per process, and one for the count of
    earlier sessions; each process writes only its own, so no lock is needed."""

    _shared = ("_counts",)

    def __init__(self, processes: int, share: bool) -> None:
        self._counts = _share(torch.zeros(processes + 1, dtype=torch.int64), share)
        self._local()

    def _local(self) -> None:
        self._np = self._counts.numpy()

    def add(self, n: int = 1) -> None:
        if self._slot < 0:
            raise RuntimeError("a counter is added to by the processes of a run")
        self._np[self._slot] += n

    @property
    def value(self) -> int:
        return int(self._np.sum())

    def load(self, value: int) -> None:
        self._np[:] = 0
        self._np[-1] = int(value)


class MemoryBuilder:
    """Builds a schema's fields for processes that share this machine's memory.

    :param manager: a started ``SyncManager`` (local) or an in-process one (serial); ``None``
        when the schema has no Manager kind.
    :param model: the run's model, which weights are published through.
    :param share: put tensors in shared memory (spawned processes read them).
    :param sleep: waiting calls sleep between looks; ``False`` where the stop check hands the
        turn on instead (serial).
    """

    def __init__(
        self,
        manager: Any,
        model: torch.nn.Module,
        make_model: Callable[..., torch.nn.Module],
        *,
        share: bool,
        sleep: bool,
    ) -> None:
        self.manager, self.model, self.make_model = manager, model, make_model
        self.share, self.sleep = share, sleep

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype, fill: float) -> torch.Tensor:
        return _share(torch.full(shape, fill, dtype=dtype), self.share)

    def rollouts(self, spec: RowSpec, workers: int, slots_per_worker: int) -> MemoryRollouts:
        return MemoryRollouts(spec, workers, slots_per_worker, self.share, self.sleep)

    def weights(self) -> MemoryWeights:
        return MemoryWeights(self.model, self.share, self.sleep)

    def replay(
        self, row: RowSpec, capacity: int, workers: int, pace: ReplayPace | None = None
    ) -> MemoryReplay:
        return MemoryReplay(row, capacity, workers, self.share, self.sleep, pace)

    def counter(self, processes: int) -> MemoryCounter:
        return MemoryCounter(processes, self.share)

    def module(self, make: Callable[..., torch.nn.Module] | None, dims: Dims) -> torch.nn.Module:
        module = (make or self.make_model)(dims.observation_space, dims.action_space, dims.config)
        if make is None:  # a copy of the model: it starts from the same weights
            module.load_state_dict(self.model.state_dict())
        return module.share_memory() if self.share else module
