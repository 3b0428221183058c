"""The shared-state kinds at run time, keyed by kind: how a backend builds a field, what a
checkpoint keeps of it, how that is put back or made to fit another run, what memory it takes.

A plugin declares its fields with :mod:`mprl.schema`, which says only what is declared and
checks it; what each kind is made of is here, on the side of the backends (which build it with
their :class:`Builder`) and the host (which checkpoints, restores and fits it): a handler per
kind (:data:`HANDLERS`), and the schema-wide operations over them (:func:`build`,
:func:`snapshot`, :func:`restore`, :func:`fit`, :func:`memory`, :func:`check_dims`).
"""

from __future__ import annotations

import array
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch

from mprl import schema
from mprl.errors import SchemaError
from mprl.schema import (
    Dims,
    ReplayPace,
    RowSpec,
    SharedState,
    _blame,
    _number,
    resolve,
    transition_row,
)


class Builder(Protocol):
    """What a backend gives :func:`build`: its way of making each kind."""

    manager: Any  # SyncManager-like (list, dict, Lock, ...), None when no field needs one

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype, fill: float) -> Any: ...
    def rollouts(self, spec: RowSpec, workers: int, slots_per_worker: int) -> Any: ...
    def weights(self) -> Any: ...
    def replay(
        self, row: RowSpec, capacity: int, workers: int, pace: ReplayPace | None = None
    ) -> Any: ...
    def counter(self, processes: int) -> Any: ...
    def module(self, make: Callable[..., torch.nn.Module] | None, dims: Dims) -> Any: ...


class _Kind:
    """What one kind is at run time (the base: a kind with no data)."""

    #: lives in a Manager server on the local backend
    manager = False

    def check_dims(self, decl: Any, dims: Dims) -> None:
        """Raise ``ValueError`` when ``decl`` does not fit a run of ``dims``."""

    def build(self, decl: Any, builder: Builder, dims: Dims) -> Any:
        raise NotImplementedError

    def snapshot(self, decl: Any, built: Any) -> Any:
        """Plain data or tensors to checkpoint, or ``None`` for kinds without data."""
        return None

    def restore(self, decl: Any, built: Any, data: Any) -> bool:
        """Put checkpointed ``data`` back; False when it does not fit (another worker count)."""
        return False

    def fit(self, decl: Any, data: Any, dims: Dims) -> tuple[Any, str | None]:
        """Checkpointed ``data`` made to fit a run of ``dims`` (a resume with another worker
        count or config), and what was done to it in words (``None``: it fits as it is); raise
        ``ValueError`` saying why when it cannot be made to fit."""
        return data, None

    def memory(self, decl: Any, dims: Dims) -> tuple[int, int]:
        """(bytes, tensors) the field takes in tensors (``/dev/shm`` on the local backend)."""
        return 0, 0


class _ManagerKind(_Kind):
    """A Manager kind made by calling the Manager's method of the same name."""

    manager = True

    def build(self, decl: schema.Field, builder: Builder, dims: Dims) -> Any:
        return getattr(builder.manager, decl.kind)(*self._args(decl, dims))

    def _args(self, decl: schema.Field, dims: Dims) -> tuple[Any, ...]:
        return ()


class _PerWorker(_Kind):
    manager = True

    def build(self, decl: schema.PerWorker, builder: Builder, dims: Dims) -> Any:
        manager, n = builder.manager, dims.workers
        if decl.initial is list:
            return manager.list([manager.list() for _ in range(n)])
        if decl.initial is dict:
            return manager.list([manager.dict() for _ in range(n)])
        return manager.list([decl.initial] * n)

    def snapshot(self, decl: schema.PerWorker, built: Any) -> Any:
        if decl.initial is list:
            return [list(slot) for slot in built]
        if decl.initial is dict:
            return [dict(slot) for slot in built]
        return list(built)

    def restore(self, decl: schema.PerWorker, built: Any, data: Any) -> bool:
        if len(data) != len(built):
            return False
        if decl.initial in (list, dict):
            for slot, saved in zip(built, data, strict=True):
                if decl.initial is list:
                    slot[:] = saved
                else:
                    slot.clear()
                    slot.update(saved)
            return True
        built[:] = data
        return True

    def fit(self, decl: schema.PerWorker, data: Any, dims: Dims) -> tuple[Any, str | None]:
        initial = [] if decl.initial is list else {} if decl.initial is dict else decl.initial
        return _per_worker(list(data), dims.workers, initial)


