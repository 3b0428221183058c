"""The seam between the run (what to do) and a backend (where processes run).

The runner prepares a :class:`Job` and a :class:`Monitor`; a backend starts the job's processes,
hands each its :class:`mprl.Context`, feeds the monitor with what they report and stops them.
Algorithms only ever see the Context, so a new backend (a Ray cluster) needs no plugin changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from mprl.algorithm import Algorithm
    from mprl.context import Channel, Context
    from mprl.runner import RunConfig
    from mprl.schema import SharedState


@attrs.frozen
class Job:
    """Everything a backend needs to run one training job."""

    algorithm: Algorithm
    config: Any
    run: RunConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    blocked_plugins: tuple[str, ...] = ()
    #: env steps per counter slot (workers..., train process, steps of earlier sessions)
    initial_steps: tuple[int, ...] = ()
    #: shared-state data from the checkpoint a resumed run starts from
    state_snapshot: Mapping[str, Any] = attrs.field(factory=dict)
    #: 0 for a new run, 1 after the first resume, ...; part of every child's seed
    session: int = 0
    #: objects from the algorithm's ``make_shared``, added to the shared state
    extra_state: Mapping[str, Any] = attrs.field(factory=dict)
    #: the run directory, for the backend's own files (``logs/``); a temp dir when ``None``
    run_dir: Path | None = None
    #: the run's plugin manager; a backend running the processes in this process (``serial``)
    #: gives it to their contexts, spawned processes build their own
    plugins: Any = None

    def build_state(self, manager: Any) -> tuple[SharedState, list[str]]:
        """The run's shared state: the schema built with ``manager``, ``make_shared``'s objects,
        and the checkpoint's data on resume. Also returns the fields that could not be restored
        (sized by a worker count that changed), for the backend to report."""
        state = self.algorithm.schema.build(manager, self.run.workers)
        for name, value in self.extra_state.items():
            setattr(state, name, value)
        skipped = []
        if self.state_snapshot:
            skipped = self.algorithm.schema.restore(state, self.state_snapshot)
        return state, skipped

    def context(
        self, role: str, rank: int, state: SharedState, channel: Channel, restarts: int = 0
    ) -> Context:
        """The :class:`mprl.Context` of ``role`` / ``rank`` (-1 for the train process)."""
        from mprl.context import Context, derive_seed

        return Context(
            role=role,
            rank=rank,
            n_workers=self.run.workers,
            seed=derive_seed(self.run.seed, rank + 1, self.session, restarts),
            config=self.config,
            run=self.run,
            state=state,
            model=self.model,
            optimizer=self.optimizer,
            channel=channel,
            blocked_plugins=self.blocked_plugins,
            restarts=restarts,
        )

    def function(self, role: str) -> Callable[[Context], None]:
        """The algorithm's function for ``role``: ``worker`` or ``train``."""
        fn = self.algorithm.worker if role == "worker" else self.algorithm.train
        assert fn is not None, role
        return fn

    def skipped_message(self, skipped: list[str]) -> str:
        return (
            "shared-state fields not restored from the checkpoint (they do not fit this run's "
            f"{self.run.workers} workers): {', '.join(skipped)}"
        )


@attrs.frozen
class ChildFailure:
    """A process that ended badly: who it was and why."""

    role: str
    rank: int
    exitcode: int | None
    reason: str
    traceback: str = ""

    @property
    def who(self) -> str:
        return self.role if self.rank < 0 else f"{self.role} {self.rank}"


@attrs.frozen
class Outcome:
    """How a job ended: ``stop_reason`` when it was stopped, ``failures`` when something crashed."""

    stop_reason: str
    failures: Sequence[ChildFailure] = ()
    restarts: Sequence[int] = ()  # per worker rank
    shutdown_s: float | None = None  # from the stop signal to the last child gone


class Monitor(Protocol):
    """The runner's side of a job, called by the backend in the main process."""

    def on_start(self, state: SharedState) -> None:
        """The shared state is built (and restored on resume); children start next."""

    def on_event(self, record: Mapping[str, Any]) -> None:
        """A supervision event to log and show: ``record["event"]`` is ``"restart"``,
        ``"terminate"``, ``"kill"`` ..., ``record["message"]`` says it in words."""

    def on_stop(self, per_slot_steps: Sequence[int]) -> None:
        """Every child has stopped; the shared state is still readable (final checkpoint).
        ``per_slot_steps`` are the final counters, as in :meth:`on_tick`."""

    def on_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        """New metric records from the children."""

    def on_tick(self, env_steps: int, per_worker_steps: Sequence[int]) -> str | None:
        """Called about every 0.25 s; return a reason to stop the job, or ``None``."""


class Backend(Protocol):
    """Runs a job's processes. Implementations: :class:`mprl.local.LocalBackend`."""

    name: str

    def execute(self, job: Job, monitor: Monitor) -> Outcome:
        """Start the workers (and train process), supervise them, stop them, and report how the
        job ended. Must not return while any process it started is alive."""
        ...
