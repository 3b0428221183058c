"""Shared-state schema: declare what the processes of a run share, the core builds it.

The hand-written multi-process main creates ``manager.list([True] * n)`` per concept; a plugin
declares the same with attrs-based fields instead::

    schema = Schema(
        train_modes=PerWorker(True),      # manager.list([True] * n_workers)
        n_iters=PerWorker(0),
        histories=PerWorker(list),        # one manager list per worker
        lock=Lock(),
        ready=Barrier(parties="all"),     # workers + train process
        returns=Tensor(shape=("workers", 100)),  # shared-memory tensor, no Manager
    )

Manager objects carry small control state; each access is a round trip to the Manager server, so
keep them off per-step hot paths. Bulk data belongs in :class:`Tensor` fields (shared memory).
``"workers"`` in a size is replaced by the number of workers, ``"all"`` by workers + 1 (the
train process).
"""

from __future__ import annotations

import array
import keyword
from collections.abc import Mapping, Sequence
from multiprocessing.managers import SyncManager
from types import SimpleNamespace
from typing import Any, ClassVar

import attrs
import torch

from mprl.errors import SchemaError

Size = int | str  # an int, "workers" or "all"


def _resolve(size: Size, n_workers: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int | str):
        raise ValueError(f"size {size!r} must be an int, 'workers' or 'all'")
    if size == "workers":
        return n_workers
    if size == "all":
        return n_workers + 1
    if isinstance(size, str):
        raise ValueError(f"size {size!r} must be an int, 'workers' or 'all'")
    if size < 1:
        raise ValueError(f"size {size} must be >= 1")
    return size


@attrs.frozen
class Field:
    """Base of every declaration. ``kind`` names it in messages and docs."""

    kind: ClassVar[str] = "field"

    def check(self) -> None:
        """Raise ``ValueError`` describing what is wrong with this declaration."""

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        raise NotImplementedError

    def snapshot(self, built: Any) -> Any:
        """Plain data to checkpoint, or ``None`` for kinds without data (locks, queues...)."""
        return None

    def restore(self, built: Any, data: Any) -> bool:
        """Put checkpointed ``data`` back; False when it does not fit (another worker count)."""
        return False

    def shm_bytes(self, n_workers: int) -> int:
        """Bytes of shared memory (``/dev/shm``) this field takes."""
        return 0


_SCALARS = (int, float, bool, str, bytes, type(None))


@attrs.frozen
class PerWorker(Field):
    """One slot per worker rank: ``manager.list([initial] * n_workers)``.

    ``initial`` is a scalar (``0``, ``True``, ``None``, ...), or the type ``list`` or ``dict`` for
    one Manager list / dict per worker (per-worker histories).
    """

    kind: ClassVar[str] = "PerWorker"
    initial: Any = None

    def check(self) -> None:
        if self.initial in (list, dict):
            return
        if not isinstance(self.initial, _SCALARS):
            raise ValueError(
                f"initial value {self.initial!r} must be a scalar (int, float, bool, str, None) "
                "or the type list or dict"
            )

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        if self.initial is list:
            return manager.list([manager.list() for _ in range(n_workers)])
        if self.initial is dict:
            return manager.list([manager.dict() for _ in range(n_workers)])
        return manager.list([self.initial] * n_workers)

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


@attrs.frozen
class List(Field):
    """``manager.list(initial)``."""

    kind: ClassVar[str] = "List"
    initial: Sequence[Any] = ()

    def check(self) -> None:
        if isinstance(self.initial, str | bytes) or not isinstance(self.initial, Sequence):
            raise ValueError(f"initial value {self.initial!r} must be a list or tuple")

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.list(list(self.initial))

    def snapshot(self, built: Any) -> Any:
        return list(built)

    def restore(self, built: Any, data: Any) -> bool:
        built[:] = data
        return True


