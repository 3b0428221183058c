"""Shared-state schema: declare what the processes of a run share; the backend builds it.

The hand-written multi-process main creates ``manager.list([True] * n)`` per concept, and
shared-memory buffers for the experience it moves; a plugin declares both instead::

    schema = Schema(
        train_modes=PerWorker(True),      # manager.list([True] * n_workers)
        n_iters=PerWorker(0),
        histories=PerWorker(list),        # one manager list per worker
        lock=Lock(),
        ready=Barrier(parties="all"),     # workers + train process
        returns=Tensor(shape=("workers", 100)),  # a tensor every process reads and writes
        rollouts=Rollouts(rollout_spec, slots_per_worker="config.slots"),  # experience
        weights=Weights(),                # the learner's weights, published to the workers
    )

Three families of kinds, by what they cost:

- **Manager kinds** (``PerWorker`` ... ``Array``) carry small control state: on the local
  backend each access is a round trip to a Manager server process, so keep them off per-step
  hot paths.
- **Tensor** is a tensor every process of the run reads and writes in place (shared memory on
  the local backend): hot paths may use it; nothing locks it.
- **Transport kinds** (``Rollouts``, ``Weights``, ``ReplayBuffer``, ``Counter``, ``Module``)
  move experience and weights; each backend builds them its own way (shared memory, one
  process, an object store) behind the protocols of :mod:`mprl.transport`, so the same plugin
  runs on every backend.

A ``Size`` is an int, ``"workers"`` (the number of workers), ``"all"`` (workers + 1: the train
process too), ``"config.NAME"`` (the config field ``NAME``), or a function of :class:`Dims`.
"""

from __future__ import annotations

import array
import keyword
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, ClassVar, Protocol

import attrs
import gymnasium as gym
import numpy as np
import torch

from mprl.errors import SchemaError

RowSpec = Mapping[str, tuple[tuple[int, ...], torch.dtype]]  # {name: (shape of one row, dtype)}


@attrs.frozen
class Dims:
    """What sizes in a schema may depend on: the run's worker count, the env's spaces and the
    algorithm's config."""

    workers: int
    observation_space: gym.Space
    action_space: gym.Space
    config: Any = None


Size = int | str | Callable[[Dims], int]


def _check_size(size: Size) -> None:
    if callable(size) or size in ("workers", "all"):
        return
    if isinstance(size, str):
        if not (size.startswith("config.") and size[7:].isidentifier()):
            raise ValueError(
                f"size {size!r} must be an int, 'workers', 'all', 'config.FIELD' or a function "
                "of mprl.schema.Dims"
            )
        return
    if isinstance(size, bool) or not isinstance(size, int):
        raise ValueError(f"size {size!r} must be an int, 'workers', 'all' or 'config.FIELD'")
    if size < 1:
        raise ValueError(f"size {size} must be >= 1")


def resolve(size: Size, dims: Dims, minimum: int = 1) -> int:
    """The number ``size`` stands for in a run of ``dims``; ``ValueError`` saying why not (a
    value below ``minimum`` too)."""
    _check_size(size)
    if size == "workers":
        return dims.workers
    if size == "all":
        return dims.workers + 1
    if isinstance(size, str):
        name = size[7:]
        if not hasattr(dims.config, name):
            raise ValueError(f"size {size!r}: the config has no field {name!r}")
        value = getattr(dims.config, name)
    else:
        value = size(dims) if callable(size) else size
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"size {size!r} is {value!r}; it must be an int >= {minimum}")
    return value


def _spec(spec: RowSpec | Callable[[Dims], RowSpec], dims: Dims) -> dict[str, Any]:
    """A row spec, called with ``dims`` when it is a function, and checked."""
    out = dict(spec(dims) if callable(spec) else spec)
    if not out:
        raise ValueError("the spec has no fields")
    for name, entry in out.items():
        ok = isinstance(entry, tuple | list) and len(entry) == 2
        if not (ok and isinstance(entry[1], torch.dtype)):
            raise ValueError(f"spec field {name!r}: {entry!r} is not (shape, torch dtype)")
        if not all(isinstance(n, int) and n >= 1 for n in entry[0]):
            raise ValueError(f"spec field {name!r}: shape {tuple(entry[0])!r} must be ints >= 1")
        out[name] = (tuple(entry[0]), entry[1])
    return out


def _bytes(spec: RowSpec, rows: int) -> int:
    return sum(
        rows * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        for shape, dtype in spec.values()
    )


class Builder(Protocol):
    """What a backend gives :meth:`Field.build`: its way of making each kind."""

    manager: Any  # SyncManager-like (list, dict, Lock, ...), None when no field needs one

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype, fill: float) -> Any: ...
    def rollouts(self, spec: RowSpec, workers: int, slots_per_worker: int) -> Any: ...
    def weights(self) -> Any: ...
    def replay(
        self, row: RowSpec, capacity: int, workers: int, pace: ReplayPace | None = None
    ) -> Any: ...
    def counter(self, processes: int) -> Any: ...
    def module(self, make: Callable[..., torch.nn.Module] | None, dims: Dims) -> Any: ...


