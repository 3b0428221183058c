"""One supervisor for the backends whose children run outside the main process.

:class:`Supervisor` owns what every such backend does the same way: the child table, the
staggered start (``--start-interval``), the supervise loop (a child ended, crashed or went
silent: restart it or fail the run; restarts that are due; when the job is over), the stop
sequence (stop flag, a bounded wait, escalation), the final counters and the outcome, and the
events the monitor shows. A subclass says only how its children start, how an ended or silent
child is seen, how one is killed and how the shared state is built (after sample-factory's
runner base and its serial and parallel runners).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

import attrs

from mprl.backends.base import TICK_S, Job, Monitor, Outcome, Role, end_reason, failure
from mprl.backends.restart import RestartPolicy
from mprl.context import Channel, Context
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
#: what :meth:`Supervisor.exit_of` returns for a child that is still running
RUNNING: Any = object()


class NotStarted(Exception):
    """Raised by :meth:`Supervisor.build_state` when the job cannot start (a server died, a
    cluster cannot be reached): ``outcome`` says how it ended."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.stop_reason)
        self.outcome = outcome


@attrs.define(eq=False)
class Child:
    """One rank of the job and what the backend runs it in (``handle``)."""

    role: Role
    handle: Any = None
    started: bool = False
    restarts: int = 0  # restarts spent on this rank
    in_a_row: int = 0  # failures in a row without a step in between
    steps_at_start: int = 0
    started_at: float = 0.0
    restart_at: float | None = None  # monotonic time of a pending restart
    done: bool = False  # ended for good

    def live(self) -> bool:
        return self.started and not self.done and self.restart_at is None