@attrs.frozen
class Dict(Field):
    """``manager.dict(initial)``."""

    kind: ClassVar[str] = "Dict"
    initial: Mapping[Any, Any] = attrs.field(factory=dict)

    def check(self) -> None:
        if not isinstance(self.initial, Mapping):
            raise ValueError(f"initial value {self.initial!r} must be a mapping")

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.dict(dict(self.initial))

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
    initial: Mapping[str, Any] = attrs.field(factory=dict)

    def check(self) -> None:
        if not isinstance(self.initial, Mapping):
            raise ValueError(f"initial value {self.initial!r} must be a mapping of names")
        bad = [k for k in self.initial if not (isinstance(k, str) and k.isidentifier())]
        if bad:
            raise ValueError(f"attribute names {bad!r} are not identifiers")

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.Namespace(**self.initial)

    def snapshot(self, built: Any) -> Any:
        return {k: v for k, v in vars(built._getvalue()).items() if not k.startswith("_")}

    def restore(self, built: Any, data: Any) -> bool:
        for key, value in data.items():
            setattr(built, key, value)
        return True


@attrs.frozen
class Lock(Field):
    """``manager.Lock()``."""

    kind: ClassVar[str] = "Lock"

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.Lock()


@attrs.frozen
class RLock(Field):
    """``manager.RLock()``."""

    kind: ClassVar[str] = "RLock"

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.RLock()