@attrs.frozen
class Field:
    """Base of every declaration. ``kind`` names it in messages and docs."""

    kind: ClassVar[str] = "field"
    #: lives in a Manager server on the local backend
    needs_manager: ClassVar[bool] = False

    def check(self) -> None:
        """Raise ``ValueError`` describing what is wrong with this declaration."""

    def check_dims(self, dims: Dims) -> None:
        """Raise ``ValueError`` when the declaration does not fit a run of ``dims``."""

    def build(self, builder: Builder, dims: Dims) -> Any:
        raise NotImplementedError

    def snapshot(self, built: Any) -> Any:
        """Plain data or tensors to checkpoint, or ``None`` for kinds without data."""
        return None

    def restore(self, built: Any, data: Any) -> bool:
        """Put checkpointed ``data`` back; False when it does not fit (another worker count)."""
        return False

    def fit(self, data: Any, dims: Dims) -> tuple[Any, str | None]:
        """Checkpointed ``data`` made to fit a run of ``dims`` (a resume with another worker
        count or config), and what was done to it in words (``None``: it fits as it is); raise
        ``ValueError`` saying why when it cannot be made to fit."""
        return data, None

    def memory(self, dims: Dims) -> tuple[int, int]:
        """(bytes, tensors) the field takes in tensors (``/dev/shm`` on the local backend)."""
        return 0, 0


_SCALARS = (int, float, bool, str, bytes, type(None))


@attrs.frozen
class PerWorker(Field):
    """One slot per worker rank: ``manager.list([initial] * n_workers)``.

    ``initial`` is a scalar (``0``, ``True``, ``None``, ...), or the type ``list`` or ``dict`` for
    one Manager list / dict per worker (per-worker histories).
    """

    kind: ClassVar[str] = "PerWorker"
    needs_manager: ClassVar[bool] = True
    initial: Any = None

    def check(self) -> None:
        if self.initial in (list, dict):
            return
        if not isinstance(self.initial, _SCALARS):
            raise ValueError(
                f"initial value {self.initial!r} must be a scalar (int, float, bool, str, None) "
                "or the type list or dict"
            )

    def build(self, builder: Builder, dims: Dims) -> Any:
        manager, n = builder.manager, dims.workers
        if self.initial is list:
            return manager.list([manager.list() for _ in range(n)])
        if self.initial is dict:
            return manager.list([manager.dict() for _ in range(n)])
        return manager.list([self.initial] * n)

    def snapshot(self, built: Any) -> Any:
        if self.initial is list:
            return [list(slot) for slot in built]
        if self.initial is dict:
            return [dict(slot) for slot in built]
        return list(built)

    def restore(self, built: Any, data: Any) -> bool:
        if len(data) != len(built):
            return False
        if self.initial in (list, dict):
            for slot, saved in zip(built, data, strict=True):
                if self.initial is list:
                    slot[:] = saved
                else:
                    slot.clear()
                    slot.update(saved)
            return True
        built[:] = data
        return True

    def fit(self, data: Any, dims: Dims) -> tuple[Any, str | None]:
        initial = [] if self.initial is list else {} if self.initial is dict else self.initial
        return _per_worker(list(data), dims.workers, initial)


def _ranks(first: int, last: int) -> str:
    return f"rank {first}" if first == last else f"ranks {first}-{last}"


def _per_worker(data: list[Any], n: int, initial: Any) -> tuple[list[Any], str | None]:
    """A per-worker list of another run, cut to ``n`` slots or extended with ``initial``."""
    old = len(data)
    if old == n:
        return data, None
    head = f"{old} slots saved, {n} in this run: {_ranks(0, min(old, n) - 1)} kept"
    if old < n:
        start = "starts" if n - old == 1 else "start"
        return data + [initial] * (n - old), f"{head}, {_ranks(old, n - 1)} {start} at {initial!r}"
    dropped = repr(data[n:])
    shown = f" ({dropped})" if len(dropped) <= 60 else ""
    return data[:n], f"{head}, the slots of {_ranks(n, old - 1)} dropped{shown}"


@attrs.frozen
class List(Field):
    """``manager.list(initial)``."""

    kind: ClassVar[str] = "List"
    needs_manager: ClassVar[bool] = True
    initial: Sequence[Any] = ()

    def check(self) -> None:
        if isinstance(self.initial, str | bytes) or not isinstance(self.initial, Sequence):
            raise ValueError(f"initial value {self.initial!r} must be a list or tuple")

    def build(self, builder: Builder, dims: Dims) -> Any:
        return builder.manager.list(list(self.initial))

    def snapshot(self, built: Any) -> Any:
        return list(built)

    def restore(self, built: Any, data: Any) -> bool:
        built[:] = data
        return True


@attrs.frozen
class Dict(Field):
    """``manager.dict(initial)``."""

    kind: ClassVar[str] = "Dict"
    needs_manager: ClassVar[bool] = True
    initial: Mapping[Any, Any] = attrs.field(factory=dict)

    def check(self) -> None:
        if not isinstance(self.initial, Mapping):
            raise ValueError(f"initial value {self.initial!r} must be a mapping")

    def build(self, builder: Builder, dims: Dims) -> Any:
        return builder.manager.dict(dict(self.initial))

    def snapshot(self, built: Any) -> Any:
        return dict(built)

    def restore(self, built: Any, data: Any) -> bool:
        built.clear()
        built.update(data)
        return True