class Supervisor:
    """Runs one job: :meth:`execute` is the template, the methods marked *backend* its steps."""

    #: seconds a child gets for its first heartbeat (imports, placement), scaled up when there
    #: are more children than cores
    startup_timeout_s = 120.0
    #: the stop sequence after the stop flag: (seconds to wait, what to do to the children left)
    escalation: tuple[tuple[float, str], ...] = ((5.0, "kill"),)
    #: the end of a hung child's failure reason
    kill_words = "killed"
    #: the channel the children's contexts get (``None`` when the child sets its own)
    channel: Channel | None = None
    child_type: type[Child] = Child

    def __init__(self, job: Job, monitor: Monitor) -> None:
        self.job, self.monitor = job, monitor
        self.policy = RestartPolicy.of(job.run)
        self.children = [self.child_type(role) for role in job.roles()]
        cores = os.cpu_count() or 1
        self.startup_timeout = self.startup_timeout_s * max(1.0, len(self.children) / cores)
        self.state: SharedState | None = None
        self.outcome: Outcome | None = None  # once the job ended without an error
        self._stopped = False
        self._seen = (time.monotonic(), 0)  # (when, env steps) at the last look (_next_look)

    # -- what a backend says ---------------------------------------------------------------

    def build_state(self) -> tuple[SharedState, str | None]:
        """*Backend*: start what the state needs and build it (:meth:`Job.build_state`); raise
        :class:`NotStarted` when the job cannot start."""
        raise NotImplementedError

    def launch(self, child: Child, ctx: Context) -> None:
        """*Backend*: start ``child``'s process (a new one on a restart) with ``ctx``."""
        raise NotImplementedError

    def take(self) -> None:
        """*Backend*: take what the children reported (records, counters), without waiting."""

    def pause(self, until: float, children: Sequence[Child]) -> None:
        """*Backend*: wait until ``until``, or until one of ``children`` ends."""
        time.sleep(max(0.0, until - time.monotonic()))

    def steps(self) -> list[int]:
        """*Backend*: the env steps per counter slot (workers, train process, earlier sessions)."""
        raise NotImplementedError

    def exit_of(self, child: Child) -> ChildFailure | None:
        """*Backend*: :data:`RUNNING`, ``None`` when ``child``'s function returned, or the
        failure of a child that crashed or was killed."""
        raise NotImplementedError

    def life(self, child: Child, now: float) -> tuple[float | None, bool]:
        """*Backend*: seconds since ``child`` last showed life (``None``: unknown yet), and
        whether it is still starting up (it gets :attr:`startup_timeout` then)."""
        raise NotImplementedError

    def kill(self, child: Child, hung: bool = False) -> tuple[int | None, str]:
        """*Backend*: kill ``child``'s process; its exit code and, when ``hung``, its stack."""
        raise NotImplementedError

    def discard(self, child: Child) -> None:
        """*Backend*: forget ``child``'s failed process before a restart or the end."""

    def running(self, child: Child) -> bool:
        """*Backend*: whether ``child``'s process still runs (while stopping)."""
        raise NotImplementedError

    def request_stop(self) -> None:
        """*Backend*: raise the stop flag every child looks at."""

    def escalate(self, child: Child, action: str) -> str:
        """*Backend*: do ``action`` (of :attr:`escalation`) to a child that did not stop; say
        what was done ("sending SIGTERM")."""
        raise NotImplementedError

    def stop_failure(self, child: Child) -> ChildFailure | None:
        """*Backend*: the failure of a child that crashed while stopping, or ``None``."""
        return None

    def refresh(self) -> None:
        """*Backend*: bring the main process's model, optimizers and modules up to date with
        what the children train, before the host reads them (a checkpoint)."""

    def after_stop(self) -> None:
        """*Backend*: after the children stopped, before the final checkpoint."""

    def kill_all(self) -> None:
        """*Backend*: nothing it started may outlive this call (a forced exit, an error)."""

    def release(self) -> None:
        """*Backend*: release what the run held (servers, queues, files), after the checkpoint."""

    def extra_failures(self, stopping: bool = False) -> list[ChildFailure]:
        """*Backend*: failures of what is not a child (a server the run needs); ``stopping``:
        the children have stopped and this is the last look, so one that is not answering is
        waited on until it is known lost or back (its loss is reported, not a checkpoint's
        error that follows from it)."""
        return []

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
            self.monitor.on_start(self.state, self.refresh)
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
            restarts = tuple(c.restarts for c in self.children if c.role.role == "worker")
            self.outcome = Outcome(reason, failures, restarts, round(shutdown_s, 3))
            return self.outcome
        finally:
            self.kill_all()
            if self.state is not None:  # every child is gone: save what was learned
                with contextlib.suppress(Exception):
                    self._on_stop()
            self.release()
            mark("released")

    def event(self, kind: str, message: str, **fields: Any) -> None:
        self.monitor.on_event({"event": kind, "message": message, **fields})

    def _on_stop(self) -> None:
        """Tell the monitor, once, that every child has stopped (it writes the checkpoint)."""
        if not self._stopped:
            self._stopped = True
            self.monitor.on_stop(self.steps())

    def _stop_reason(self) -> str | None:
        steps = self.steps()
        return self.monitor.on_tick(sum(steps), steps)

    def _stop_requested(self) -> str | None:
        """The signal's name when the main process was asked to stop by one, else ``None``."""
        time.sleep(0.1)  # let the main process's signal handler run
        reason = self._stop_reason()
        return reason if reason is not None and reason.startswith("SIG") else None

    def _start(self, child: Child) -> None:
        """Start (or restart) the process of ``child``'s rank."""
        ctx = self.job.context(child.role, self.state, self.channel, child.restarts)  # type: ignore[arg-type]
        child.steps_at_start = self.steps()[child.role.slot]
        child.started_at = time.monotonic()
        child.restart_at = None
        child.started = True
        mark("launch", source=child.role.source)
        self.launch(child, ctx)

    def _start_all(self) -> str | None:
        """Start the children one after another, ``--start-interval`` apart; a reason to stop
        (Ctrl-C, ...) that comes meanwhile ends the starting: what started is stopped."""
        interval = self.job.run.start_interval
        for i, child in enumerate(self.children):
            if reason := self._stop_reason():
                return reason
            self._start(child)
            if child.role.role != "worker" or i == len(self.children) - 1:
                continue
            deadline = time.monotonic() + interval
            while (now := time.monotonic()) < deadline:
                self.take()
                if reason := self._stop_reason():
                    return reason
                time.sleep(max(0.0, min(deadline, now + TICK_S) - time.monotonic()))
        return None

    def _supervise(self) -> tuple[str, list[ChildFailure]]:
        """Watch every child until the run should stop: one that fails is restarted on its rank
        while the restart limits allow it, else the run stops; a silent one counts as failed."""
        while True:
            tick = time.monotonic()
            self.take()
            asked = self._stop_reason()
            if asked is not None and asked.startswith("SIG"):
                return asked, []  # stopped by the user: nothing after it is a failure
            failures = self.extra_failures()
            for child in self.children:
                found = self._check(child) if child.live() else None
                if found is None:
                    continue
                if found.exitcode in STOP_SIGNAL_CODES and (reason := self._stop_requested()):
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
            if reason := end_reason(self.job, done) or asked:
                return reason, []
            pending = [c.restart_at for c in self.children if c.restart_at is not None]
            self.pause(
                min([self._next_look(tick), *pending]), [c for c in self.children if c.live()]
            )

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
        ended = self.exit_of(child)
        if ended is None:
            child.done = True
            return None
        if ended is not RUNNING:
            return ended
        timeout = self.job.run.worker_timeout
        silent, starting = self.life(child, time.monotonic())
        limit = max(timeout, self.startup_timeout) if starting else timeout
        if not timeout or silent is None or silent < limit:
            return None
        code, stack = self.kill(child, hung=True)
        reason = f"hung: no heartbeat for {silent:.0f} s (--worker-timeout {timeout:g}); "
        tb = f"stack when it was killed:\n{stack}" if stack.strip() else ""
        return failure(child.role, code, tb, reason + self.kill_words)

    def _restart_or_fail(self, child: Child, found: ChildFailure) -> ChildFailure | None:
        """Schedule a restart of ``child``'s rank, or return the failure that ends the run."""
        progressed = self.steps()[child.role.slot] > child.steps_at_start
        self.discard(child)
        child.in_a_row = self.policy.in_a_row(child.in_a_row, progressed)
        decision = self.policy.decide(child.role.role, child.restarts, child.in_a_row)
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
        """Stop flag, a bounded wait, then each step of :attr:`escalation` for the children
        left; what they report meanwhile is taken, so one blocked on a full queue can finish.
        Returns within about the sum of the escalation's waits, whatever the children do."""
        self.request_stop()
        running = [c for c in self.children if c.live()]
        for grace, action in self.escalation:
            deadline = time.monotonic() + grace
            while (alive := [c for c in running if self.running(c)]) and (
                time.monotonic() < deadline
            ):
                self.take()
                self.pause(min(deadline, time.monotonic() + 0.1), alive)
            for child in alive:
                words = self.escalate(child, action)
                self.event(
                    action,
                    f"{child.role.who} did not stop within {grace:g} s; {words}",
                    rank=child.role.rank,
                )
        failures = [f for c in running if (f := self.stop_failure(c)) is not None]
        failures += self.extra_failures(stopping=True)  # one lost while stopping is reported
        self.after_stop()
        for child in self.children:
            child.done = True
        return failures