class _List(_Kind):
    manager = True

    def build(self, decl: schema.List, builder: Builder, dims: Dims) -> Any:
        return builder.manager.list(list(decl.initial))

    def snapshot(self, decl: schema.List, built: Any) -> Any:
        return list(built)

    def restore(self, decl: schema.List, built: Any, data: Any) -> bool:
        built[:] = data
        return True


class _Dict(_Kind):
    manager = True

    def build(self, decl: schema.Dict, builder: Builder, dims: Dims) -> Any:
        return builder.manager.dict(dict(decl.initial))

    def snapshot(self, decl: schema.Dict, built: Any) -> Any:
        return dict(built)

    def restore(self, decl: schema.Dict, built: Any, data: Any) -> bool:
        built.clear()
        built.update(data)
        return True


class _Namespace(_Kind):
    manager = True

    def build(self, decl: schema.Namespace, builder: Builder, dims: Dims) -> Any:
        return builder.manager.Namespace(**decl.initial)

    def snapshot(self, decl: schema.Namespace, built: Any) -> Any:
        return {k: v for k, v in vars(built._getvalue()).items() if not k.startswith("_")}

    def restore(self, decl: schema.Namespace, built: Any, data: Any) -> bool:
        for key, value in data.items():
            setattr(built, key, value)
        return True


class _Semaphore(_ManagerKind):
    def _args(self, decl: schema.Semaphore, dims: Dims) -> tuple[Any, ...]:
        return (decl.value,)


class _Barrier(_ManagerKind):
    def check_dims(self, decl: schema.Barrier, dims: Dims) -> None:
        resolve(decl.parties, dims)

    def _args(self, decl: schema.Barrier, dims: Dims) -> tuple[Any, ...]:
        return (resolve(decl.parties, dims),)


class _Queue(_ManagerKind):
    def check_dims(self, decl: schema.Queue, dims: Dims) -> None:
        self._args(decl, dims)

    def _args(self, decl: schema.Queue, dims: Dims) -> tuple[Any, ...]:
        if isinstance(decl.maxsize, int):
            return (decl.maxsize,)
        return (resolve(decl.maxsize, dims, minimum=0),)


class _Value(_ManagerKind):
    def _args(self, decl: schema.Value, dims: Dims) -> tuple[Any, ...]:
        return (decl.typecode, decl.initial)

    def snapshot(self, decl: schema.Value, built: Any) -> Any:
        return built.value

    def restore(self, decl: schema.Value, built: Any, data: Any) -> bool:
        built.value = data
        return True


class _Array(_ManagerKind):
    def check_dims(self, decl: schema.Array, dims: Dims) -> None:
        resolve(decl.size, dims)

    def _args(self, decl: schema.Array, dims: Dims) -> tuple[Any, ...]:
        return (decl.typecode, [decl.initial] * resolve(decl.size, dims))

    def snapshot(self, decl: schema.Array, built: Any) -> Any:
        return list(built)

    def restore(self, decl: schema.Array, built: Any, data: Any) -> bool:
        if len(data) != len(built):
            return False
        built[:] = array.array(decl.typecode, data)  # an array slice takes an array only
        return True

    def fit(self, decl: schema.Array, data: Any, dims: Dims) -> tuple[Any, str | None]:
        if decl.size == "workers":  # one value per worker, like a PerWorker field
            return _per_worker(list(data), dims.workers, decl.initial)
        size = resolve(decl.size, dims)
        if len(data) != size:
            raise ValueError(f"{len(data)} values saved, {size} in this run")
        return data, None


class _Tensor(_Kind):
    def _shape(self, decl: schema.Tensor, dims: Dims) -> tuple[int, ...]:
        return tuple(resolve(s, dims) for s in decl.shape)

    def check_dims(self, decl: schema.Tensor, dims: Dims) -> None:
        self._shape(decl, dims)

    def build(self, decl: schema.Tensor, builder: Builder, dims: Dims) -> Any:
        return builder.tensor(self._shape(decl, dims), decl.dtype, decl.fill)

    def snapshot(self, decl: schema.Tensor, built: Any) -> Any:
        return built.clone()

    def restore(self, decl: schema.Tensor, built: Any, data: Any) -> bool:
        if data.shape != built.shape or data.dtype != built.dtype:
            return False
        built.copy_(data)
        return True

    def fit(self, decl: schema.Tensor, data: Any, dims: Dims) -> tuple[Any, str | None]:
        shape = self._shape(decl, dims)
        if tuple(data.shape) != shape or data.dtype != decl.dtype:
            raise ValueError(
                f"shape {tuple(data.shape)} {data.dtype} saved, {shape} {decl.dtype} in this run; "
                "mprl cannot tell what its values mean per rank"
            )
        return data, None

    def memory(self, decl: schema.Tensor, dims: Dims) -> tuple[int, int]:
        return _bytes({"t": (self._shape(decl, dims), decl.dtype)}, 1), 1


