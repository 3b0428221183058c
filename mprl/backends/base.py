"""The seam between the run (what to do) and a backend (where its processes run).

The host prepares a :class:`Job` and a :class:`Monitor`; a backend builds the job's shared state
with its own :class:`mprl.kinds.Builder`, starts the processes, hands each its
:class:`mprl.Context`, feeds the monitor with what they report and stops them. What every backend
does the same way is here: the roles of a job, how a process is seeded, when a job is over, how
an exit is worded. Algorithms only ever see the Context, so a new backend needs no plugin change:
a folder under ``mprl/backends/`` and one ``mprl_register_backends`` hookimpl. A backend whose
children run outside the main process subclasses :class:`mprl.backends.supervisor.Supervisor`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import torch

from mprl import kinds
from mprl.backends.processes import available_memory, describe_exit  # noqa: F401 - were here
from mprl.context import Channel, Context, EnvMaker, derive_seed
from mprl.kinds import Builder
from mprl.run_types import ChildFailure, RunConfig
from mprl.schema import Dims, SharedState

if TYPE_CHECKING:
    from mprl.algorithm import Algorithm

#: how often (seconds) a backend asks the monitor whether to stop, at least
TICK_S = 0.25


def stop_unused_starts() -> None:
    """Stop what ``python -m mprl run`` started ahead for a backend before it knew the run's
    when the run's backend, now prepared, did not take it (:mod:`mprl.startup`)."""
    from mprl import startup

    startup.stop_unclaimed()


@attrs.frozen
class Role:
    """One process of a job: of ``kind`` ``"worker"`` (``rank`` 0..n-1) or ``"trainer"``
    (``rank`` -1), and its ``slot`` in the step and heartbeat counters (the rank; n for the
    trainer)."""

    kind: str
    rank: int
    slot: int

    @property
    def who(self) -> str:
        return self.kind if self.rank < 0 else f"{self.kind} {self.rank}"

    @property
    def source(self) -> str:
        """How its metric records name it."""
        return "trainer" if self.kind == "trainer" else f"worker:{self.rank}"


@attrs.frozen
class Job:
    """Everything a backend needs to run one training job."""

    algorithm: Algorithm
    config: Any
    run: RunConfig
    dims: Dims
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    #: ``make_env(env_id, seed=, rank=, index=)`` for the contexts; picklable
    make_env: EnvMaker
    #: env steps per counter slot (workers..., train process, steps of earlier sessions)
    initial_steps: tuple[int, ...] = ()
    #: shared-state data from the checkpoint a resumed run starts from
    state_snapshot: Mapping[str, Any] = attrs.field(factory=dict)
    #: the algorithm's named optimizers (``Algorithm(optimizers=...)``)
    optimizers: Mapping[str, torch.optim.Optimizer] = attrs.field(factory=dict)
    #: 0 for a new run, 1 after the first resume, ...; part of every child's seed
    session: int = 0
    #: the run directory, for the backend's own files (``logs/``); a temp dir when ``None``
    run_dir: Path | None = None

    def roles(self) -> list[Role]:
        """The job's processes, in start order: the train process first (it is ready when the
        first experience arrives), then the workers by rank."""
        n = self.run.workers
        workers = [Role("worker", rank, rank) for rank in range(n)]
        return ([Role("trainer", -1, n)] if self.algorithm.train is not None else []) + workers

    def build_state(self, builder: Builder) -> tuple[SharedState, str | None]:
        """The run's shared state, built with a backend's ``builder`` and restored from the
        checkpoint on resume (:attr:`state_snapshot`, already fitted to this run by the host:
        :meth:`mprl.schema.Schema.fit`); also a message naming the fields that could not be
        restored after all (a ``Module`` of another shape), for the backend to report, or
        ``None``."""
        schema = self.algorithm.schema
        state = kinds.build(schema, builder, self.dims)
        skipped = kinds.restore(schema, state, self.state_snapshot) if self.state_snapshot else []
        if not skipped:
            return state, None
        return state, (
            "shared-state fields not restored from the checkpoint (they do not fit this run): "
            f"{', '.join(skipped)}"
        )

    def context(
        self, role: Role, state: SharedState, channel: Channel, restarts: int = 0
    ) -> Context:
        """The :class:`mprl.Context` of ``role``."""
        return Context(
            role=role.kind,
            rank=role.rank,
            n_workers=self.run.workers,
            seed=derive_seed(self.run.seed, role.rank + 1, self.session, restarts),
            config=self.config,
            run=self.run,
            state=state,
            model=self.model,
            optimizer=self.optimizer,
            optimizers=dict(self.optimizers),
            channel=channel,
            make_env=self.make_env,
            restarts=restarts,
        )

    def all_optimizers(self) -> list[torch.optim.Optimizer]:
        """``make_optimizer``'s and the named ones."""
        return [
            *([self.optimizer] if self.optimizer is not None else []),
            *self.optimizers.values(),
        ]

    def function(self, role: Role) -> Callable[[Context], None]:
        """The algorithm's function for ``role``: ``worker`` or ``train``."""
        fn = self.algorithm.worker if role.kind == "worker" else self.algorithm.train
        assert fn is not None, role
        return fn


