"""mprl-threads: a backend that runs a job's workers and train process as threads of the main
process (``--backend threads``).

For environments that release the GIL while they step (EnvPool, MuJoCo): no process to start,
no memory to share, a few MB per child instead of a process's 160 MB. Python code still runs one
thread at a time, so a worker that spends its time in Python gains nothing over the local
backend. Written only against mprl's documented backend seam (docs/backends.md, "Writing a
backend"): a :class:`~mprl.backends.supervisor.Supervisor` told how the shared state is built,
how a child starts (a :class:`~mprl.backends.supervisor.ChildHandle`), what the children
reported, and what to release; it passes :class:`mprl.testing.BackendConformance`.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import attrs

import mprl
from mprl.backends.base import Backend, Job, Monitor, Outcome, Role
from mprl.backends.child import ChildChannel, ChildExit, own_objects, run_child
from mprl.backends.inprocess import InProcessManager
from mprl.backends.supervisor import FAILED, RETURNED, RUNNING, Status, Supervisor
from mprl.context import Context
from mprl.transport.memory import MemoryBuilder


class _Killed(BaseException):
    """Raised in a thread to end it (threads cannot be killed from outside)."""


class _Thread:
    """One child as a thread (a :class:`~mprl.backends.supervisor.ChildHandle`)."""

    def __init__(self, fn: Callable[[Context], None], ctx: Context, channel: ChildChannel):
        self.channel = channel
        self.ended: ChildExit | None = None
        self.thread = threading.Thread(
            target=self._main, args=(fn, ctx), name=f"mprl-{ctx.source}", daemon=True
        )
        self.thread.start()

    def _main(self, fn: Callable[[Context], None], ctx: Context) -> None:
        self.ended = run_child(fn, ctx)  # never raises: how it ended, with the traceback

    def poll(self) -> Status:
        if self.thread.is_alive() or self.ended is None:
            beat = self.channel.last_beat  # negative while in start-up work, 0 before
            silent = None if beat == 0 else time.monotonic() - abs(beat)
            return Status(RUNNING, silent, beat <= 0)
        if self.ended.code == 0:
            return Status(RETURNED)
        return Status(FAILED, code=self.ended.code, traceback=self.ended.traceback)

    def stop(self) -> None:
        self.channel.stopping = True

    def kill(self, stack: bool = False) -> str:
        frame = sys._current_frames().get(self.thread.ident or -1)
        text = "".join(traceback.format_stack(frame)) if stack and frame is not None else ""
        if self.thread.is_alive():  # raised at its next Python instruction (not in a C call)
            ident = ctypes.c_ulong(self.thread.ident or 0)
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, ctypes.py_object(_Killed))
            self.thread.join(2.0)
        return text


class _Threads(Supervisor):
    """A job's children as threads: state in this process's memory, a channel each."""

    def __init__(self, job: Job, monitor: Monitor) -> None:
        super().__init__(job, monitor)
        self.base = list(self.steps())  # per slot: the steps of the threads before the live one
        self.threads: dict[int, _Thread] = {}

    def build_state(self) -> tuple[Any, str | None]:
        job = self.job
        builder = MemoryBuilder(
            InProcessManager(), job.model, job.algorithm.make_model, share=False, sleep=True
        )
        return job.build_state(builder)

    def start(self, role: Role, ctx: Context) -> _Thread:
        model, optimizer, optimizers = own_objects(ctx.model, ctx.optimizer, ctx.optimizers)
        channel = ChildChannel()
        ctx = attrs.evolve(ctx, channel=channel, model=model, optimizer=optimizer,
                           optimizers=optimizers)  # fmt: skip
        before = self.threads.get(role.slot)
        if before is not None:  # a restart: the slot's steps go on from the last thread's
            self.base[role.slot] += before.channel.steps
        self.threads[role.slot] = thread = _Thread(self.job.function(role), ctx, channel)
        return thread

    def take(self) -> list[int]:
        steps, records = list(self.base), []
        total = sum(self.steps())
        for slot, thread in self.threads.items():
            channel = thread.channel
            records += channel.take()
            steps[slot] += channel.steps
            channel.total, channel.steps_at_total = total, channel.steps
        if records:
            self.monitor.on_records(records)
        return steps

    def release(self) -> None:
        self.threads.clear()


class ThreadsBackend(Backend):
    """``--backend threads``: a job's processes as threads of this one."""

    name = "threads"

    def execute(self, job: Job, monitor: Monitor) -> Outcome:
        return _Threads(job, monitor).execute()


@mprl.hookimpl
def mprl_register_backends(register: Callable[..., None]) -> None:
    register("threads", ThreadsBackend, "threads of this process (envs that release the GIL)")