class _Rollouts(_Kind):
    def check_dims(self, decl: schema.Rollouts, dims: Dims) -> None:
        reserved = {"version", "source"} & set(_spec(decl.spec, dims))
        if reserved:
            raise ValueError(f"spec fields {sorted(reserved)} are added by mprl; rename yours")
        resolve(decl.slots_per_worker, dims)

    def build(self, decl: schema.Rollouts, builder: Builder, dims: Dims) -> Any:
        slots = resolve(decl.slots_per_worker, dims)
        return builder.rollouts(_spec(decl.spec, dims), dims.workers, slots)

    def memory(self, decl: schema.Rollouts, dims: Dims) -> tuple[int, int]:
        slots = dims.workers * resolve(decl.slots_per_worker, dims)
        spec = _spec(decl.spec, dims)
        return _bytes(spec, slots) + 32 * slots, len(spec) + 4


class _Weights(_Kind):
    def build(self, decl: schema.Weights, builder: Builder, dims: Dims) -> Any:
        return builder.weights()

    def snapshot(self, decl: schema.Weights, built: Any) -> Any:
        return built.state()

    def restore(self, decl: schema.Weights, built: Any, data: Any) -> bool:
        built.load(data)
        return True

    def memory(self, decl: schema.Weights, dims: Dims) -> tuple[int, int]:
        return 8, 1


class _ReplayBuffer(_Kind):
    def _row(self, decl: schema.ReplayBuffer, dims: Dims) -> dict[str, Any]:
        return _spec(transition_row if decl.row is None else decl.row, dims)

    def pace(self, decl: schema.ReplayBuffer, dims: Dims) -> ReplayPace | None:
        """The replay ratio as a run of ``dims`` enforces it; ``None`` when none is declared."""
        if decl.replay_ratio is None:
            return None
        ratio = _number(decl.replay_ratio, dims, "replay_ratio", 0.0, strict=True)
        starts = _number(decl.learning_starts, dims, "learning_starts", 0.0, strict=False)
        lead = None
        if decl.max_lead is not None:
            lead = int(_number(decl.max_lead, dims, "max_lead", 1.0, strict=False))
        return ReplayPace(ratio, int(starts), lead)

    def check_dims(self, decl: schema.ReplayBuffer, dims: Dims) -> None:
        self._row(decl, dims)
        if resolve(decl.capacity, dims) < dims.workers:
            raise ValueError(f"capacity must be at least the number of workers ({dims.workers})")
        self.pace(decl, dims)

    def build(self, decl: schema.ReplayBuffer, builder: Builder, dims: Dims) -> Any:
        row, capacity, pace = (
            self._row(decl, dims),
            resolve(decl.capacity, dims),
            self.pace(decl, dims),
        )
        if pace is None:  # (a builder written before replay ratios takes no pace)
            return builder.replay(row, capacity, dims.workers)
        return builder.replay(row, capacity, dims.workers, pace=pace)

    def snapshot(self, decl: schema.ReplayBuffer, built: Any) -> Any:
        return built.state() if decl.checkpoint else None

    def restore(self, decl: schema.ReplayBuffer, built: Any, data: Any) -> bool:
        return built.load(data)

    def fit(self, decl: schema.ReplayBuffer, data: Any, dims: Dims) -> tuple[Any, str | None]:
        if data is None:
            return data, None
        return _repartition(data, self._row(decl, dims), resolve(decl.capacity, dims), dims.workers)

    def memory(self, decl: schema.ReplayBuffer, dims: Dims) -> tuple[int, int]:
        rows = resolve(decl.capacity, dims)
        row = self._row(decl, dims)
        return _bytes(row, rows) + 8 * rows + 8 * (dims.workers + 3), len(row) + 4


class _Counter(_Kind):
    def build(self, decl: schema.Counter, builder: Builder, dims: Dims) -> Any:
        return builder.counter(dims.workers + 1)

    def snapshot(self, decl: schema.Counter, built: Any) -> Any:
        return built.value

    def restore(self, decl: schema.Counter, built: Any, data: Any) -> bool:
        built.load(int(data))
        return True

    def memory(self, decl: schema.Counter, dims: Dims) -> tuple[int, int]:
        return 8 * (dims.workers + 2), 1


class _Module(_Kind):
    def build(self, decl: schema.Module, builder: Builder, dims: Dims) -> Any:
        return builder.module(decl.make, dims)

    def snapshot(self, decl: schema.Module, built: Any) -> Any:
        return {k: v.clone() for k, v in built.state_dict().items()}

    def restore(self, decl: schema.Module, built: Any, data: Any) -> bool:
        try:
            built.load_state_dict(data)
        except (RuntimeError, KeyError):
            return False
        return True


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


