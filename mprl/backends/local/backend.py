"""The local backend: spawned processes on this machine, supervised from the main process.

The classic hand-written main, made robust: ``spawn`` context (the user's global start method is
left alone), a Manager for the plugin's control state, shared memory for its tensors and
transport, workers started one after another with an optional sleep, one optional train
process, then supervision through process sentinels, so a crashed child stops the run instead
of hanging ``join()``.
"""

from __future__ import annotations

import contextlib
import cProfile
import ctypes
import faulthandler
import glob
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import wait
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Any

import attrs
import torch

from mprl.backends import base
from mprl.backends.base import Job, Monitor, Outcome, Role
from mprl.backends.local import preflight
from mprl.backends.local.channel import LocalChannel
from mprl.backends.restart import RestartPolicy
from mprl.backends.tensors import TensorStateBuilder
from mprl.context import Context
from mprl.errors import UsageError
from mprl.run_types import ChildFailure

#: Seconds children get to return after the stop flag is set, before SIGTERM, then SIGKILL.
STOP_GRACE_S = 5.0
KILL_GRACE_S = 2.0
#: a child's first heartbeat comes after its imports; until then, and while it does other
#: start-up work (an optimizer's first use), it gets at least this long
STARTUP_TIMEOUT_S = 120.0
_STOP_SIGNALS = (-signal.SIGTERM, -signal.SIGINT)
PARENT_DIED_EXIT = 70  # a child's exit code when it left because the main process died
_BLOCKED = {signal.SIGINT, signal.SIGTERM}  # while a child starts


