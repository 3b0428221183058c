"""One supervisor for the backends whose children run apart from the main process's own code.

:class:`Supervisor` owns what every such backend does the same way: the child table, the
staggered start (``--start-interval``), the supervise loop (a child returned, crashed or went
silent: restart it or fail the run; restarts that are due; when the job is over), the stop
(the stop flag, a bounded grace, then a kill), the final counters, the outcome and the events
the monitor shows. A backend says how its children start, as a :class:`ChildHandle` per child
(poll, stop, kill), how the shared state is built and what the children reported, and what to
release at the end: after sample-factory's runner base and its serial and parallel runners.
See docs/backends.md, "Writing a backend", for the checklist.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from mprl.backends.base import TICK_S, Job, Monitor, Outcome, Role, end_reason, failure
from mprl.backends.processes import ManagerServer
from mprl.backends.restart import RestartPolicy
from mprl.context import Context
from mprl.run_types import ChildFailure
from mprl.schema import SharedState
from mprl.timeline import mark

#: the shortest pause between two looks at a run (see :meth:`Supervisor._next_look`)
MIN_LOOK_S = 0.01
#: the pause between looks at a run with an env-step budget while its steps do not move
UNKNOWN_RATE_LOOK_S = 0.05

#: exit codes of a child that a signal to the whole process group ended (not a crash when the
#: main process got the signal too)
STOP_SIGNAL_CODES = (-signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP)

RUNNING, RETURNED, FAILED = "running", "returned", "failed"


@attrs.frozen
class Status:
    """What a :class:`ChildHandle` says of its child.

    :ivar state: :data:`RUNNING`, :data:`RETURNED` (its function returned) or :data:`FAILED`.
    :ivar silent_s: running: seconds since its last heartbeat (``None``: not known yet).
    :ivar starting: running: still in its start-up work (imports, placement), which gets the
        supervisor's start-up time instead of ``--worker-timeout``.
    :ivar code: failed: its exit code (negative: the signal), ``None`` where there is none.
    :ivar traceback: failed: what it raised, where known.
    :ivar reason: failed: what happened in words, when the exit code does not say it (an
        actor that died with its node).
    :ivar restartable: failed: whether a restart could help; ``False`` fails the run whatever
        restarts are left (a child that could not be placed: its restart would wait the same).
    """

    state: str
    silent_s: float | None = None
    starting: bool = False
    code: int | None = None
    traceback: str = ""
    reason: str = ""
    restartable: bool = True


class ChildHandle(Protocol):
    """One child of a job as its backend runs it (a process, an actor, a thread)."""

    def poll(self) -> Status:
        """How it is now; never blocks."""
        ...

    def stop(self) -> None:
        """Raise its stop flag: its ``ctx.should_stop()`` is true from now on."""
        ...

    def kill(self, stack: bool = False) -> str:
        """End it now, and what it started (idempotent: an ended child stays ended). With
        ``stack``, its stack as it is first (a hung child's report), or ``""``."""
        ...


class NotStarted(Exception):
    """Raised by :meth:`Supervisor.build_state` when the job cannot start (a server died, a
    cluster cannot be reached): ``outcome`` says how it ended."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.stop_reason)
        self.outcome = outcome


@attrs.define(eq=False)
class Child:
    """One rank of the job and what its backend runs it in (``handle``)."""

    role: Role
    handle: ChildHandle | None = None
    restarts: int = 0  # restarts spent on this rank
    in_a_row: int = 0  # failures in a row without a step in between
    steps_at_start: int = 0
    restart_at: float | None = None  # monotonic time of a pending restart
    done: bool = False  # ended for good
    hopeless: bool = False  # its last failure is one a restart would not cure

    def live(self) -> bool:
        return self.handle is not None and not self.done and self.restart_at is None


class Supervisor:
    """Runs one job: :meth:`execute` is the template; a backend implements the methods marked
    *backend* (the first four always; :meth:`wait` and :meth:`refresh` where it can do better
    than the default)."""

    #: seconds a child gets for its first heartbeat (imports, placement), scaled up when there
    #: are more children than cores
    startup_timeout_s = 120.0
    #: seconds children get to return after the stop flag, before they are killed
    stop_grace_s = 5.0
    #: the Manager server of the run's Manager kinds, where :meth:`build_state` starts one: its
    #: loss fails the run
    server: ManagerServer | None = None

    def __init__(self, job: Job, monitor: Monitor) -> None:
        self.job, self.monitor = job, monitor
        self.policy = RestartPolicy.of(job.run)
        self.children = [Child(role) for role in job.roles()]
        cores = os.cpu_count() or 1
        self.startup_timeout = self.startup_timeout_s * max(1.0, len(self.children) / cores)
        self.state: SharedState | None = None
        self.outcome: Outcome | None = None  # once the job ended without an error
        self._steps: list[int] = list(job.initial_steps) or [0] * (job.run.workers + 2)
        self._stopped = False
        self._seen = (time.monotonic(), 0)  # (when, env steps) at the last look (_next_look)

    # -- what a backend says ---------------------------------------------------------------

    def build_state(self) -> tuple[SharedState, str | None]:
        """*Backend*: start what the state needs and build it (:meth:`Job.build_state`); raise
        :class:`NotStarted` when the job cannot start."""
        raise NotImplementedError

    def start(self, role: Role, ctx: Context) -> ChildHandle:
        """*Backend*: start a child for ``role`` (a new one on a restart) with ``ctx``."""
        raise NotImplementedError

    def take(self) -> Sequence[int] | None:
        """*Backend*: give the monitor what the children reported (``monitor.on_records``),
        without waiting; the env steps per counter slot (workers, train process, earlier
        sessions) when it knows them, ``None`` to keep the last."""
        raise NotImplementedError

    def release(self) -> None:
        """*Backend*: release what the run held (servers, queues, files), once every child has
        ended and the final checkpoint is written. Nothing it started may outlive it."""
        raise NotImplementedError

    def wait(self, until: float, handles: Sequence[ChildHandle]) -> None:
        """*Backend*: wait until ``until``, or until one of ``handles`` ends (default: sleep)."""
        time.sleep(max(0.0, until - time.monotonic()))

    def refresh(self) -> None:
        """*Backend*: bring the main process's model, optimizers and modules up to date with
        what the children train, before the host reads them (a checkpoint); nothing where they
        share its memory."""

    # -- the template ------------------------------------------------------------------------

    def execute(self) -> Outcome:
        """Build the state, start the children, supervise them, stop them, and say how the job
        ended; nothing it started outlives it."""
        try:
            try:
                self.state, skipped = self.build_state()
            except NotStarted as exc:
                self.outcome = exc.outcome
                return exc.outcome
            mark("state")
            if skipped:
                self.event("state-not-restored", skipped)
            self.monitor.on_start(self.state, _weakly(self.refresh))
            reason = self._start_all()
            failures: list[ChildFailure] = []
            if reason is None:
                reason, failures = self._supervise()
            stop_start = time.monotonic()
            mark("stopping", reason=reason)
            failures += self._stop()
            shutdown_s = time.monotonic() - stop_start
            mark("stopped")
            self._on_stop()
            restarts = tuple(c.restarts for c in self.children if c.role.kind == "worker")
            self.outcome = Outcome(reason, failures, restarts, round(shutdown_s, 3))
            return self.outcome
        finally:
            for child in self.children:  # live ones only on a forced exit or an error
                if child.handle is not None:
                    with contextlib.suppress(Exception):
                        child.handle.kill()
            if self.state is not None:  # every child is gone: save what was learned
                with contextlib.suppress(Exception):
                    self._on_stop()
            self.release()
            for child in self.children:  # a handle may point back here: no cycle outlives
                child.handle = None  # the run (its queues' semaphores go with the last ref)
            mark("released")

    def event(self, kind: str, message: str, **fields: object) -> None:
        self.monitor.on_event({"event": kind, "message": message, **fields})

    def steps(self) -> list[int]:
        """The env steps per counter slot, as of the last :meth:`take`."""
        return self._steps

    def _take(self) -> None:
        steps = self.take()
        if steps is not None:
            self._steps = list(steps)

    def _on_stop(self) -> None:
        """Tell the monitor, once, that every child has stopped (it writes the checkpoint)."""
        if not self._stopped:
            self._stopped = True
            self.monitor.on_stop(self.steps())

    def _stop_reason(self) -> str | None:
        steps = self.steps()
        return self.monitor.on_tick(sum(steps), steps)

    def stop_requested(self) -> str | None:
        """The signal's name when the main process was asked to stop by one, else ``None``."""
        time.sleep(0.1)  # let the main process's signal handler run
        reason = self._stop_reason()
        return reason if reason is not None and reason.startswith("SIG") else None

    def _start(self, child: Child) -> None:
        """Start (or restart) the child of ``child``'s rank."""
        ctx = self.job.context(child.role, self.state, None, child.restarts)  # type: ignore[arg-type]
        child.steps_at_start = self.steps()[child.role.slot]
        child.restart_at = None
        mark("launch", source=child.role.source)
        child.handle = self.start(child.role, ctx)

    def _start_all(self) -> str | None:
        """Start the children one after another, ``--start-interval`` apart; a reason to stop
        (Ctrl-C, ...) that comes meanwhile ends the starting: what started is stopped."""
        interval = self.job.run.start_interval
        for i, child in enumerate(self.children):
            if reason := self._stop_reason():
                return reason
            self._start(child)
            if child.role.kind != "worker" or i == len(self.children) - 1:
                continue
            deadline = time.monotonic() + interval
            while (now := time.monotonic()) < deadline:
                self._take()
                if reason := self._stop_reason():
                    return reason
                time.sleep(max(0.0, min(deadline, now + TICK_S) - time.monotonic()))
        return None

    def _server_lost(self, stopping: bool = False) -> list[ChildFailure]:
        lost = self.server.failure(settle=stopping) if self.server is not None else None
        return [lost] if lost is not None else []

    def _supervise(self) -> tuple[str, list[ChildFailure]]:
        """Watch every child until the run should stop: one that fails is restarted on its rank
        while the restart limits allow it, else the run stops; a silent one counts as failed."""
        while True:
            tick = time.monotonic()
            self._take()
            asked = self._stop_reason()
            if asked is not None and asked.startswith("SIG"):
                return asked, []  # stopped by the user: nothing after it is a failure
            failures = self._server_lost()
            for child in self.children:
                found = self._check(child) if child.live() else None
                if found is None:
                    continue
                if found.exitcode in STOP_SIGNAL_CODES and (reason := self.stop_requested()):
                    # SIGTERM / SIGINT sent to the whole process group (timeout, systemd,
                    # docker stop) also reached the main process: a stop, not a crash
                    return reason, []
                if (found := self._restart_or_fail(child, found)) is not None:
                    failures.append(found)
            if failures:
                return "failed", failures
            now = time.monotonic()
            for child in self.children:
                if child.restart_at is not None and now >= child.restart_at:
                    self._start(child)
            done = [c.role for c in self.children if c.done]
            if asked is None and end_reason(self.job, done, sum(self.steps())) is not None:
                self._take()  # with the steps they counted just before they returned
                asked = end_reason(self.job, done, sum(self.steps()))
            if asked is not None:
                return asked, []
            pending = [c.restart_at for c in self.children if c.restart_at is not None]
            live = [c.handle for c in self.children if c.live()]
            self.wait(min([self._next_look(tick), *pending]), live)  # type: ignore[list-item]

    def _next_look(self, tick: float) -> float:
        """When to look again: a tick after the last look, or sooner when the env-step budget
        (--total-steps) is due before then at the rate since the last look (a run that does
        50,000 steps a second would go 12,500 past its budget in a tick), or when there is no
        rate to go by yet."""
        total = self.job.run.total_steps
        if total is None:
            return tick + TICK_S
        now, steps = time.monotonic(), sum(self.steps())
        (then, before), self._seen = self._seen, (now, steps)
        rate = (steps - before) / max(now - then, 1e-6)
        if steps >= total:
            return tick + TICK_S
        if rate <= 0:  # no rate to go by yet (starting, or a pause): look again soon
            return min(tick + TICK_S, now + UNKNOWN_RATE_LOOK_S)
        return min(tick + TICK_S, now + max(MIN_LOOK_S, (total - steps) / rate))

    def _check(self, child: Child) -> ChildFailure | None:
        """``child``'s failure if it crashed or hung (killed then); ``None`` while it runs well
        or when it returned (done then)."""
        assert child.handle is not None
        status = child.handle.poll()
        if status.state == RETURNED:
            child.done = True
            return None
        if status.state == FAILED:
            child.hopeless = not status.restartable
            return failure(child.role, status.code, status.traceback, status.reason)
        timeout = self.job.run.worker_timeout
        silent = status.silent_s
        limit = max(timeout, self.startup_timeout) if status.starting else timeout
        if not timeout or silent is None or silent < limit:
            return None
        stack = child.handle.kill(stack=True)
        code = child.handle.poll().code
        reason = f"hung: no heartbeat for {silent:.0f} s (--worker-timeout {timeout:g}); killed"
        tb = f"stack when it was killed:\n{stack}" if stack.strip() else ""
        return failure(child.role, code, tb, reason)

    def _restart_or_fail(self, child: Child, found: ChildFailure) -> ChildFailure | None:
        """Schedule a restart of ``child``'s rank, or return the failure that ends the run."""
        progressed = self.steps()[child.role.slot] > child.steps_at_start
        assert child.handle is not None
        child.handle.kill()  # what it started goes with it, before a restart
        child.in_a_row = self.policy.in_a_row(child.in_a_row, progressed)
        decision = self.policy.decide(child.role.kind, child.restarts, child.in_a_row)
        if child.hopeless:  # (its reason says why)
            child.done = True
            return found
        if decision.delay is None:
            child.done = True
            return attrs.evolve(found, reason=found.reason + decision.why_not)
        child.restarts += 1
        child.restart_at = time.monotonic() + decision.delay
        self.event(
            "restart",
            f"{found.who} {found.reason}; restarting it in {decision.delay:.1f} s "
            f"(restart {child.restarts} of {self.policy.max_restarts})",
            rank=child.role.rank,
            restarts=child.restarts,
            reason=found.reason,
            traceback=found.traceback,
        )
        return None

    def _stop(self) -> list[ChildFailure]:
        """The stop flag, :attr:`stop_grace_s` for the children to return (what they report
        meanwhile is taken, so one blocked on a full queue can finish), then a kill for any
        left. Returns within about the grace, whatever the children do; the failures of
        children that crashed meanwhile, and of a server lost."""
        running = [c for c in self.children if c.live()]
        for child in running:
            child.handle.stop()  # type: ignore[union-attr]
        deadline = time.monotonic() + self.stop_grace_s
        while (alive := [c for c in running if _running(c)]) and time.monotonic() < deadline:
            self._take()
            self.wait(min(deadline, time.monotonic() + 0.1), [c.handle for c in alive])  # type: ignore[misc]
        for child in alive:
            starting = child.handle.poll().starting  # type: ignore[union-attr]
            child.handle.kill()  # type: ignore[union-attr]
            who = child.role.who
            if starting:  # it never ran the plugin's code (a run that ended as it started, or
                # a loaded machine): a line in the log, nothing said
                record = {"source": "main", "event": "kill", "rank": child.role.rank}
                message = f"{who} was still starting when the run stopped; killed"
                self.monitor.on_records([{**record, "step": sum(self.steps()), "message": message}])
            else:
                message = f"{who} did not stop within {self.stop_grace_s:g} s; killed"
                self.event("kill", message, rank=child.role.rank)
        self._take()
        failures = []
        for child in running:  # a crash while stopping: reported with its traceback
            status = child.handle.poll()  # type: ignore[union-attr]
            if status.state == FAILED and status.traceback and child not in alive:
                failures.append(failure(child.role, status.code, status.traceback, status.reason))
        failures += self._server_lost(stopping=True)  # one lost while stopping is reported
        for child in self.children:
            child.done = True
        return failures


def _weakly(method: Callable[[], None]) -> Callable[[], None]:
    """``method`` called through a weak reference to its object: the monitor that keeps it
    keeps no supervisor alive (what it holds, a queue's semaphores, goes with the run)."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:
            bound()

    return call


def _running(child: Child) -> bool:
    return child.handle is not None and child.handle.poll().state == RUNNING