@attrs.frozen
class Namespace(Field):
    """``manager.Namespace(**initial)``: named scalars such as a global mode flag."""

    kind: ClassVar[str] = "Namespace"
    needs_manager: ClassVar[bool] = True
    initial: Mapping[str, Any] = attrs.field(factory=dict)

    def check(self) -> None:
        if not isinstance(self.initial, Mapping):
            raise ValueError(f"initial value {self.initial!r} must be a mapping of names")
        bad = [k for k in self.initial if not (isinstance(k, str) and k.isidentifier())]
        if bad:
            raise ValueError(f"attribute names {bad!r} are not identifiers")

    def build(self, builder: Builder, dims: Dims) -> Any:
        return builder.manager.Namespace(**self.initial)

    def snapshot(self, built: Any) -> Any:
        return {k: v for k, v in vars(built._getvalue()).items() if not k.startswith("_")}

    def restore(self, built: Any, data: Any) -> bool:
        for key, value in data.items():
            setattr(built, key, value)
        return True


@attrs.frozen
class _Plain(Field):
    """A Manager kind made by calling the Manager's method of the same name."""

    needs_manager: ClassVar[bool] = True

    def build(self, builder: Builder, dims: Dims) -> Any:
        return getattr(builder.manager, self.kind)(*self._args(dims))

    def _args(self, dims: Dims) -> tuple[Any, ...]:
        return ()


@attrs.frozen
class Lock(_Plain):
    """``manager.Lock()``."""

    kind: ClassVar[str] = "Lock"


@attrs.frozen
class RLock(_Plain):
    """``manager.RLock()``."""

    kind: ClassVar[str] = "RLock"


