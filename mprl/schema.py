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
from typing import Any, ClassVar

import attrs
import gymnasium as gym
import numpy as np
import torch

from mprl import deprecated
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


@attrs.frozen
class Field:
    """Base of every declaration. ``kind`` names it in messages and docs."""

    kind: ClassVar[str] = "field"

    def _check(self) -> None:
        """Raise ``ValueError`` describing what is wrong with this declaration."""

    def __getattr__(self, name: str) -> Any:
        """0.2.0's ``field.build(...)``, ``field.snapshot(...)`` ...: in :mod:`mprl.kinds` now,
        with a warning (:mod:`mprl.deprecated`)."""
        return deprecated.moved_method(self, "Field", name)


_SCALARS = (int, float, bool, str, bytes, type(None))


@attrs.frozen
class PerWorker(Field):
    """One slot per worker rank: ``manager.list([initial] * n_workers)``.

    ``initial`` is a scalar (``0``, ``True``, ``None``, ...), or the type ``list`` or ``dict`` for
    one Manager list / dict per worker (per-worker histories).
    """

    kind: ClassVar[str] = "PerWorker"
    initial: Any = None

    def _check(self) -> None:
        if self.initial in (list, dict):
            return
        if not isinstance(self.initial, _SCALARS):
            raise ValueError(
                f"initial value {self.initial!r} must be a scalar (int, float, bool, str, None) "
                "or the type list or dict"
            )


@attrs.frozen
class List(Field):
    """``manager.list(initial)``."""

    kind: ClassVar[str] = "List"
    initial: Sequence[Any] = ()

    def _check(self) -> None:
        if isinstance(self.initial, str | bytes) or not isinstance(self.initial, Sequence):
            raise ValueError(f"initial value {self.initial!r} must be a list or tuple")


@attrs.frozen
class Dict(Field):
    """``manager.dict(initial)``."""

    kind: ClassVar[str] = "Dict"
    initial: Mapping[Any, Any] = attrs.field(factory=dict)

    def _check(self) -> None:
        if not isinstance(self.initial, Mapping):
            raise ValueError(f"initial value {self.initial!r} must be a mapping")


@attrs.frozen
class Namespace(Field):
    """``manager.Namespace(**initial)``: named scalars such as a global mode flag."""

    kind: ClassVar[str] = "Namespace"
    initial: Mapping[str, Any] = attrs.field(factory=dict)

    def _check(self) -> None:
        if not isinstance(self.initial, Mapping):
            raise ValueError(f"initial value {self.initial!r} must be a mapping of names")
        bad = [k for k in self.initial if not (isinstance(k, str) and k.isidentifier())]
        if bad:
            raise ValueError(f"attribute names {bad!r} are not identifiers")