#: the handler of every kind, keyed by its declaration's class
HANDLERS: Mapping[type[schema.Field], _Kind] = {
    schema.PerWorker: _PerWorker(),
    schema.List: _List(),
    schema.Dict: _Dict(),
    schema.Namespace: _Namespace(),
    schema.Lock: _ManagerKind(),
    schema.RLock: _ManagerKind(),
    schema.Semaphore: _Semaphore(),
    schema.BoundedSemaphore: _Semaphore(),
    schema.Condition: _ManagerKind(),
    schema.Event: _ManagerKind(),
    schema.Barrier: _Barrier(),
    schema.Queue: _Queue(),
    schema.Value: _Value(),
    schema.Array: _Array(),
    schema.Tensor: _Tensor(),
    schema.Rollouts: _Rollouts(),
    schema.Weights: _Weights(),
    schema.ReplayBuffer: _ReplayBuffer(),
    schema.Counter: _Counter(),
    schema.Module: _Module(),
}


def of(decl: schema.Field) -> _Kind:
    """The handler of ``decl``'s kind."""
    return HANDLERS[type(decl)]


def pace(decl: schema.ReplayBuffer, dims: Dims) -> ReplayPace | None:
    """The replay ratio ``decl`` declares, as a run of ``dims`` keeps it; ``None`` for none."""
    return _ReplayBuffer().pace(decl, dims)


def needs_manager(fields: schema.Schema) -> bool:
    """Whether building ``fields`` needs a Manager server (any Manager kind)."""
    return any(of(f).manager for f in fields.fields.values())


def check_dims(fields: schema.Schema, dims: Dims) -> None:
    """Raise :class:`SchemaError` naming the field whose sizes do not fit a run of ``dims``."""
    for name, decl in fields.fields.items():
        with _blame(name, decl):
            of(decl).check_dims(decl, dims)


def memory(fields: schema.Schema, dims: Dims) -> tuple[int, int]:
    """(bytes, tensors) the tensor-backed fields take in a run of ``dims``."""
    sizes = [of(decl).memory(decl, dims) for decl in fields.fields.values()]
    return sum(b for b, _ in sizes), sum(n for _, n in sizes)


def build(fields: schema.Schema, builder: Builder, dims: Dims) -> SharedState:
    """Create every field for a run of ``dims`` with a backend's ``builder``."""
    built = {}
    for name, decl in fields.fields.items():
        if of(decl).manager and builder.manager is None:
            raise SchemaError(f"shared-state field {name!r} ({decl.kind}) needs a Manager")
        with _blame(name, decl):
            built[name] = of(decl).build(decl, builder, dims)
    state = SharedState(**built)
    state._workers = dims.workers
    return state


def snapshot(fields: schema.Schema, state: SharedState) -> dict[str, Any]:
    """The data of every field that has data (not locks, events, barriers or queues)."""
    out = {}
    for name, decl in fields.fields.items():
        data = of(decl).snapshot(decl, getattr(state, name))
        if data is not None:
            out[name] = data
    return out


def fit(fields: schema.Schema, saved: Mapping[str, Any], dims: Dims) -> schema.Fitted:
    """A :func:`snapshot` of another run (another worker count, another config) made to fit a
    run of ``dims``, field by field: replay rows re-partitioned across the workers, per-worker
    lists extended or cut; what each field needed, and the fields that cannot be made to fit
    (a ``Tensor`` of another shape), with why."""
    data: dict[str, Any] = {}
    notes: dict[str, str] = {}
    unfit: dict[str, str] = {}
    for name, value in saved.items():
        decl = fields.fields.get(name)
        if decl is None:
            notes[name] = "in the checkpoint but no longer declared: left out"
            continue
        try:
            data[name], note = of(decl).fit(decl, value, dims)
        except (ValueError, TypeError, AttributeError, IndexError) as exc:
            unfit[name] = str(exc)
            continue
        if note is not None:
            notes[name] = note
    return schema.Fitted(data, notes, unfit)


def restore(fields: schema.Schema, state: SharedState, saved: Mapping[str, Any]) -> list[str]:
    """Put a :func:`snapshot` back; the fields that could not be restored (one that does not
    fit this run: see :func:`fit`, or one no longer declared)."""
    skipped = []
    for name, data in saved.items():
        decl = fields.fields.get(name)
        if decl is None or not of(decl).restore(decl, getattr(state, name), data):
            skipped.append(name)
    return skipped
