"""The local backend: spawned processes on this machine, supervised from the main process.

The classic hand-written main, made robust: ``spawn`` context (the user's global start method is
left alone), a Manager for the plugin's control state, workers started one after another with an
optional sleep, one optional train process, then supervision through process sentinels, so a
crashed child stops the run instead of hanging ``join()``.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from multiprocessing.managers import SyncManager
from typing import Any

import attrs
import numpy as np
import torch

from mprl.backend import ChildFailure, Job, Monitor, Outcome
from mprl.context import Context, derive_seed

#: Seconds children get to return after the stop flag is set, before SIGTERM, then SIGKILL.
STOP_GRACE_S = 5.0
KILL_GRACE_S = 2.0
TICK_S = 0.25
_STOP = 0  # index of the stop flag in the control tensor
_STOP_SIGNALS = (-signal.SIGTERM, -signal.SIGINT)
PARENT_DIED_EXIT = 70  # a child's exit code when it left because the main process died


@attrs.define(eq=False)
class LocalChannel:
    """Shared-memory control block and a metrics queue; nothing here talks to the Manager."""

    control: torch.Tensor  # int64 [stop flag]
    steps: torch.Tensor  # int64, one slot per worker + one for the train process
    records: Any  # multiprocessing.Queue of dict records

    def should_stop(self) -> bool:
        return bool(self.control[_STOP])

    def add_steps(self, slot: int, n: int) -> None:
        self.steps[slot] += n  # each process owns its slot: no lock needed

    def env_steps(self) -> int:
        return int(self.steps.sum())

    def send(self, record: dict[str, Any]) -> None:
        self.records.put(record)


def _set_process_name(name: str) -> None:
    """Show ``name`` in ps / top (Linux: the 15-character comm field)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def _init_child(name: str) -> None:
    """First thing in every child, the Manager server included.

    Ctrl-C reaches the whole process group, but only the main process decides what it means.
    If the main process dies without stopping us (SIGKILL, OOM), exit: nothing else would.
    """
    _set_process_name(name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = mp.parent_process()
    if parent is not None:

        def exit_with_parent() -> None:
            parent.join()  # returns when the parent's end of the sentinel pipe closes
            os._exit(PARENT_DIED_EXIT)

        threading.Thread(target=exit_with_parent, name="mprl-parent-watch", daemon=True).start()


def _child_main(fn: Callable[[Context], None], ctx: Context, threads: int) -> None:
    """Entry point of every spawned child: seed, limit threads, run, report a crash."""
    _init_child(mp.current_process().name)
    torch.set_num_threads(threads)
    random.seed(ctx.seed)
    np.random.seed(ctx.seed)
    torch.manual_seed(ctx.seed)
    try:
        fn(ctx)
    except BaseException:
        tb = traceback.format_exc()
        ctx.channel.records.put({"_error": tb, "source": ctx.source})
        ctx.channel.records.close()
        ctx.channel.records.join_thread()  # the traceback must reach the main process
        sys.exit(1)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@contextlib.contextmanager
def _child_environment(threads: int) -> Iterator[None]:
    """What spawned children start with: thread counts, and SIGINT blocked.

    The signal mask survives exec, so a Ctrl-C while a child is still importing cannot print a
    KeyboardInterrupt traceback there; the main process gets its Ctrl-C once starting is over.
    """
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    for key in saved:
        os.environ.setdefault(key, str(threads))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def threads_per_child(n_children: int) -> int:
    return max(1, (os.cpu_count() or 1) // n_children)


@attrs.define(eq=False)
class _Child:
    role: str
    rank: int
    process: Any
    done: bool = False


class LocalBackend:
    """Runs a job in spawned processes on this machine."""

    name = "local"

    def execute(self, job: Job, monitor: Monitor) -> Outcome:
        ctx = mp.get_context("spawn")
        n = job.run.workers
        has_trainer = job.algorithm.train is not None
        threads = job.run.torch_threads or threads_per_child(n + int(has_trainer))
        manager: SyncManager | None = None
        records = ctx.Queue()
        children: list[_Child] = []
        try:
            channel = LocalChannel(
                control=torch.zeros(1, dtype=torch.int64).share_memory_(),
                steps=torch.zeros(n + 1, dtype=torch.int64).share_memory_(),
                records=records,
            )
            roles = [("worker", r) for r in range(n)] + ([("trainer", -1)] if has_trainer else [])
            with _child_environment(threads):
                if job.algorithm.schema.needs_manager():
                    server = SyncManager(ctx=ctx)
                    server.start(initializer=_init_child, initargs=("mprl-manager",))
                    manager = server
                state = job.algorithm.schema.build(manager, n)
                for i, (role, rank) in enumerate(roles):
                    fn = job.algorithm.worker if role == "worker" else job.algorithm.train
                    context = Context(
                        role=role,
                        rank=rank,
                        n_workers=n,
                        seed=derive_seed(job.run.seed, rank + 1),
                        config=job.config,
                        run=job.run,
                        state=state,
                        model=job.model,
                        optimizer=job.optimizer,
                        channel=channel,
                        blocked_plugins=job.blocked_plugins,
                    )
                    name = f"mprl-{role}" + (f"-{rank}" if rank >= 0 else "")
                    proc = ctx.Process(
                        target=_child_main, args=(fn, context, threads), name=name, daemon=True
                    )
                    proc.start()
                    children.append(_Child(role, rank, proc))
                    if role == "worker" and job.run.start_interval and i < n - 1:
                        time.sleep(job.run.start_interval)
            server_process = manager._process if manager is not None else None  # type: ignore[attr-defined]
            reason, failures = self._supervise(children, channel, monitor, server_process)
            channel.control[_STOP] = 1
            failures += self._stop(children, channel, monitor)
            return Outcome(stop_reason=reason, failures=failures)
        finally:
            for child in children:  # only reached with live children on an unexpected error
                if child.process.is_alive():
                    child.process.kill()
                child.process.join()
            records.close()
            records.join_thread()
            if manager is not None:
                manager.shutdown()

    def _supervise(
        self, children: list[_Child], channel: LocalChannel, monitor: Monitor, server: Any
    ) -> tuple[str, list[ChildFailure]]:
        """Watch every child (and the Manager server) until the run should stop."""
        errors: dict[str, str] = {}
        while True:
            self._drain(channel, monitor, errors)
            failures = []
            if server is not None and server.exitcode is not None:
                reason = f"{_describe_exit(server.exitcode)} (shared state is lost)"
                failures.append(ChildFailure("Manager server", -1, server.exitcode, reason))
            for child in children:
                code = child.process.exitcode
                if code is None or child.done:
                    continue
                child.done = True
                if code != 0:
                    self._drain(channel, monitor, errors)
                    tb = errors.get(_source(child), "")
                    failures.append(
                        ChildFailure(child.role, child.rank, code, _describe_exit(code), tb)
                    )
            if failures:
                if all(f.exitcode in _STOP_SIGNALS for f in failures):
                    # SIGTERM / SIGINT sent to the whole process group (timeout, systemd,
                    # docker stop) also reaches the main process: then it is a stop, not a crash
                    time.sleep(0.1)  # let the main process's signal handler run
                    per_worker = channel.steps.tolist()
                    reason = monitor.on_tick(sum(per_worker), per_worker)
                    if reason is not None and reason.startswith("SIG"):
                        return reason, []
                return "failed", failures
            workers = [c for c in children if c.role == "worker"]
            if all(c.done for c in workers):
                return "workers finished", []
            if any(c.done for c in children if c.role == "trainer"):
                return "trainer finished", []
            per_worker = channel.steps.tolist()
            reason = monitor.on_tick(sum(per_worker), per_worker)
            if reason:
                return reason, []
            sentinels = [c.process.sentinel for c in children if not c.done]
            wait(sentinels + ([server.sentinel] if server is not None else []), timeout=TICK_S)

    def _stop(
        self, children: list[_Child], channel: LocalChannel, monitor: Monitor
    ) -> list[ChildFailure]:
        """Stop flag (already set), a bounded wait, SIGTERM, a short wait, SIGKILL.

        Records keep being drained meanwhile, so a child blocked on a full queue can finish.
        """
        errors: dict[str, str] = {}
        for grace, escalate in ((STOP_GRACE_S, "terminate"), (KILL_GRACE_S, "kill")):
            deadline = time.monotonic() + grace
            while (alive := [c for c in children if c.process.is_alive()]) and (
                time.monotonic() < deadline
            ):
                self._drain(channel, monitor, errors)
                wait([c.process.sentinel for c in alive], timeout=0.1)
            for child in alive:
                getattr(child.process, escalate)()
        failures = []
        for child in children:
            child.process.join()
            self._drain(channel, monitor, errors)
            code = child.process.exitcode
            if not child.done and code != 0 and _source(child) in errors:
                # a crash while stopping still deserves its traceback
                tb = errors[_source(child)]
                failures.append(
                    ChildFailure(child.role, child.rank, code, _describe_exit(code), tb)
                )
            child.done = True
        return failures

    @staticmethod
    def _drain(channel: LocalChannel, monitor: Monitor, errors: dict[str, str]) -> None:
        batch = []
        while True:
            try:
                record = channel.records.get_nowait()
            except queue.Empty:
                break
            if "_error" in record:
                errors[record["source"]] = record["_error"]
            else:
                batch.append(record)
        if batch:
            monitor.on_records(batch)


def _source(child: _Child) -> str:
    return "trainer" if child.role == "trainer" else f"worker:{child.rank}"