@attrs.frozen
class _Plain(Field):
    """A Manager kind made by calling the Manager's method of the same name."""


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

    def _check(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 0:
            raise ValueError(f"value {self.value!r} must be an int >= 0")


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

    def _check(self) -> None:
        _check_size(self.parties)


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

    def _check(self) -> None:
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


def _check_typecode(typecode: str) -> None:
    if typecode not in array.typecodes:
        raise ValueError(f"typecode {typecode!r} is not one of {', '.join(array.typecodes)}")


@attrs.frozen
class Value(_Plain):
    """``manager.Value(typecode, initial)`` (typecodes as in the ``array`` module)."""

    kind: ClassVar[str] = "Value"
    typecode: str = "d"
    initial: Any = 0

    def _check(self) -> None:
        _check_typecode(self.typecode)
        array.array(self.typecode, [self.initial])  # raises TypeError for a mismatched value


@attrs.frozen
class Array(_Plain):
    """``manager.Array(typecode, [initial] * size)``; ``size`` is a ``Size``."""

    kind: ClassVar[str] = "Array"
    typecode: str = "d"
    size: Size = "workers"
    initial: Any = 0

    def _check(self) -> None:
        _check_typecode(self.typecode)
        _check_size(self.size)
        array.array(self.typecode, [self.initial])


@attrs.frozen
class Tensor(Field):
    """A tensor every process reads and writes in place (shared memory on the local backend):
    bulk data, readable on hot paths. ``shape`` entries are ``Size``\\ s. Nothing locks it: add a
    ``Lock`` field where writers must not overlap."""

    kind: ClassVar[str] = "Tensor"
    shape: tuple[Size, ...] = attrs.field(converter=tuple)
    dtype: torch.dtype = torch.float32
    fill: float = 0

    def _check(self) -> None:
        if not self.shape:
            raise ValueError("shape must have at least one dimension")
        for size in self.shape:
            _check_size(size)
        if not isinstance(self.dtype, torch.dtype):
            raise ValueError(f"dtype {self.dtype!r} must be a torch.dtype such as torch.float32")


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

    def _check(self) -> None:
        _check_size(self.slots_per_worker)
        if not (callable(self.spec) or isinstance(self.spec, Mapping)):
            raise ValueError(f"spec {self.spec!r} must be a mapping or a function of Dims")


@attrs.frozen
class Weights(Field):
    """The learner's weights published to the workers (:class:`mprl.transport.WeightBroadcast`):
    ``with weights.publishing(model): optimizer.step()`` in the learner, ``weights.pull(local)``
    in a worker. Its version is checkpointed."""

    kind: ClassVar[str] = "Weights"


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
    between the workers: each writes a ring of ``capacity // workers`` rows, so it holds
    ``capacity // workers * workers`` (100,000 with 3 workers: 99,999, 33,333 each), and a run
    resumed with another worker count re-partitions the saved rows into rings of the new size
    (the newest kept, the rest dropped, each said in a line). ``row`` is
    ``{name: (shape, dtype)}`` of one row (or a function of :class:`Dims`); by default
    :func:`transition_row`. ``checkpoint=False`` keeps its rows out of
    checkpoints (a resumed run starts with it empty).

    ``replay_ratio`` declares the training intensity, enforced on every backend: rows sampled
    per row added (RLlib's ``training_intensity``; SB3's
    ``gradient_steps * batch_size / train_freq``), counted from ``learning_starts`` rows on.
    The learner's ``sample(n)`` then waits (stop-aware) until the rows added allow ``n`` more,
    and returns ``None`` once the run stops; a worker's ``add`` waits once the workers are
    ``max_lead`` rows ahead of the learner (until they are half that; ``max_lead=None``:
    workers never wait, the ratio bounds the learner alone). A worker with no learner
    sampling (one called alone on a :class:`mprl.testing.Bench`) waits in ``add`` once
    ``learning_starts + max_lead`` rows were added. Each may be a number,
    ``"config.NAME"`` or a function of :class:`Dims`. The counts are checkpointed with the
    rows. See :class:`ReplayPace`."""

    kind: ClassVar[str] = "ReplayBuffer"
    capacity: Size
    row: RowSpec | Callable[[Dims], RowSpec] | None = None
    checkpoint: bool = True
    replay_ratio: Number | None = None
    learning_starts: Number = 0
    max_lead: Number | None = 1000

    def _check(self) -> None:
        _check_size(self.capacity)
        if not (self.row is None or callable(self.row) or isinstance(self.row, Mapping)):
            raise ValueError(f"row {self.row!r} must be a mapping or a function of Dims")
        if self.replay_ratio is not None:
            _number(self.replay_ratio, None, "replay_ratio", 0.0, strict=True)
        _number(self.learning_starts, None, "learning_starts", 0.0, strict=False)
        if self.max_lead is not None:
            _number(self.max_lead, None, "max_lead", 1.0, strict=False)


@attrs.frozen
class Counter(Field):
    """An integer every process adds to with no Manager and no lock
    (:class:`mprl.transport.SharedCounter`): ``ctx.state.NAME.add(n)``, ``ctx.state.NAME.value``.
    Checkpointed."""

    kind: ClassVar[str] = "Counter"


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
    hold it. ``mprl.lib.continuous.TargetNetwork(ctx.state.target, ctx.device)`` does both for
    a target network (the field itself on the CPU, a copy on a GPU), with its Polyak update
    (the built-in ``sac`` and ``examples/mprl-td3`` use it)."""

    kind: ClassVar[str] = "Module"
    make: Callable[..., torch.nn.Module] | None = None

    def _check(self) -> None:
        if self.make is not None and not callable(self.make):
            raise ValueError(f"make {self.make!r} must be a function")


KINDS: tuple[type[Field], ...] = (
    PerWorker, List, Dict, Namespace, Lock, RLock, Semaphore, BoundedSemaphore, Condition, Event,
    Barrier, Queue, Value, Array, Tensor, Rollouts, Weights, ReplayBuffer, Counter, Module,
)  # fmt: skip


def _never() -> bool:
    return False


def _rebuilt(fields: dict[str, Any], workers: int | None) -> SharedState:
    """A :class:`SharedState` unpickled: its fields, and the worker count it was built for."""
    state = SharedState(**fields)
    state._workers = workers
    return state


@contextmanager
def _blame(name: str, decl: Field) -> Iterator[None]:
    """Turn a ``ValueError`` / ``TypeError`` about ``decl`` into a SchemaError naming it."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        raise SchemaError(f"shared-state field {name!r} ({decl.kind}): {exc}") from None


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
                decl._check()
        self.fields: dict[str, Field] = dict(fields)

    def __getattr__(self, name: str) -> Any:
        """0.2.0's ``schema.build(...)``, ``schema.snapshot(...)`` ...: in :mod:`mprl.kinds` now,
        with a warning (:mod:`mprl.deprecated`)."""
        return deprecated.moved_method(self, "Schema", name)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.fields.items())
        return f"Schema({inner})"


__getattr__ = deprecated.forward(__name__)  # Builder: mprl.kinds.Builder now
