"""What a plugin gets for the transport fields of its schema: small protocols, one per kind.

Experience and weights move between a run's processes through fields declared in the schema
like any other (:class:`mprl.schema.Rollouts`, :class:`~mprl.schema.Weights`,
:class:`~mprl.schema.ReplayBuffer`, :class:`~mprl.schema.Counter`). The backend builds them:
the local backend in shared memory, the serial backend in this process (a wait hands the turn
to the other processes), another backend in its own store. A worker or train function sees
them as ``ctx.state.NAME``, already bound to its process: waits return ``None`` once the run
stops (and keep the heartbeat going meanwhile), a worker's calls use its own rank. Code written
against these protocols runs unchanged on every backend.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from mprl import deprecated

if TYPE_CHECKING:
    import torch

__getattr__ = deprecated.forward(__name__)  # 0.1.0's Rollouts, Weights ...: what replaced them


class RolloutSlots(Protocol):
    """Rollout slots, ``slots_per_worker`` per worker rank (declared with
    :class:`mprl.schema.Rollouts`): a worker fills one of its slots in place and commits it; the
    learner takes batches of committed rollouts. Nothing is pickled or copied on the worker's
    side, and a worker ahead of the learner waits for a free slot (back-pressure) instead of
    piling up data. A worker killed at any instruction leaves nothing locked.

    Each slot holds the declared fields plus ``version`` (``int64``, ``-1`` until a rollout was
    committed into the slot: the worker writes the policy version it collected with) and
    ``source`` (the worker rank, filled in by :meth:`commit`).
    """

    slots_per_worker: int

    def acquire(self, timeout: float | None = None) -> int | None:
        """Worker: the index of this worker's next slot, once the learner has freed it.
        ``None`` once the run stops, or after ``timeout`` seconds."""
        ...

    def slot(self, index: int) -> dict[str, torch.Tensor]:
        """The tensors of slot ``index``, to write in place (worker) or read (learner)."""
        ...

    def commit(self, index: int) -> None:
        """Worker: hand a filled slot to the learner. Rollouts reach the learner in the order
        each worker committed them."""
        ...

    def take_batch(self, n: int, timeout: float | None = None) -> dict[str, torch.Tensor] | None:
        """Learner: ``n`` committed rollouts (copies), each field stacked along a new dim 1
        (``[T, n, ...]`` for a ``[T, ...]`` field; ``[n]`` for ``version`` and ``source``), in
        worker-rank order, so a seeded synchronous run repeats. Each slot is freed as soon as
        it is copied. ``None`` once the run stops (or on timeout); the rollouts copied so far
        open the next call's batch, nothing is lost."""
        ...


class WeightBroadcast(Protocol):
    """The learner's weights, published to the workers (declared with
    :class:`mprl.schema.Weights`). ``version`` counts completed updates; the learner never waits
    for a reader and a reader never sees half of an update.

    What is published is the run's whole model: every parameter and floating-point buffer, in
    order. ``publishing`` and ``pull`` take that model or a model of its architecture (a
    worker's ``copy.deepcopy(ctx.model)``, the train process's copy on a GPU), not a part of
    it: a submodule (``model.actor``) has other tensors, and a ``pull`` into one is a
    ``ValueError``. A ``pull`` of a newer version copies every tensor: on the local backend
    about 14 us for the built-in CartPole network (37 kB), 40-70 us per MB up to a few MB
    (8.5 MB: 0.35 ms), about 100 us per MB once the model outgrows the CPU's caches (34 MB:
    3.4 ms), measured by ``benchmarks/weights_pull.py`` on a 2-core machine; a ``pull`` of the
    version the model holds copies nothing (0.3 us)."""

    @property
    def version(self) -> int:
        """Number of updates published so far (kept across ``--resume``)."""
        ...

    def publishing(self, model: torch.nn.Module) -> AbstractContextManager[None]:
        """Learner: ``with weights.publishing(model): optimizer.step()``. The update of ``model``
        inside the block is one new version, which readers see whole once the block ends."""
        ...

    def wait(self, newer_than: int, timeout: float | None = None) -> int | None:
        """Sleep until a version newer than ``newer_than`` is published; return it. ``None``
        once the run stops, or after ``timeout`` seconds; ``None`` too for a version published
        as the run stopped (a learner stopped mid-update publishes part of one), so a seeded
        synchronous run acts on whole updates only."""
        ...

    def pull(self, model: torch.nn.Module, have: int = -1) -> int:
        """Copy the newest published weights into ``model`` unless it holds version ``have``
        already; return the version ``model`` now holds. Never blocks on the learner."""
        ...


class ReplayStore(Protocol):
    """A replay buffer of fixed-size rows (declared with :class:`mprl.schema.ReplayBuffer`).

    Workers :meth:`add` rows; the learner draws them with :meth:`sample`. The capacity is split
    evenly between the workers: each writes its own ring of ``capacity // workers`` rows, oldest
    rows overwritten first. A worker's rows become visible in the order it added them, each one
    whole; :meth:`sample` never returns a row that is being written.

    With a declared replay ratio (``ReplayBuffer(replay_ratio=...)``, see
    :class:`mprl.schema.ReplayPace`) the backend keeps it: :meth:`sample` waits until the rows
    added allow its rows, and :meth:`add` waits while the workers are ``max_lead`` rows ahead
    of the learner. Every wait here is stop-aware (it ends once the run stops and keeps the
    heartbeat going), sleeps (the serial backend: hands the turn on) and, on Ray, waits in the
    learner's process, where the buffer lives, not in a call per look.
    """

    capacity: int

    def add(self, **rows: torch.Tensor) -> None:
        """Worker: append rows, one tensor per declared field with the rows along dim 0. At a
        declared replay ratio, it first waits while the workers are ``max_lead`` rows ahead of
        the learner (until they are half that, or the run stops: the rows go in then too)."""
        ...

    def size(self) -> int:
        """How many complete rows the buffer holds now (all workers together)."""
        ...

    def wait_size(self, n: int, timeout: float | None = None) -> int | None:
        """Wait until the buffer holds at least ``n`` complete rows; the size then. ``None``
        once the run stops, or after ``timeout`` seconds."""
        ...

    def sample(
        self, n: int, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor] | None:
        """``n`` rows drawn uniformly with replacement from the complete ones (copies), one tensor
        per field; ``None`` while the buffer is empty. At a declared replay ratio it first waits
        until the rows added allow ``n`` more to be sampled (``learning_starts`` rows first),
        and returns ``None`` once the run stops: ``while (batch := replay.sample(64)) is not
        None:`` is a whole learner loop."""
        ...


class SharedCounter(Protocol):
    """An integer every process can add to without a Manager or a lock (declared with
    :class:`mprl.schema.Counter`): each process adds to its own slot, :attr:`value` sums them."""

    def add(self, n: int = 1) -> None:
        """Add ``n`` (a memory write: cheap enough for every step)."""
        ...

    @property
    def value(self) -> int:
        """The total added by every process (kept across ``--resume``)."""
        ...
