"""The serial backend: a job's worker and train functions in this process, taking turns.

``python -m mprl run --serial`` (``backend="serial"``) runs every worker and the train process
as a thread of the current process, but only one at a time: each runs until its next call to
``ctx.should_stop()``, ``ctx.add_steps()``, ``ctx.log()`` or ``ctx.heartbeat()`` (or a wait on
the shared state), then hands the turn to the next one, in a fixed order (train process, then
workers by rank). Nothing is spawned and no Manager server starts; each process keeps its own
``random`` / numpy / torch random state across turns, seeded as in a spawned run, and its own
model and optimizer objects over the same memory, as a spawned process has after unpickling them
(Hogwild updates by one do not break another's ``backward()``). The interleaving depends only on
those calls, so a run is repeatable for a seed, and ``breakpoint()`` in a worker or train
function stops there with a usable prompt.

It is for debugging and for unit tests (:mod:`mprl.testing`), not for speed: one core does all
the work, a crash ends the run (no restarts) and there is no hang detection. Module-level
globals of a plugin are shared by all its "processes" here, unlike in spawned processes.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import torch

from mprl.backends import base
from mprl.backends.base import Job, Monitor, Outcome, Role
from mprl.backends.child import own_objects, run_child
from mprl.backends.inprocess import InProcessManager
from mprl.context import Context, episode_record
from mprl.run_types import ChildFailure
from mprl.schema import SharedState
from mprl.transport.memory import MemoryBuilder

#: every live process waiting (a lock, barrier, queue or event) for this long is a deadlock
DEADLOCK_S = 10.0


class _Stopped(BaseException):
    """Raised in a process that waits on shared state once the run is stopping."""


class _Proc:
    """One worker or the train process: its context, thread and random state between turns."""

    def __init__(self, index: int, role: Role, fn: Callable[[Context], None], ctx: Context):
        self.index, self.role, self.fn, self.ctx = index, role, fn, ctx
        self.turn = threading.Semaphore(0)
        self.live = True
        self.rng: tuple[Any, Any, Any] | None = None
        self.thread = threading.Thread(
            target=self._main,
            name=f"mprl-{role.kind}" + (f"-{role.rank}" if role.rank >= 0 else ""),
            daemon=True,  # a forced exit (second Ctrl-C) does not wait for it
        )
        self.run: _SerialRun | None = None

    def _main(self) -> None:
        run = self.run
        assert run is not None
        self.turn.acquire()
        run.current = self
        if not run.stopping:
            ended = run_child(self.fn, self.ctx, stopped=(_Stopped,))
            if ended.code:
                run.failures.append(base.failure(self.role, ended.code, ended.traceback))
                run.stop("failed")
        self.live = False
        run.finished(self)


class _SerialChannel:
    """The :class:`mprl.context.Channel` of serial runs: counters in this process, and every
    call is where the calling process hands the turn on."""

    def __init__(self, run: _SerialRun, initial_steps: Sequence[int], slots: int) -> None:
        self.run = run
        self.steps = list(initial_steps) if initial_steps else [0] * slots
        self.pending: list[dict[str, Any]] = []

    def should_stop(self, slot: int) -> bool:
        self.run.switch()
        return self.run.stopping

    def add_steps(self, slot: int, n: int) -> None:
        self.steps[slot] += n
        self.run.switch()

    def beat(self, slot: int, starting: bool = False) -> None:
        if not starting:
            self.run.switch()

    def idle(self, slot: int, seconds: float) -> bool:
        """A waiting process's pause: the turn to the others, as a wait on the shared state
        (every process waiting :data:`DEADLOCK_S` is a deadlock); True once stopping."""
        try:
            self.run.pause()
        except _Stopped:
            return True
        return self.run.stopping

    def env_steps(self) -> int:
        return sum(self.steps)

    def send(self, slot: int, record: dict[str, Any]) -> None:
        self.pending.append(record)
        self.run.switch()

    def episode(self, slot: int, source: str, episode_return: float, episode_length: int) -> None:
        step = self.env_steps()
        self.send(slot, episode_record(source, step, time.time(), episode_return, episode_length))

    def flush(self) -> None:
        pass


class SerialBackend(base.Backend):
    """Runs a job's processes as turn-taking threads of this process (see the module doc).

    After :meth:`execute`, ``job``, ``state`` and ``contexts`` of the last run stay readable:
    :mod:`mprl.testing` hands them to tests.
    """

    name = "serial"

    def __init__(self) -> None:
        self.job: Job | None = None
        self.state: SharedState | None = None
        self.contexts: list[Context] = []

    def execute(self, job: Job, monitor: Monitor) -> Outcome:
        run = _SerialRun(job, monitor)
        self.job, self.contexts = job, [p.ctx for p in run.procs]
        outcome = run.execute()
        self.state = run.state
        return outcome


class _SerialRun:
    def __init__(self, job: Job, monitor: Monitor) -> None:
        self.job, self.monitor = job, monitor
        self.channel = _SerialChannel(self, job.initial_steps, job.run.workers + 2)
        builder = MemoryBuilder(
            InProcessManager(self.pause), job.model, job.algorithm.make_model,
            share=False, sleep=False,
        )  # fmt: skip
        self.state, self._skipped = job.build_state(builder)
        self.failures: list[ChildFailure] = []
        self.reason: str | None = None
        self.done = threading.Event()
        self.current: _Proc | None = None
        self._last_tick = -float("inf")
        self._moved_at = time.monotonic()  # the last turn that was not a wait
        self.procs = [self._proc(i, role) for i, role in enumerate(job.roles())]

    def _proc(self, index: int, role: Role) -> _Proc:
        job = self.job
        model, optimizer, optimizers = own_objects(job.model, job.optimizer, job.optimizers)
        ctx = attrs.evolve(
            job.context(role, self.state, self.channel),
            model=model, optimizer=optimizer, optimizers=optimizers,
        )  # fmt: skip
        proc = _Proc(index, role, job.function(role), ctx)
        proc.run = self
        return proc

    @property
    def stopping(self) -> bool:
        return self.reason is not None

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def execute(self) -> Outcome:
        if self._skipped:
            self.monitor.on_event({"event": "state-not-restored", "message": self._skipped})
        self.monitor.on_start(self.state)
        for proc in self.procs:
            proc.thread.start()
        self.procs[0].turn.release()
        try:
            while not self.done.wait(base.TICK_S):
                pass
        finally:  # a second Ctrl-C too: the threads leave at their next call, and what they
            self.stop("stopped")  # learned is saved
            for proc in self.procs:
                proc.thread.join(timeout=10)
            self._round()
            self.monitor.on_stop(self.channel.steps)
        restarts = (0,) * self.job.run.workers
        return Outcome(self.reason or "stopped", self.failures, restarts, 0.0)

    def pause(self) -> None:
        """Where the shared state's locks, barriers, queues and events wait: a turn for the
        others. Raises :class:`_Stopped` once the run stops, and reports a deadlock."""
        if self.stopping:
            raise _Stopped
        if time.monotonic() - self._moved_at > DEADLOCK_S:
            raise RuntimeError(
                f"deadlock: every process has waited on the shared state for {DEADLOCK_S:g} s "
                "(a lock, barrier, queue or event that nothing will release); this is where "
                "this one waits"
            )
        self.switch(moved=False)

    def switch(self, moved: bool = True) -> None:
        """Called by the process whose turn it is: hand the turn to the next live one."""
        if moved:
            self._moved_at = time.monotonic()
        me = self.current
        if me is None or threading.current_thread() is not me.thread:
            return  # not a process of this run (the main thread building the state)
        nxt = self._next_live(me.index)
        if nxt is None or nxt.index <= me.index:
            self._round()
        if nxt is None or nxt is me:
            return
        me.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        self.current = nxt
        nxt.turn.release()
        me.turn.acquire()
        self.current = me
        random.setstate(me.rng[0])
        np.random.set_state(me.rng[1])
        torch.set_rng_state(me.rng[2])

    def _next_live(self, index: int) -> _Proc | None:
        n = len(self.procs)
        for step in range(1, n + 1):
            proc = self.procs[(index + step) % n]
            if proc.live:
                return proc
        return None

    def finished(self, proc: _Proc) -> None:
        """``proc``'s function returned or raised: the next live process gets the turn."""
        done = [p.role for p in self.procs if not p.live]
        reason = base.end_reason(self.job, done, self.channel.env_steps())
        if reason is not None:
            self.stop(reason)
        nxt = self._next_live(proc.index)
        if nxt is None:
            self.current = None
            self.done.set()
            return
        self.current = nxt
        nxt.turn.release()

    def _round(self) -> None:
        """Once per round of turns: hand the records to the monitor and ask it whether to stop.

        Asked after every new record and when the step budget is reached, so where a run stops
        does not depend on timing."""
        records, self.channel.pending = self.channel.pending, []
        if records:
            self.monitor.on_records(records)
        steps = self.channel.steps
        total = self.job.run.total_steps
        now = time.monotonic()
        due = records or (total is not None and sum(steps) >= total)
        if due or now - self._last_tick >= base.TICK_S:
            self._last_tick = now
            reason = self.monitor.on_tick(sum(steps), list(steps))
            if reason is not None:
                self.stop(reason)