def _set_process_name(name: str) -> None:
    """Show ``name`` in ps / top (Linux: the 15-character comm field)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def _remove_leftovers(leftovers: Sequence[str]) -> None:
    """What a run leaves when its main process is killed: files matching the patterns are
    removed (a ``.stack`` file only when empty: it may hold a hung child's stack), directories
    only when empty, in the order given; and this process's own ``/tmp/pymp-*`` directory
    (the Manager server's listening socket is in it)."""
    for pattern in leftovers:
        for path in glob.glob(pattern):
            with contextlib.suppress(OSError):
                if os.path.isdir(path):
                    os.rmdir(path)
                elif not path.endswith(".stack") or not os.path.getsize(path):
                    os.unlink(path)
    tempdir = mp.current_process()._config.get("tempdir")  # type: ignore[attr-defined]
    if tempdir:
        shutil.rmtree(tempdir, ignore_errors=True)


def _init_child(name: str, ignore_sigterm: bool = False, leftovers: Sequence[str] = ()) -> None:
    """First thing in every child, the Manager server included.

    Ctrl-C reaches the whole process group, but only the main process decides what it means.
    SIGINT and SIGTERM arrive blocked (:func:`_child_environment`); they are unblocked once
    SIGINT is ignored (and SIGTERM, for the Manager server), so a signal to the group while a
    child is still starting does not kill it halfway. If the main process dies without stopping
    us (SIGKILL, OOM), exit: nothing else would.
    """
    _set_process_name(name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
    parent = mp.parent_process()
    if parent is not None:

        def exit_with_parent() -> None:
            parent.join()  # returns when the parent's end of the sentinel pipe closes
            _remove_leftovers(leftovers)
            os._exit(PARENT_DIED_EXIT)

        threading.Thread(target=exit_with_parent, name="mprl-parent-watch", daemon=True).start()


def _init_manager(name: str, leftovers: Sequence[str]) -> None:
    """First thing in the Manager server: as any child, and SIGTERM ignored too. A SIGTERM to the
    whole process group (``kill -TERM -PGID``, ``docker stop``) is the main process's to act on:
    it stops the run cleanly, with the shared state still there for the final checkpoint, then
    shuts the server down (which kills it if it does not go)."""
    _init_child(name, ignore_sigterm=True, leftovers=leftovers)


def _child_main(
    fn: Callable[[Context], None],
    ctx: Context,
    threads: int,
    stack_file: str,
    leftovers: Sequence[str] = (),
) -> None:
    """Entry point of every spawned child: seed, limit threads, run, report a crash.

    SIGUSR1 dumps every thread's stack to ``stack_file``: the supervisor asks for it before it
    kills a hung child, so the report says where it hung. With ``MPRL_PROFILE=1`` in the
    environment, each child's function runs under cProfile and its stats go next to it
    (``RUN_DIR/logs/worker-0.prof``; read them with ``python -m pstats``).
    """
    _init_child(mp.current_process().name, leftovers=leftovers)
    stacks = open(stack_file, "w")  # noqa: SIM115 - open for the life of the process
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    torch.set_num_threads(threads)
    base.seed_process(ctx.seed)
    ctx.heartbeat()
    profile = cProfile.Profile() if os.environ.get("MPRL_PROFILE") == "1" else None
    try:
        if profile is not None:
            profile.runcall(fn, ctx)
        else:
            fn(ctx)
        ctx._sync_learner()  # a GPU learner's optimizer state, for the final checkpoint
    except BaseException:
        ctx.channel.send(ctx._slot, {"_error": traceback.format_exc(), "source": ctx.source})
        code = 1
    else:
        code = 0
    if profile is not None:
        profile.dump_stats(str(Path(stack_file).with_suffix(".prof")))
    ctx.channel.flush()
    channel: Any = ctx.channel
    channel.records.close()
    channel.records.join_thread()  # every record (a traceback too) reaches the main process
    sys.stdout.flush()
    sys.stderr.flush()
    # skip the interpreter's teardown (a second or so with torch loaded): shutdown is faster,
    # and nothing of this process needs it (shared memory is released by the kernel)
    os._exit(code)


@contextlib.contextmanager
def _child_environment(threads: int) -> Iterator[None]:
    """What spawned children start with: thread counts, and SIGINT and SIGTERM blocked.

    The signal mask survives exec, so a Ctrl-C while a child is still importing cannot print a
    KeyboardInterrupt traceback there, and a SIGTERM to the process group cannot kill the
    Manager server before it answers; the main process gets them once starting is over.
    """
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    for key in saved:
        os.environ.setdefault(key, str(threads))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
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


def _optimizer_tensors(optimizers: list[torch.optim.Optimizer]) -> list[torch.Tensor]:
    return [
        value
        for optimizer in optimizers
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ]


@attrs.define(eq=False)
class _Child:
    """One rank of the job and the process currently running it."""

    role: Role
    process: Any = None
    stack_file: str = ""
    restarts: int = 0  # restarts spent on this rank
    in_a_row: int = 0  # failures in a row without a step in between
    steps_at_start: int = 0
    started_at: float = 0.0
    restart_at: float | None = None  # monotonic time of a pending restart
    done: bool = False  # ended for good

    def live(self) -> bool:
        return not self.done and self.restart_at is None


class LocalBackend(base.Backend):
    """Runs a job in spawned processes on this machine."""

    name = "local"

    def prepare(self, job: Job) -> list[str]:
        """Refuse a run started while a child imports the user's script; check that what the
        run shares fits ``/dev/shm`` and the open-file limit; put the model and the optimizer
        state in shared memory."""
        # spawn sets _inheriting while a child imports the parent's main module
        if getattr(mp.current_process(), "_inheriting", False):
            raise UsageError(
                "mprl.run() was called while a spawned child process was importing your "
                "script. Child processes re-import the main module, so start the run under "
                '`if __name__ == "__main__":` (see the README)'
            )
        tensors = [*job.model.parameters(), *job.model.buffers()]
        nbytes, storages = preflight.shared_bytes(
            [*tensors, *_optimizer_tensors(job.all_optimizers())]
        )
        state_bytes, state_tensors = job.algorithm.schema.memory(job.dims)
        notes = preflight.check(
            shm_bytes=nbytes + state_bytes,
            storages=storages + state_tensors + 3,  # + the channel's
            processes=len(job.roles()) + 1,
        )
        job.model.share_memory()
        for value in _optimizer_tensors(job.all_optimizers()):
            value.share_memory_()
        return notes

    def execute(self, job: Job, monitor: Monitor) -> Outcome:
        # all state lives in _LocalRun, so nothing of the run (its queue's semaphores) outlives
        # execute() through a reference to the backend
        return _LocalRun(job, monitor).execute()


class _LocalRun:
    """One job on the local backend: start, supervise (restarts, hang detection), stop."""

    def __init__(self, job: Job, monitor: Monitor) -> None:
        self.job, self.monitor = job, monitor
        self.policy = RestartPolicy.of(job.run)
        # children import torch at the same time: more of them than cores take longer to start
        cores = os.cpu_count() or 1
        self.startup_timeout = STARTUP_TIMEOUT_S * max(1.0, len(job.roles()) / cores)
        self._tmp = None if job.run_dir is not None else tempfile.TemporaryDirectory()
        # where each child's stack goes when it is killed for hanging (see _child_main)
        self.logs = Path(self._tmp.name if self._tmp else job.run_dir) / "logs"  # type: ignore[arg-type]
        self.logs.mkdir(exist_ok=True)

    def execute(self) -> Outcome:
        job, monitor = self.job, self.monitor
        self.ctx = mp.get_context("spawn")
        self.children = [_Child(role) for role in job.roles()]
        self.threads = job.run.torch_threads or threads_per_child(len(self.children))
        manager: SyncManager | None = None
        self.state: Any = None
        self._stopped = False
        records = self.ctx.Queue()
        self.errors: dict[str, str] = {}
        try:
            self.channel = channel = LocalChannel(job.run.workers, records)
            if job.initial_steps:
                channel.steps.copy_(torch.tensor(job.initial_steps, dtype=torch.int64))
            with _child_environment(self.threads):
                if job.algorithm.schema.needs_manager():
                    server = SyncManager(ctx=self.ctx)
                    try:
                        args = ("mprl-manager", self._leftovers())
                        server.start(initializer=_init_manager, initargs=args)
                    except (EOFError, OSError) as exc:  # it died before it answered
                        if reason := self._stop_requested():
                            return Outcome(reason)
                        cause = f"failed to start ({type(exc).__name__}: {exc})"
                        return Outcome("failed", [ChildFailure("Manager server", -1, None, cause)])
                    manager = server
                builder = TensorStateBuilder(
                    manager, job.model, job.algorithm.make_model, share=True, sleep=True
                )
                self.state, skipped = job.build_state(builder)
            if skipped:
                self._event("state-not-restored", skipped)
            monitor.on_start(self.state)
            server_process = manager._process if manager is not None else None  # type: ignore[attr-defined]
            reason = self._start_all()
            failures: list[ChildFailure] = []
            if reason is None:
                reason, failures = self._supervise(server_process)
            stop_start = time.monotonic()
            channel.stop()
            failures += self._stop()
            shutdown_s = time.monotonic() - stop_start
            self._on_stop()
            restarts = tuple(c.restarts for c in self.children if c.role.role == "worker")
            return Outcome(reason, failures, restarts, round(shutdown_s, 3))
        finally:
            for child in self.children:  # live children only on a forced exit or an error
                if child.process is not None:
                    if child.process.is_alive():
                        child.process.kill()
                    child.process.join()
            if self.state is not None:  # every child is gone: save what was learned
                self._on_stop()
                with contextlib.suppress(OSError):
                    if child.stack_file and not os.path.getsize(child.stack_file):
                        os.unlink(child.stack_file)  # kept when it holds a hung child's stack
            with contextlib.suppress(OSError):
                self.logs.rmdir()  # only if empty
            if self._tmp is not None:
                self._tmp.cleanup()
            records.close()
            records.join_thread()
            if manager is not None:
                manager.shutdown()
                listener = Path(str(manager.address))
                if listener.parent.name.startswith("pymp-"):  # a killed server leaves it
                    shutil.rmtree(listener.parent, ignore_errors=True)

    def _leftovers(self) -> list[str]:
        """What a child cleans up if the main process dies: a checkpoint write it cut short,
        the logs directory and the temporary run directory when empty."""
        out = [str(self.logs / "*.stack"), str(self.logs)]
        out += [self._tmp.name] if self._tmp is not None else []
        if self.job.run_dir is not None:
            out.insert(0, str(Path(self.job.run_dir) / "checkpoints" / ".*.tmp"))
        return out

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
            while time.monotonic() < deadline:
                self._drain()
                if reason := self._stop_reason():
                    return reason
                time.sleep(min(base.TICK_S, max(0.0, deadline - time.monotonic())))
        return None

    def _on_stop(self) -> None:
        """Tell the monitor, once, that every child has stopped (it writes the checkpoint)."""
        if not self._stopped:
            self._stopped = True
            self.monitor.on_stop(self.channel.steps.tolist())

    def _start(self, child: _Child) -> None:
        """Start (or restart) the process of ``child``'s rank."""
        job, role = self.job, child.role
        context = job.context(role, self.state, self.channel, child.restarts)
        if not child.stack_file:
            child.stack_file = str(self.logs / f"{role.source.replace(':', '-')}.stack")
        name = f"mprl-{role.role}" + (f"-{role.rank}" if role.rank >= 0 else "")
        child.steps_at_start = int(self.channel.steps[role.slot])
        child.started_at = time.monotonic()
        self.channel.beats[role.slot] = 0.0  # "starting": the child's first beat sets it
        child.process = self.ctx.Process(
            target=_child_main,
            args=(job.function(role), context, self.threads, child.stack_file, self._leftovers()),
            name=name,
            daemon=True,
        )
        with _child_environment(self.threads):
            child.process.start()
        child.restart_at = None

    def _supervise(self, server: Any) -> tuple[str, list[ChildFailure]]:
        """Watch every child (and the Manager server) until the run should stop.

        A child that fails is restarted on its rank while the run's restart limits allow it;
        otherwise the run stops. Children that stop sending heartbeats count as failed.
        """
        timeout = self.job.run.worker_timeout
        while True:
            self._drain()
            asked = self._stop_reason()
            if asked is not None and asked.startswith("SIG"):
                return asked, []  # stopped by the user: nothing after it is a failure
            failures = []
            if server is not None and server.exitcode is not None:
                reason = f"{base.describe_exit(server.exitcode)} (shared state is lost)"
                failures.append(ChildFailure("Manager server", -1, server.exitcode, reason))
            now = time.monotonic()
            for child in self.children:
                if not child.live():
                    continue
                code = child.process.exitcode
                if code is None:
                    last = float(self.channel.beats[child.role.slot])
                    silent = now - (abs(last) or child.started_at)
                    limit = timeout if last > 0 else max(timeout, self.startup_timeout)
                    if not timeout or silent < limit:
                        continue
                    failure = self._kill_hung(child, silent)
                elif code == 0:
                    child.done = True
                    continue
                else:
                    self._drain()
                    tb = self.errors.pop(child.role.source, "")
                    failure = base.failure(child.role, code, tb)
                    if code in _STOP_SIGNALS and self._stop_requested():
                        # SIGTERM / SIGINT sent to the whole process group (timeout, systemd,
                        # docker stop) also reached the main process: a stop, not a crash
                        return self._stop_reason(), []
                failure = self._restart_or_fail(child, failure)
                if failure is not None:
                    failures.append(failure)
            if failures:
                return "failed", failures
            for child in self.children:
                if child.restart_at is not None and now >= child.restart_at:
                    self._start(child)
            done = [c.role for c in self.children if c.done]
            if reason := base.end_reason(self.job, done) or asked:
                return reason, []
            sentinels = [c.process.sentinel for c in self.children if c.live()]
            if server is not None:
                sentinels.append(server.sentinel)
            pending = [c.restart_at for c in self.children if c.restart_at is not None]
            wait(sentinels, timeout=min([base.TICK_S, *(t - now for t in pending)]))

    def _stop_reason(self) -> str | None:
        steps = self.channel.steps.tolist()
        return self.monitor.on_tick(sum(steps), steps)

    def _stop_requested(self) -> str | None:
        """The signal's name when the main process was asked to stop by one, else ``None``."""
        time.sleep(0.1)  # let the main process's signal handler run
        reason = self._stop_reason()
        return reason if reason is not None and reason.startswith("SIG") else None

    def _kill_hung(self, child: _Child, silent: float) -> ChildFailure:
        """Dump the stack of a child that stopped sending heartbeats, then kill it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.process.pid, signal.SIGUSR1)
        time.sleep(0.2)  # faulthandler writes from its signal handler, even mid-C-call
        child.process.kill()
        child.process.join()
        try:
            stack = Path(child.stack_file).read_text()
        except OSError:
            stack = ""
        reason = (
            f"hung: no heartbeat for {silent:.0f} s (--worker-timeout "
            f"{self.job.run.worker_timeout:g}); killed"
        )
        tb = f"stack when it was killed:\n{stack}" if stack.strip() else ""
        return base.failure(child.role, child.process.exitcode, tb, reason)

    def _restart_or_fail(self, child: _Child, failure: ChildFailure) -> ChildFailure | None:
        """Schedule a restart of ``child``'s rank, or return the failure that ends the run."""
        progressed = int(self.channel.steps[child.role.slot]) > child.steps_at_start
        child.in_a_row = self.policy.in_a_row(child.in_a_row, progressed)
        decision = self.policy.decide(child.role.role, child.restarts, child.in_a_row)
        if decision.delay is None:
            child.done = True
            return attrs.evolve(failure, reason=failure.reason + decision.why_not)
        child.restarts += 1
        child.restart_at = time.monotonic() + decision.delay
        self._event(
            "restart",
            f"{failure.who} {failure.reason}; restarting it in {decision.delay:.1f} s "
            f"(restart {child.restarts} of {self.policy.max_restarts})",
            rank=child.role.rank,
            restarts=child.restarts,
            reason=failure.reason,
            traceback=failure.traceback,
        )
        return None

    def _event(self, kind: str, message: str, **fields: Any) -> None:
        self.monitor.on_event({"event": kind, "message": message, **fields})

    def _stop(self) -> list[ChildFailure]:
        """Stop flag (already set), a bounded wait, SIGTERM, a short wait, SIGKILL.

        Records keep being drained meanwhile, so a child blocked on a full queue can finish.
        Whatever the children do, this returns within about STOP_GRACE_S + KILL_GRACE_S.
        """
        running = [c for c in self.children if c.process is not None]
        for grace, escalate in ((STOP_GRACE_S, "terminate"), (KILL_GRACE_S, "kill")):
            deadline = time.monotonic() + grace
            while (alive := [c for c in running if c.process.is_alive()]) and (
                time.monotonic() < deadline
            ):
                self._drain()
                wait([c.process.sentinel for c in alive], timeout=0.1)
            for child in alive:
                signame = "SIGTERM" if escalate == "terminate" else "SIGKILL"
                self._event(
                    escalate,
                    f"{child.role.who} did not stop within {grace:g} s; sending {signame}",
                    rank=child.role.rank,
                )
                getattr(child.process, escalate)()
        failures = []
        for child in running:
            child.process.join()
            self._drain()
            code = child.process.exitcode
            if child.live() and code != 0 and child.role.source in self.errors:
                # a crash while stopping still deserves its traceback
                failures.append(base.failure(child.role, code, self.errors[child.role.source]))
            child.done = True
        return failures

    def _drain(self) -> None:
        batch = []
        while True:
            try:
                sent = self.channel.records.get_nowait()  # a child's batch of records
            except queue.Empty:
                break
            for item in self.channel.unpack(sent):
                if "_error" in item:
                    self.errors[item["source"]] = item["_error"]
                else:
                    batch.append(item)
        if batch:
            self.monitor.on_records(batch)