def end_reason(job: Job, done: Sequence[Role], steps: int = 0) -> str | None:
    """Why a job is over once the processes ``done`` have returned: the env-step budget is
    spent (``steps``: the run's count; its processes stop by themselves then), the train
    process returned, or every worker did; ``None`` while it goes on."""
    if not done:
        return None
    total = job.run.total_steps
    if total is not None and steps >= total:
        return "total steps reached"
    if any(r.kind == "trainer" for r in done):
        return "trainer finished"
    if sum(r.kind == "worker" for r in done) == job.run.workers:
        return "workers finished"
    return None


def failure(role: Role, code: int | None, traceback: str = "", reason: str = "") -> ChildFailure:
    """The report of ``role``'s process that ended with ``code`` (a crash, unless ``reason``)."""
    return ChildFailure(role.kind, role.rank, code, reason or describe_exit(code), traceback)


@attrs.frozen
class Outcome:
    """How a job ended: ``stop_reason`` when it was stopped, ``failures`` when something crashed."""

    stop_reason: str
    failures: Sequence[ChildFailure] = ()
    restarts: Sequence[int] = ()  # per worker rank
    shutdown_s: float | None = None  # from the stop signal to the last child gone


class Monitor(Protocol):
    """The host's side of a job, called by the backend in the main process."""

    def on_start(self, state: SharedState, refresh: Callable[[], None] | None = None) -> None:
        """The shared state is built (and restored on resume); children start next.
        ``refresh()``, where the backend gives one, brings the main process's model,
        optimizers and modules up to date with what the children train (the Ray backend's
        train process is elsewhere): the monitor calls it before it reads them."""

    def on_event(self, record: Mapping[str, Any]) -> None:
        """A supervision event to log and show: ``record["event"]`` is ``"restart"``,
        ``"terminate"``, ``"kill"`` ..., ``record["message"]`` says it in words."""

    def on_stop(self, per_slot_steps: Sequence[int]) -> None:
        """Every child has stopped; the shared state is still readable (final checkpoint).
        ``per_slot_steps`` are the final counters, as in :meth:`on_tick`."""

    def on_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        """New metric records from the children."""

    def on_tick(self, env_steps: int, per_worker_steps: Sequence[int]) -> str | None:
        """Called about every :data:`TICK_S`; return a reason to stop the job, or ``None``."""


class Backend:
    """Runs a job's processes. Subclasses: :class:`mprl.backends.local.LocalBackend`,
    :class:`mprl.backends.serial.SerialBackend`."""

    name = ""

    def prepare(self, job: Job) -> list[str]:
        """What only this backend needs before anything starts or is written (checks of the
        machine, sharing the model's memory): raise :class:`mprl.errors.UsageError` when the
        job cannot run here; return notes for the user. Called once, before :meth:`execute`."""
        return []

    def execute(self, job: Job, monitor: Monitor) -> Outcome:
        """Start the job's processes, supervise them, stop them, and report how the job ended.
        Must not return while any process it started is alive."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what :meth:`prepare` acquired (a cluster connection); called once after the
        run, also when it never executed (a run directory that could not be made)."""