@attrs.frozen
class Semaphore(Field):
    """``manager.Semaphore(value)``."""

    kind: ClassVar[str] = "Semaphore"
    value: int = 1

    def check(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 0:
            raise ValueError(f"value {self.value!r} must be an int >= 0")

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.Semaphore(self.value)


@attrs.frozen
class BoundedSemaphore(Semaphore):
    """``manager.BoundedSemaphore(value)``."""

    kind: ClassVar[str] = "BoundedSemaphore"

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.BoundedSemaphore(self.value)


@attrs.frozen
class Condition(Field):
    """``manager.Condition()``."""

    kind: ClassVar[str] = "Condition"

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.Condition()


@attrs.frozen
class Event(Field):
    """``manager.Event()``."""

    kind: ClassVar[str] = "Event"

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.Event()


@attrs.frozen
class Barrier(Field):
    """``manager.Barrier(parties)``; ``parties`` is an int, ``"workers"`` or ``"all"``."""

    kind: ClassVar[str] = "Barrier"
    parties: Size = "workers"

    def check(self) -> None:
        _resolve(self.parties, 1)

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.Barrier(_resolve(self.parties, n_workers))


@attrs.frozen
class Queue(Field):
    """``manager.Queue(maxsize)``: small control messages, never trajectories."""

    kind: ClassVar[str] = "Queue"
    maxsize: int = 0

    def check(self) -> None:
        if isinstance(self.maxsize, bool) or not isinstance(self.maxsize, int) or self.maxsize < 0:
            raise ValueError(f"maxsize {self.maxsize!r} must be an int >= 0 (0: unbounded)")

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.Queue(self.maxsize)


def _check_typecode(typecode: str) -> None:
    if typecode not in array.typecodes:
        raise ValueError(f"typecode {typecode!r} is not one of {', '.join(array.typecodes)}")


@attrs.frozen
class Value(Field):
    """``manager.Value(typecode, initial)`` (typecodes as in the ``array`` module)."""

    kind: ClassVar[str] = "Value"
    typecode: str = "d"
    initial: Any = 0

    def check(self) -> None:
        _check_typecode(self.typecode)
        array.array(self.typecode, [self.initial])  # raises TypeError for a mismatched value

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.Value(self.typecode, self.initial)

    def snapshot(self, built: Any) -> Any:
        return built.value

    def restore(self, built: Any, data: Any) -> bool:
        built.value = data
        return True


@attrs.frozen
class Array(Field):
    """``manager.Array(typecode, [initial] * size)``; size: an int, ``"workers"`` or ``"all"``."""

    kind: ClassVar[str] = "Array"
    typecode: str = "d"
    size: Size = "workers"
    initial: Any = 0

    def check(self) -> None:
        _check_typecode(self.typecode)
        _resolve(self.size, 1)
        array.array(self.typecode, [self.initial])

    def build(self, manager: SyncManager, n_workers: int) -> Any:
        return manager.Array(self.typecode, [self.initial] * _resolve(self.size, n_workers))

    def snapshot(self, built: Any) -> Any:
        return list(built)

    def restore(self, built: Any, data: Any) -> bool:
        if len(data) != len(built):
            return False
        built[:] = array.array(self.typecode, data)  # an array slice takes an array only
        return True


@attrs.frozen
class Tensor(Field):
    """A tensor in shared memory (no Manager): bulk data, readable on hot paths.

    ``shape`` entries are ints, ``"workers"`` or ``"all"``.
    """

    kind: ClassVar[str] = "Tensor"
    shape: tuple[Size, ...] = attrs.field(converter=tuple)
    dtype: torch.dtype = torch.float32
    fill: float = 0

    def check(self) -> None:
        if not self.shape:
            raise ValueError("shape must have at least one dimension")
        for size in self.shape:
            _resolve(size, 1)
        if not isinstance(self.dtype, torch.dtype):
            raise ValueError(f"dtype {self.dtype!r} must be a torch.dtype such as torch.float32")

    def build(self, manager: SyncManager | None, n_workers: int) -> torch.Tensor:
        shape = tuple(_resolve(s, n_workers) for s in self.shape)
        return torch.full(shape, self.fill, dtype=self.dtype).share_memory_()

    def snapshot(self, built: Any) -> Any:
        return built.clone()

    def restore(self, built: Any, data: Any) -> bool:
        if data.shape != built.shape or data.dtype != built.dtype:
            return False
        built.copy_(data)
        return True

    def shm_bytes(self, n_workers: int) -> int:
        numel = 1
        for size in self.shape:
            numel *= _resolve(size, n_workers)
        return numel * torch.empty((), dtype=self.dtype).element_size()


KINDS: tuple[type[Field], ...] = (
    PerWorker, List, Dict, Namespace, Lock, RLock, Semaphore, BoundedSemaphore, Condition, Event,
    Barrier, Queue, Value, Array, Tensor,
)  # fmt: skip


class SharedState(SimpleNamespace):
    """The built shared state: one attribute per schema field (Manager proxies and tensors).

    Picklable: it travels to spawned children, where proxies reconnect to the same Manager.
    """


class Schema:
    """A plugin's shared-state declaration: ``Schema(name=Field(...), ...)``.

    Checked when created: every value must be a field declaration of a known kind with valid
    arguments; the error names the field.
    """

    def __init__(self, **fields: Field) -> None:
        for name, decl in fields.items():
            if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
                raise SchemaError(
                    f"shared-state field {name!r}: not a valid name; use a Python identifier "
                    "that does not start with '_'"
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
            try:
                decl.check()
            except (ValueError, TypeError) as exc:
                raise SchemaError(f"shared-state field {name!r} ({decl.kind}): {exc}") from None
        self.fields: dict[str, Field] = dict(fields)

    def needs_manager(self) -> bool:
        """Whether building this schema needs a Manager server (any non-tensor field)."""
        return any(not isinstance(f, Tensor) for f in self.fields.values())

    def build(self, manager: SyncManager | None, n_workers: int) -> SharedState:
        """Create every field for a run with ``n_workers`` workers."""
        built = {}
        for name, decl in self.fields.items():
            if manager is None and not isinstance(decl, Tensor):
                raise SchemaError(f"shared-state field {name!r} ({decl.kind}) needs a Manager")
            try:
                built[name] = decl.build(manager, n_workers)
            except (ValueError, TypeError) as exc:
                raise SchemaError(f"shared-state field {name!r} ({decl.kind}): {exc}") from None
        return SharedState(**built)

    def snapshot(self, state: SharedState) -> dict[str, Any]:
        """The data of every field that has data (not locks, events, barriers or queues)."""
        out = {}
        for name, decl in self.fields.items():
            data = decl.snapshot(getattr(state, name))
            if data is not None:
                out[name] = data
        return out

    def restore(self, state: SharedState, snapshot: Mapping[str, Any]) -> list[str]:
        """Put a :meth:`snapshot` back; returns the fields that could not be restored (a field
        sized by the number of workers, when that number changed, or a field no longer
        declared)."""
        skipped = []
        for name, data in snapshot.items():
            decl = self.fields.get(name)
            if decl is None or not decl.restore(getattr(state, name), data):
                skipped.append(name)
        return skipped

    def shm_bytes(self, n_workers: int) -> int:
        """Shared memory the schema's tensors take with ``n_workers`` workers."""
        return sum(decl.shm_bytes(n_workers) for decl in self.fields.values())

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.fields.items())
        return f"Schema({inner})"