@attrs.frozen
class Semaphore(_Plain):
    """``manager.Semaphore(value)``."""

    kind: ClassVar[str] = "Semaphore"
    value: int = 1

    def check(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 0:
            raise ValueError(f"value {self.value!r} must be an int >= 0")

    def _args(self, dims: Dims) -> tuple[Any, ...]:
        return (self.value,)


@attrs.frozen
class BoundedSemaphore(Semaphore):
    """``manager.BoundedSemaphore(value)``."""

    kind: ClassVar[str] = "BoundedSemaphore"


@attrs.frozen
class Condition(_Plain):
    """``manager.Condition()``."""

    kind: ClassVar[str] = "Condition"


@attrs.frozen
class Event(_Plain):
    """``manager.Event()``."""

    kind: ClassVar[str] = "Event"


@attrs.frozen
class Barrier(_Plain):
    """``manager.Barrier(parties)``; ``parties`` is a ``Size`` (default ``"workers"``)."""

    kind: ClassVar[str] = "Barrier"
    parties: Size = "workers"

    def check(self) -> None:
        _check_size(self.parties)

    def check_dims(self, dims: Dims) -> None:
        resolve(self.parties, dims)

    def _args(self, dims: Dims) -> tuple[Any, ...]:
        return (resolve(self.parties, dims),)


@attrs.frozen
class Queue(_Plain):
    """``manager.Queue(maxsize)``: messages between processes, pickled through the Manager
    (about 0.1-0.2 ms a put or get on the local backend): small control messages, or whole
    episodes where a plugin wants the classic program's shape; per-step data belongs in
    ``Rollouts`` or a ``ReplayBuffer``. ``maxsize`` is an int (``0``: unbounded) or a
    ``Size`` (``"config.queue_size"``, ``"workers"``, a function of :class:`Dims`), whose
    value may be 0 too.

    Items are pickled into the Manager server, a process of its own that unpickles them: an
    item of a class of your own needs that class importable by its module's name there, as
    the worker and train functions are in every process (a module of an installed plugin, or
    of the script that starts the run); a class it cannot import fails the ``put`` with the
    server's ``ModuleNotFoundError``."""

    kind: ClassVar[str] = "Queue"
    maxsize: Size = 0

    def check(self) -> None:
        if isinstance(self.maxsize, int) and not isinstance(self.maxsize, bool):
            if self.maxsize < 0:
                raise ValueError(f"maxsize {self.maxsize!r} must be an int >= 0 (0: unbounded)")
            return
        try:
            _check_size(self.maxsize)
        except ValueError:
            raise ValueError(
                f"maxsize {self.maxsize!r} must be an int >= 0 (0: unbounded), 'workers', "
                "'all', 'config.FIELD' or a function of mprl.schema.Dims"
            ) from None

    def check_dims(self, dims: Dims) -> None:
        self._args(dims)

    def _args(self, dims: Dims) -> tuple[Any, ...]:
        if isinstance(self.maxsize, int):
            return (self.maxsize,)
        return (resolve(self.maxsize, dims, minimum=0),)


def _check_typecode(typecode: str) -> None:
    if typecode not in array.typecodes:
        raise ValueError(f"typecode {typecode!r} is not one of {', '.join(array.typecodes)}")


@attrs.frozen
class Value(_Plain):
    """``manager.Value(typecode, initial)`` (typecodes as in the ``array`` module)."""

    kind: ClassVar[str] = "Value"
    typecode: str = "d"
    initial: Any = 0

    def check(self) -> None:
        _check_typecode(self.typecode)
        array.array(self.typecode, [self.initial])  # raises TypeError for a mismatched value

    def _args(self, dims: Dims) -> tuple[Any, ...]:
        return (self.typecode, self.initial)

    def snapshot(self, built: Any) -> Any:
        return built.value

    def restore(self, built: Any, data: Any) -> bool:
        built.value = data
        return True


@attrs.frozen
class Array(_Plain):
    """``manager.Array(typecode, [initial] * size)``; ``size`` is a ``Size``."""

    kind: ClassVar[str] = "Array"
    typecode: str = "d"
    size: Size = "workers"
    initial: Any = 0

    def check(self) -> None:
        _check_typecode(self.typecode)
        _check_size(self.size)
        array.array(self.typecode, [self.initial])

    def check_dims(self, dims: Dims) -> None:
        resolve(self.size, dims)

    def _args(self, dims: Dims) -> tuple[Any, ...]:
        return (self.typecode, [self.initial] * resolve(self.size, dims))

    def snapshot(self, built: Any) -> Any:
        return list(built)

    def restore(self, built: Any, data: Any) -> bool:
        if len(data) != len(built):
            return False
        built[:] = array.array(self.typecode, data)  # an array slice takes an array only
        return True

    def fit(self, data: Any, dims: Dims) -> tuple[Any, str | None]:
        if self.size == "workers":  # one value per worker, like a PerWorker field
            return _per_worker(list(data), dims.workers, self.initial)
        size = resolve(self.size, dims)
        if len(data) != size:
            raise ValueError(f"{len(data)} values saved, {size} in this run")
        return data, None


@attrs.frozen
class Tensor(Field):
    """A tensor every process reads and writes in place (shared memory on the local backend):
    bulk data, readable on hot paths. ``shape`` entries are ``Size``\\ s. Nothing locks it: add a
    ``Lock`` field where writers must not overlap."""

    kind: ClassVar[str] = "Tensor"
    shape: tuple[Size, ...] = attrs.field(converter=tuple)
    dtype: torch.dtype = torch.float32
    fill: float = 0

    def check(self) -> None:
        if not self.shape:
            raise ValueError("shape must have at least one dimension")
        for size in self.shape:
            _check_size(size)
        if not isinstance(self.dtype, torch.dtype):
            raise ValueError(f"dtype {self.dtype!r} must be a torch.dtype such as torch.float32")

    def _shape(self, dims: Dims) -> tuple[int, ...]:
        return tuple(resolve(s, dims) for s in self.shape)

    def check_dims(self, dims: Dims) -> None:
        self._shape(dims)

    def build(self, builder: Builder, dims: Dims) -> Any:
        return builder.tensor(self._shape(dims), self.dtype, self.fill)

    def snapshot(self, built: Any) -> Any:
        return built.clone()

    def restore(self, built: Any, data: Any) -> bool:
        if data.shape != built.shape or data.dtype != built.dtype:
            return False
        built.copy_(data)
        return True

    def fit(self, data: Any, dims: Dims) -> tuple[Any, str | None]:
        shape = self._shape(dims)
        if tuple(data.shape) != shape or data.dtype != self.dtype:
            raise ValueError(
                f"shape {tuple(data.shape)} {data.dtype} saved, {shape} {self.dtype} in this run; "
                "mprl cannot tell what its values mean per rank"
            )
        return data, None

    def memory(self, dims: Dims) -> tuple[int, int]:
        return _bytes({"t": (self._shape(dims), self.dtype)}, 1), 1


@attrs.frozen
class Rollouts(Field):
    """Rollout slots (:class:`mprl.transport.RolloutSlots`): each worker fills its slots in
    place and commits them, the learner takes batches. ``spec`` is ``{name: (shape, dtype)}`` of
    one rollout, or a function of :class:`Dims` returning it (sizes from the spaces and the
    config); ``slots_per_worker`` is a ``Size``: more keep a worker busy while the learner is,
    and make the rollouts the learner reads older. Not checkpointed: rollouts in flight are
    collected again after a resume."""

    kind: ClassVar[str] = "Rollouts"
    spec: RowSpec | Callable[[Dims], RowSpec]
    slots_per_worker: Size = 2

    def check(self) -> None:
        _check_size(self.slots_per_worker)
        if not (callable(self.spec) or isinstance(self.spec, Mapping)):
            raise ValueError(f"spec {self.spec!r} must be a mapping or a function of Dims")

    def check_dims(self, dims: Dims) -> None:
        reserved = {"version", "source"} & set(_spec(self.spec, dims))
        if reserved:
            raise ValueError(f"spec fields {sorted(reserved)} are added by mprl; rename yours")
        resolve(self.slots_per_worker, dims)

    def build(self, builder: Builder, dims: Dims) -> Any:
        slots = resolve(self.slots_per_worker, dims)
        return builder.rollouts(_spec(self.spec, dims), dims.workers, slots)

    def memory(self, dims: Dims) -> tuple[int, int]:
        slots = dims.workers * resolve(self.slots_per_worker, dims)
        spec = _spec(self.spec, dims)
        return _bytes(spec, slots) + 32 * slots, len(spec) + 4


@attrs.frozen
class Weights(Field):
    """The learner's weights published to the workers (:class:`mprl.transport.WeightBroadcast`):
    ``with weights.publishing(model): optimizer.step()`` in the learner, ``weights.pull(local)``
    in a worker. Its version is checkpointed."""

    kind: ClassVar[str] = "Weights"

    def build(self, builder: Builder, dims: Dims) -> Any:
        return builder.weights()

    def snapshot(self, built: Any) -> Any:
        return built.state()

    def restore(self, built: Any, data: Any) -> bool:
        built.load(data)
        return True

    def memory(self, dims: Dims) -> tuple[int, int]:
        return 8, 1


def obs_dtype(space: gym.Space) -> torch.dtype:
    """How observations of ``space`` are stored and sent: ``uint8`` when the space is (frames:
    a quarter of float32, converted where the network runs), else ``float32``."""
    return torch.uint8 if space.dtype == np.uint8 else torch.float32


def transition_row(dims: Dims) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The default row of a :class:`ReplayBuffer`: ``obs``, ``action``, ``reward``,
    ``next_obs`` and ``done`` (1.0 where the episode terminated), shaped by the spaces.
    Observations keep the space's dtype when it is ``uint8`` (frames), else ``float32``;
    ``Discrete`` actions are ``int64`` scalars."""
    obs, act = dims.observation_space, dims.action_space
    discrete = isinstance(act, gym.spaces.Discrete)
    return {
        "obs": (tuple(obs.shape), obs_dtype(obs)),
        "action": ((), torch.int64) if discrete else (tuple(act.shape), torch.float32),
        "reward": ((), torch.float32),
        "next_obs": (tuple(obs.shape), obs_dtype(obs)),
        "done": ((), torch.float32),
    }


def _replay_rows(heads: torch.Tensor, per: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The places of a replay state's rows, newest first, and their ages: worker ``w`` keeps
    its ring's rows at ``[w * per, (w + 1) * per)``, the ``heads[w]``-th row it added at
    ``w * per + (heads[w] - 1) % per``. mprl keeps no time per row, so a row's age is the number
    of rows its worker added after it, and the workers' rows are taken in turn: each worker's
    newest (by rank), then each one's second newest, ..."""
    workers = len(heads)
    sizes = torch.clamp(heads, max=per)
    age = torch.arange(per).repeat(workers)
    rank = torch.arange(workers).repeat_interleave(per)
    held = age < sizes[rank]
    age, rank = age[held], rank[held]
    order = torch.from_numpy(np.lexsort((rank.numpy(), age.numpy())))
    age, rank = age[order], rank[order]
    return rank * per + (heads[rank] - 1 - age) % per, age


def _repartition(
    data: Mapping[str, Any], row: Mapping[str, Any], capacity: int, workers: int
) -> tuple[dict[str, Any], str | None]:
    """A replay state (``heads``: rows each worker added; a tensor of rows per field) saved
    by a run with other workers or another capacity, laid out for this one: the newest rows
    that fit, dealt to the new workers in turn, oldest first, so that each ring's next row
    overwrites its oldest one; ``heads`` then counts the rows each new ring holds."""
    missing = sorted(set(row) - set(data))
    if "heads" not in data or missing:
        raise ValueError(
            f"the saved buffer has no {missing or ['heads']}; its fields: {sorted(data)}"
        )
    heads = torch.as_tensor(data["heads"], dtype=torch.int64)
    for name, (shape, dtype) in row.items():
        saved = data[name]
        if tuple(saved.shape[1:]) != shape or saved.dtype != dtype:
            raise ValueError(
                f"its rows' {name!r} are {tuple(saved.shape[1:])} {saved.dtype} saved, "
                f"{shape} {dtype} in this run"
            )
    old_workers = len(heads)
    old_per = len(data[next(iter(row))]) // max(old_workers, 1)
    per = capacity // workers
    if old_workers == workers and old_per == per:
        return dict(data), None
    places, age = _replay_rows(heads, old_per)
    kept = places[: workers * per]  # the newest that fit; then oldest first (stable: by rank)
    kept = kept[torch.sort(age[: workers * per], descending=True, stable=True).indices]
    at = torch.arange(len(kept))
    into = (at % workers) * per + at // workers
    out: dict[str, Any] = dict(data)
    for name, (shape, dtype) in row.items():
        rows = torch.zeros((workers * per, *shape), dtype=dtype)
        rows[into] = data[name][kept]
        out[name] = rows
    out["heads"] = torch.bincount(at % workers, minlength=workers).to(torch.int64)
    note = (
        f"{len(kept):,} rows re-partitioned from {old_workers} workers ({old_per:,} rows "
        f"each) to {workers} ({per:,} rows each)"
    )
    if len(places) > len(kept):
        note += f"; the {len(places) - len(kept):,} oldest did not fit and were dropped"
    return out, note


@attrs.frozen
class ReplayPace:
    """A declared replay ratio, as the backends enforce it (:class:`ReplayBuffer`'s
    ``replay_ratio``, ``learning_starts`` and ``max_lead``, resolved for a run).

    ``ratio`` rows are sampled per row added once ``starts`` rows were added: the learner's
    :meth:`credit` is the rows it may still sample. A ``sample(n)`` waits while the credit is
    below ``n`` (:meth:`learner_waits`). Workers are bounded too, unless ``lead`` is ``None``:
    a worker's ``add`` starts waiting once the rows added are ``lead`` rows ahead of what the
    learner consumed at the ratio (beyond the batch it waits for) and goes on once they are
    ``lead / 2`` ahead (:meth:`worker_waits`, :meth:`worker_resumes`): a learner that waits for
    rows always lets the workers go on, so the two never wait for each other.
    """

    ratio: float
    starts: int = 0
    lead: int | None = None

    def credit(self, added: int, sampled: int) -> float:
        """Rows the learner may sample now: ``ratio * (added - starts) - sampled``."""
        return self.ratio * (added - self.starts) - sampled

    def learner_waits(self, added: int, sampled: int, want: int) -> bool:
        """Whether a ``sample(want)`` must wait for more rows."""
        return added < max(self.starts, 1) or self.credit(added, sampled) < want

    def worker_waits(self, added: int, sampled: int, want: int) -> bool:
        """Whether a worker's ``add`` must wait for the learner (``want``: the rows of the
        batch the learner samples, 0 before its first)."""
        return self.lead is not None and (
            self.credit(added, sampled) >= want + self.ratio * self.lead
        )

    def worker_resumes(self, added: int, sampled: int, want: int) -> bool:
        """Whether a worker waiting in ``add`` goes on: half its lead left, or a learner
        waiting for rows."""
        return self.lead is None or self.credit(added, sampled) < want + self.ratio * self.lead / 2

    def caught_up(self, added: int) -> int:
        """The rows sampled of a learner level with ``added`` rows (a checkpoint without the
        count: no burst of updates after a resume)."""
        return max(0, int(self.ratio * (added - self.starts)))


Number = float | str | Callable[[Dims], float]


def _number(value: Number, dims: Dims | None, what: str, low: float, strict: bool) -> float:
    """``value`` (a number, ``"config.NAME"`` or a function of :class:`Dims`) checked against
    ``low``; without ``dims``, only what can be checked before a run."""
    if isinstance(value, str):
        if not (value.startswith("config.") and value[7:].isidentifier()):
            raise ValueError(f"{what} {value!r} must be a number, 'config.FIELD' or a function")
        if dims is None:
            return low
        if not hasattr(dims.config, value[7:]):
            raise ValueError(f"{what} {value!r}: the config has no field {value[7:]!r}")
        value = getattr(dims.config, value[7:])
    elif callable(value):
        if dims is None:
            return low
        value = value(dims)
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or (strict and value == low):
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise ValueError(f"{what} is {value!r}; it must be a number {bound}")
    return float(value)


@attrs.frozen
class ReplayBuffer(Field):
    """A replay buffer of ``capacity`` rows (:class:`mprl.transport.ReplayStore`), split evenly
    between the workers. ``row`` is ``{name: (shape, dtype)}`` of one row (or a function of
    :class:`Dims`); by default :func:`transition_row`. ``checkpoint=False`` keeps its rows out of
    checkpoints (a resumed run starts with it empty).

    ``replay_ratio`` declares the training intensity, enforced on every backend: rows sampled
    per row added (RLlib's ``training_intensity``; SB3's
    ``gradient_steps * batch_size / train_freq``), counted from ``learning_starts`` rows on.
    The learner's ``sample(n)`` then waits (stop-aware) until the rows added allow ``n`` more,
    and returns ``None`` once the run stops; a worker's ``add`` waits once the workers are
    ``max_lead`` rows ahead of the learner (until they are half that; ``max_lead=None``:
    workers never wait, the ratio bounds the learner alone). Each may be a number,
    ``"config.NAME"`` or a function of :class:`Dims`. The counts are checkpointed with the
    rows. See :class:`ReplayPace`."""

    kind: ClassVar[str] = "ReplayBuffer"
    capacity: Size
    row: RowSpec | Callable[[Dims], RowSpec] | None = None
    checkpoint: bool = True
    replay_ratio: Number | None = None
    learning_starts: Number = 0
    max_lead: Number | None = 1000

    def check(self) -> None:
        _check_size(self.capacity)
        if not (self.row is None or callable(self.row) or isinstance(self.row, Mapping)):
            raise ValueError(f"row {self.row!r} must be a mapping or a function of Dims")
        if self.replay_ratio is not None:
            _number(self.replay_ratio, None, "replay_ratio", 0.0, strict=True)
        _number(self.learning_starts, None, "learning_starts", 0.0, strict=False)
        if self.max_lead is not None:
            _number(self.max_lead, None, "max_lead", 1.0, strict=False)

    def _row(self, dims: Dims) -> dict[str, Any]:
        return _spec(transition_row if self.row is None else self.row, dims)

    def pace(self, dims: Dims) -> ReplayPace | None:
        """The replay ratio as a run of ``dims`` enforces it; ``None`` when none is declared."""
        if self.replay_ratio is None:
            return None
        ratio = _number(self.replay_ratio, dims, "replay_ratio", 0.0, strict=True)
        starts = _number(self.learning_starts, dims, "learning_starts", 0.0, strict=False)
        lead = None
        if self.max_lead is not None:
            lead = int(_number(self.max_lead, dims, "max_lead", 1.0, strict=False))
        return ReplayPace(ratio, int(starts), lead)

    def check_dims(self, dims: Dims) -> None:
        self._row(dims)
        if resolve(self.capacity, dims) < dims.workers:
            raise ValueError(f"capacity must be at least the number of workers ({dims.workers})")
        self.pace(dims)

    def build(self, builder: Builder, dims: Dims) -> Any:
        row, capacity, pace = self._row(dims), resolve(self.capacity, dims), self.pace(dims)
        if pace is None:  # (a builder written before replay ratios takes no pace)
            return builder.replay(row, capacity, dims.workers)
        return builder.replay(row, capacity, dims.workers, pace=pace)

    def snapshot(self, built: Any) -> Any:
        return built.state() if self.checkpoint else None

    def restore(self, built: Any, data: Any) -> bool:
        return built.load(data)

    def fit(self, data: Any, dims: Dims) -> tuple[Any, str | None]:
        if data is None:
            return data, None
        return _repartition(data, self._row(dims), resolve(self.capacity, dims), dims.workers)

    def memory(self, dims: Dims) -> tuple[int, int]:
        rows = resolve(self.capacity, dims)
        row = self._row(dims)
        return _bytes(row, rows) + 8 * rows + 8 * (dims.workers + 3), len(row) + 4


@attrs.frozen
class Counter(Field):
    """An integer every process adds to with no Manager and no lock
    (:class:`mprl.transport.SharedCounter`): ``ctx.state.NAME.add(n)``, ``ctx.state.NAME.value``.
    Checkpointed."""

    kind: ClassVar[str] = "Counter"

    def build(self, builder: Builder, dims: Dims) -> Any:
        return builder.counter(dims.workers + 1)

    def snapshot(self, built: Any) -> Any:
        return built.value

    def restore(self, built: Any, data: Any) -> bool:
        built.load(int(data))
        return True

    def memory(self, dims: Dims) -> tuple[int, int]:
        return 8 * (dims.workers + 2), 1


@attrs.frozen
class Module(Field):
    """A torch module in the run's shared state, checkpointed and restored with the model: a
    learner's target network, a running normaliser. ``make(observation_space, action_space,
    config)`` builds it; by default it is a copy of the run's model (the algorithm's
    ``make_model``, starting from the model's weights). Update it in place
    (``target.load_state_dict(model.state_dict())``).

    It lives on the CPU, whatever ``--device``: in shared memory on the local backend (one
    module every process reads and writes), in the one process on the serial backend, and on
    Ray in the train process (the driver's copy follows it for checkpoints; a worker's copy is
    its own, made at the start, and does not). On a GPU the train process's ``ctx.model`` and
    optimizers are copies there, but not its modules: keep a copy on ``ctx.device``
    (``copy.deepcopy(ctx.state.target).to(ctx.device)``), and load it back into the field
    (``ctx.state.target.load_state_dict(mine.state_dict())``) when it changes, so checkpoints
    hold it (the built-in ``sac`` does)."""

    kind: ClassVar[str] = "Module"
    make: Callable[..., torch.nn.Module] | None = None

    def check(self) -> None:
        if self.make is not None and not callable(self.make):
            raise ValueError(f"make {self.make!r} must be a function")

    def build(self, builder: Builder, dims: Dims) -> Any:
        return builder.module(self.make, dims)

    def snapshot(self, built: Any) -> Any:
        return {k: v.clone() for k, v in built.state_dict().items()}

    def restore(self, built: Any, data: Any) -> bool:
        try:
            built.load_state_dict(data)
        except (RuntimeError, KeyError):
            return False
        return True


KINDS: tuple[type[Field], ...] = (
    PerWorker, List, Dict, Namespace, Lock, RLock, Semaphore, BoundedSemaphore, Condition, Event,
    Barrier, Queue, Value, Array, Tensor, Rollouts, Weights, ReplayBuffer, Counter, Module,
)  # fmt: skip


@contextmanager
def _blame(name: str, decl: Field) -> Iterator[None]:
    """Turn a ``ValueError`` / ``TypeError`` about ``decl`` into a SchemaError naming it."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        raise SchemaError(f"shared-state field {name!r} ({decl.kind}): {exc}") from None


def _never() -> bool:
    return False


def _rebuilt(fields: dict[str, Any], workers: int | None) -> SharedState:
    """A :class:`SharedState` unpickled: its fields, and the worker count it was built for."""
    state = SharedState(**fields)
    state._workers = workers
    return state


class SharedState(SimpleNamespace):
    """The built shared state: one attribute per schema field.

    Picklable: it travels to spawned children, where Manager proxies reconnect and tensors map
    the same shared memory. :meth:`bound` gives a process its own view of the transport fields.
    """

    __slots__ = ("_workers",)  # the run's worker count (Schema.build), not a field

    def bound(self, slot: int | str, stop: Callable[[], bool] = _never) -> SharedState:
        """The state as one process uses it: transport fields bound to its ``slot`` and its
        ``stop`` check (their waits end once ``stop()`` is true; default: never), the rest as
        they are. A worker's slot is its rank (``0 .. workers - 1``); the train process's is
        :attr:`trainer_slot`, the number of workers (``"trainer"`` says it too). This is what
        ``ctx.state`` is: a test holding the unbound state (``mprl.testing.build_state``) acts
        as a process through it: ``state.bound(0).replay.add(...)``, ``state.bound("trainer")
        .replay.sample(32)``."""
        if slot == "trainer":
            slot = self.trainer_slot
        if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
            raise ValueError(f"slot {slot!r}: a worker's rank, or 'trainer'")
        bound = SharedState(
            **{
                name: value.bind(slot, stop) if hasattr(value, "bind") else value
                for name, value in vars(self).items()
            }
        )
        bound._workers = getattr(self, "_workers", None)
        return bound

    @property
    def trainer_slot(self) -> int:
        """The train process's slot (:meth:`bound`): the number of workers the state was built
        for; workers are slots ``0 .. trainer_slot - 1``."""
        workers = getattr(self, "_workers", None)
        if workers is None:
            raise ValueError(
                "this state was not built by Schema.build: its worker count is unknown"
            )
        return int(workers)

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (dict(vars(self)), getattr(self, "_workers", None))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        declared = ", ".join(sorted(vars(self))) or "none"
        raise AttributeError(
            f"the shared state has no field {name!r}; the algorithm's schema declares: {declared}"
        )


@attrs.frozen
class Fitted:
    """A checkpoint's shared state made to fit a run (:meth:`Schema.fit`)."""

    #: the data to restore, by field: what fits, as it is or re-partitioned
    data: dict[str, Any]
    #: by field, what was done to fit it (or why it was left out), in words
    notes: dict[str, str]
    #: by field, why it cannot be made to fit; its data is not in :attr:`data`
    unfit: dict[str, str]


class Schema:
    """A plugin's shared-state declaration: ``Schema(name=Field(...), ...)``.

    Checked when created: every value must be a field declaration of a known kind with valid
    arguments; the error names the field. What depends on the run (sizes from the config and the
    spaces) is checked before anything starts.
    """

    def __init__(self, **fields: Field) -> None:
        for name, decl in fields.items():
            if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
                raise SchemaError(
                    f"shared-state field {name!r}: not a valid name; use a Python identifier "
                    "that does not start with '_'"
                )
            if name in ("bound", "trainer_slot"):
                raise SchemaError(
                    f"shared-state field {name!r}: the name of a SharedState member; rename it"
                )
            if not isinstance(decl, KINDS):
                kinds = ", ".join(k.__name__ for k in KINDS)
                what = (
                    f"{type(decl).__name__} is not a kind mprl knows how to build, share and "
                    "checkpoint"
                    if isinstance(decl, Field)
                    else f"{decl!r} is not a field declaration"
                )
                raise SchemaError(
                    f"shared-state field {name!r}: {what}; use one of "
                    f"mprl.schema.{{{kinds}}}, e.g. {name}=PerWorker(0)"
                )
            with _blame(name, decl):
                decl.check()
        self.fields: dict[str, Field] = dict(fields)

    def needs_manager(self) -> bool:
        """Whether building this schema needs a Manager server (any Manager kind)."""
        return any(f.needs_manager for f in self.fields.values())

    def check_dims(self, dims: Dims) -> None:
        """Raise :class:`SchemaError` naming the field whose sizes do not fit a run of ``dims``."""
        for name, decl in self.fields.items():
            with _blame(name, decl):
                decl.check_dims(dims)

    def memory(self, dims: Dims) -> tuple[int, int]:
        """(bytes, tensors) the schema's tensor-backed fields take in a run of ``dims``."""
        sizes = [decl.memory(dims) for decl in self.fields.values()]
        return sum(b for b, _ in sizes), sum(n for _, n in sizes)

    def build(self, builder: Builder, dims: Dims) -> SharedState:
        """Create every field for a run of ``dims`` with a backend's ``builder``."""
        built = {}
        for name, decl in self.fields.items():
            if decl.needs_manager and builder.manager is None:
                raise SchemaError(f"shared-state field {name!r} ({decl.kind}) needs a Manager")
            with _blame(name, decl):
                built[name] = decl.build(builder, dims)
        state = SharedState(**built)
        state._workers = dims.workers
        return state

    def snapshot(self, state: SharedState) -> dict[str, Any]:
        """The data of every field that has data (not locks, events, barriers or queues)."""
        out = {}
        for name, decl in self.fields.items():
            data = decl.snapshot(getattr(state, name))
            if data is not None:
                out[name] = data
        return out

    def fit(self, snapshot: Mapping[str, Any], dims: Dims) -> Fitted:
        """A :meth:`snapshot` of another run (another worker count, another config) made to
        fit a run of ``dims``, field by field (:meth:`Field.fit`): replay rows re-partitioned
        across the workers, per-worker lists extended or cut; what each field needed, and the
        fields that cannot be made to fit (a ``Tensor`` of another shape), with why."""
        data: dict[str, Any] = {}
        notes: dict[str, str] = {}
        unfit: dict[str, str] = {}
        for name, saved in snapshot.items():
            decl = self.fields.get(name)
            if decl is None:
                notes[name] = "in the checkpoint but no longer declared: left out"
                continue
            try:
                data[name], note = decl.fit(saved, dims)
            except (ValueError, TypeError, AttributeError, IndexError) as exc:
                unfit[name] = str(exc)
                continue
            if note is not None:
                notes[name] = note
        return Fitted(data, notes, unfit)

    def restore(self, state: SharedState, snapshot: Mapping[str, Any]) -> list[str]:
        """Put a :meth:`snapshot` back; returns the fields that could not be restored (a field
        that does not fit this run: see :meth:`fit`, or a field no longer declared)."""
        skipped = []
        for name, data in snapshot.items():
            decl = self.fields.get(name)
            if decl is None or not decl.restore(getattr(state, name), data):
                skipped.append(name)
        return skipped

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.fields.items())
        return f"Schema({inner})"
