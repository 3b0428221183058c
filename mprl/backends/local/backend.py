"""The local backend: spawned processes on this machine, supervised from the main process.

The classic hand-written main, made robust: ``spawn`` context (the user's global start method is
left alone), a Manager for the plugin's control state, shared memory for its tensors and
transport, workers started one after another with an optional sleep, one optional train
process, then supervision through process sentinels (:class:`mprl.backends.supervisor.
Supervisor`), so a crashed child stops the run instead of hanging ``join()``.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import multiprocessing as mp
import os
import queue
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import attrs
import torch

from mprl import kinds, startup
from mprl.backends import base
from mprl.backends.base import TICK_S, Job, Monitor, Outcome, Role
from mprl.backends.child import run_child
from mprl.backends.local import preflight
from mprl.backends.local.channel import LocalChannel
from mprl.backends.local.forkserver import (
    FORKSERVER_PRELOAD,
    START_METHODS,
    ForkserverWatch,
    LocalOptions,
    forkserver_pid,
    start_context,
    stop_forkserver,
)
from mprl.backends.processes import (
    ManagerServer,
    alive,
    child_environment,
    end_group,
    init_child,
    marked,
    set_subreaper,
)
from mprl.backends.supervisor import FAILED, RETURNED, RUNNING, NotStarted, Status, Supervisor
from mprl.context import Context
from mprl.errors import UsageError
from mprl.files import no_room, open_new
from mprl.run_types import ChildFailure
from mprl.schema import SharedState
from mprl.timeline import mark
from mprl.transport.memory import MemoryBuilder

#: the shared tensors a forkserver can send a child: one file descriptor each, in one message
#: of at most ``multiprocessing.forkserver.MAXFDS_TO_SEND`` (256), less its own and the pipes'
FORKSERVER_FDS = 256 - 16
#: the environment variable every child of a run, and what it starts, carries (its run's mark)
RUN_MARK = "MPRL_RUN_MARK"
#: seconds a child gets to be gone once it was killed
KILLED_S = 5.0


def _child_main(
    fn: Callable[[Context], None],
    ctx: Context,
    threads: int,
    stack_file: str,
    leftovers: Sequence[str] = (),
    run_mark: str = "",
) -> None:
    """Entry point of every spawned child: the child runtime, then its crash report sent.

    SIGUSR1 dumps every thread's stack to ``stack_file`` (removed at the end when empty): the
    supervisor asks for it before it kills a hung child, so the report says where it hung. With
    ``MPRL_PROFILE=1`` in the environment, the function runs under cProfile and its stats go
    next to it (``RUN_DIR/logs/worker-0.prof``; read them with ``python -m pstats``).
    """
    mark("child-main", source=ctx.source)
    os.environ[RUN_MARK] = run_mark  # what it starts carries it: found at the run's end
    init_child(mp.current_process().name, leftovers=leftovers)
    try:
        stacks = open(stack_file, "w", opener=open_new)  # noqa: SIM115 - for the process's life
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    except OSError:  # no room (a full disk, no inodes left): a hang is reported without a stack
        pass
    profile = os.environ.get("MPRL_PROFILE") == "1"
    ended = run_child(
        fn, ctx, threads=threads,
        profile_to=str(Path(stack_file).with_suffix(".prof")) if profile else None,
    )  # fmt: skip
    if ended.traceback:
        ctx.log(_error=ended.traceback)  # the supervisor puts it in the failure's report
    ctx.channel.flush()
    channel: Any = ctx.channel
    channel.records.close()
    channel.records.join_thread()  # every record (a traceback too) reaches the main process
    sys.stdout.flush()
    sys.stderr.flush()
    # skip the interpreter's teardown: nothing of this process needs it (shared memory is
    # released by the kernel); why: see benchmarks/README.md, "Skipping the interpreter's teardown"
    os._exit(ended.code)


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


class LocalBackend(base.Backend):
    """Runs a job in spawned processes on this machine."""

    name = "local"
    start_method = START_METHODS[0]  # the run's, once prepare() has read it

    def prepare(self, job: Job) -> list[str]:
        """Refuse a run started while a child imports the user's script; check that what the
        run shares fits ``/dev/shm`` and the open-file limit; put the model and the optimizer
        state in shared memory."""
        # spawn sets _inheriting while a child imports the parent's main module
        if getattr(mp.current_process(), "_inheriting", False):
            raise UsageError(
                "mprl.run() was called while a spawned child process was importing your "
                "script. Child processes re-import the main module, so start the run under "
                '`if __name__ == "__main__":` (see docs/running.md)'
            )
        tensors = [*job.model.parameters(), *job.model.buffers()]
        nbytes, storages = preflight.shared_bytes(
            [*tensors, *_optimizer_tensors(job.all_optimizers())]
        )
        state_bytes, state_tensors = kinds.memory(job.algorithm.schema, job.dims)
        shared = storages + state_tensors + 3  # + the channel's
        notes = preflight.check(
            shm_bytes=nbytes + state_bytes, storages=shared, processes=len(job.roles()) + 1
        )
        self.start_method = job.run.of(LocalOptions).start_method
        if self.start_method == "forkserver" and shared > FORKSERVER_FDS:
            self.start_method = "spawn"
            notes.append(
                f"children start with spawn: the run shares {shared} tensors, more than a "
                f"forkserver can send a child ({FORKSERVER_FDS}, one file descriptor each)"
            )

        def put() -> None:
            job.model.share_memory()
            for value in _optimizer_tensors(job.all_optimizers()):
                value.share_memory_()

        preflight.share(put, "the model and the optimizer state")
        early = startup.claim("local")  # the forkserver started ahead, if any: this run's
        if early is not None and self.start_method != "forkserver":
            early.stop()
        return notes

    def execute(self, job: Job, monitor: Monitor) -> Outcome:
        # all state lives in the supervisor, so nothing of the run (its queue's semaphores)
        # outlives execute() through a reference to the backend
        return _LocalSupervisor(job, monitor, self.start_method).execute()


class _Process:
    """A spawned child (:class:`mprl.backends.supervisor.ChildHandle`): seen through its exit
    code and its heartbeat in the run's shared memory; its stack dumped by SIGUSR1. A child of
    a forkserver that ended is the main process's own (its subreaper): its exit is read here."""

    def __init__(self, run: _LocalSupervisor, role: Role, process: Any, stack_file: str) -> None:
        self.run, self.role, self.process, self.stack_file = run, role, process, stack_file
        self.started_at = time.monotonic()
        self.server = forkserver_pid() if run.start_method == "forkserver" else None
        self._ended: Status | None = None

    def _code(self) -> int | None:
        """Its exit code, ``None`` while it runs."""
        code = self.process.exitcode
        if code == 255 and self.server is not None:  # (what a forkserver's end also gives)
            try:  # its forkserver ended before it: the child is ours (subreaper), and its code
                pid, status = os.waitpid(self.process.pid, os.WNOHANG)
            except ChildProcessError:  # not ours: it exited with 255, or is not ours yet
                return None if alive(self.process.pid) else code
            return None if pid == 0 else os.waitstatus_to_exitcode(status)
        return code

    def poll(self) -> Status:
        if self._ended is not None:
            return self._ended
        code = self._code()
        if code is None:
            last = float(self.run.channel.beats[self.role.slot])  # negative: starting up
            since = max(abs(last) or self.started_at, self.run.resumed_at)  # (Ctrl-Z, fg)
            return Status(RUNNING, time.monotonic() - since, last <= 0)
        self.run.take()  # its last records, a traceback among them
        traceback = self.run.errors.pop(self.role.source, "")
        self._ended = Status(RETURNED) if code == 0 else Status(FAILED, code=code,
                                                                 traceback=traceback)  # fmt: skip
        return self._ended

    def stop(self) -> None:
        self.run.channel.stop()

    def kill(self, stack: bool = False) -> str:
        pid = self.process.pid
        if stack and alive(pid):  # faulthandler writes from its signal handler
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + KILLED_S  # (bounded: never a wait on the forkserver)
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        end_group(pid)  # what it started goes too (this process's to reap: its subreaper)
        _reap_group(pid)
        if not stack:
            return ""
        try:
            return Path(self.stack_file).read_text()
        except OSError:
            return ""


class _NotStarted:
    """A child whose start failed (its forkserver stopped, the run stopped meanwhile)."""

    def __init__(self, why: str) -> None:
        self.status = Status(FAILED, reason=why)

    def poll(self) -> Status:
        return self.status

    def stop(self) -> None:
        pass

    def kill(self, stack: bool = False) -> str:
        return ""


class _LocalSupervisor(Supervisor):
    """Spawned processes, seen through their sentinels and the shared-memory heartbeats."""

    def __init__(self, job: Job, monitor: Monitor, start_method: str) -> None:
        super().__init__(job, monitor)
        self._tmp = None if job.run_dir is not None else tempfile.TemporaryDirectory()
        self.logs = Path(self._tmp.name if self._tmp else job.run_dir) / "logs"  # type: ignore[arg-type]
        self.start_method = start_method
        self.spawn = start_context(start_method)
        self.threads = job.run.torch_threads or threads_per_child(len(self.children))
        self.records = self.spawn.Queue()
        self.errors: dict[str, str] = {}
        self.channel = LocalChannel(job.run.workers, self.records)
        if job.initial_steps:
            self.channel.steps.copy_(torch.tensor(job.initial_steps, dtype=torch.int64))
        self.stacks: list[str] = []
        self.mark = secrets.token_hex(8)  # what the run's children, and what they start, carry
        self.watch = ForkserverWatch()
        self.resumed_at = 0.0  # when the run went on after a Ctrl-Z (hang clocks start again)
        self.was_subreaper = set_subreaper(True)  # orphans of the run's children come here

    def execute(self) -> Outcome:
        """The supervisor's template, with Ctrl-Z taken to the run's children too."""
        terminal = threading.current_thread() is threading.main_thread()
        before = signal.signal(signal.SIGTSTP, self._suspend) if terminal else None
        try:
            return super().execute()
        finally:
            if terminal:
                signal.signal(signal.SIGTSTP, before)

    def _suspend(self, signum: int, frame: Any) -> None:
        """Ctrl-Z: the children (in process groups of their own, which the terminal's signal
        does not reach) stop with this process, and go on with it (``fg``, ``bg``)."""
        groups = [h.process.pid for h in self._handles() if h._ended is None]
        groups += [self.server.process.pid] if self.server is not None else []
        for group in groups:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stopped here, until the shell continues the job
        signal.signal(signal.SIGTSTP, self._suspend)
        for group in groups:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGCONT)
        self.resumed_at = time.monotonic()

    def _handles(self) -> list[_Process]:
        return [c.handle for c in self.children if isinstance(c.handle, _Process)]

    def _leftovers(self) -> list[str]:
        """What a child cleans up if the main process dies: a checkpoint write it cut short,
        the logs directory and the temporary run directory when empty."""
        out = [str(self.logs / "*.stack"), str(self.logs)]
        out += [self._tmp.name] if self._tmp is not None else []
        if self.job.run_dir is not None:
            out.insert(0, str(Path(self.job.run_dir) / "checkpoints" / ".*.tmp"))
        return out

    def build_state(self) -> tuple[SharedState, str | None]:
        job = self.job
        try:
            self.logs.mkdir(exist_ok=True)
        except OSError as exc:  # a full disk, no inodes left, a directory removed
            words = no_room(self.logs) if exc.errno == errno.ENOSPC else exc.strerror or exc
            why = f"cannot make {self.logs} ({words})"
            raise NotStarted(Outcome("failed", [ChildFailure("run", -1, None, why)])) from None
        if kinds.needs_manager(job.algorithm.schema):
            try:  # spawned, not forked from the forkserver: its life is its own
                self.server = ManagerServer(leftovers=self._leftovers(), threads=self.threads)
            except (EOFError, OSError) as exc:  # it died before it answered
                if reason := self.stop_requested():
                    raise NotStarted(Outcome(reason)) from None
                cause = f"failed to start ({type(exc).__name__}: {exc})"
                failed = ChildFailure("Manager server", -1, None, cause)
                raise NotStarted(Outcome("failed", [failed])) from None
            mark("manager")
        manager = self.server.manager if self.server is not None else None
        with child_environment(self.threads):
            builder = MemoryBuilder(
                manager, job.model, job.algorithm.make_model, share=True, sleep=True
            )
            return job.build_state(builder)

    def start(self, role: Role, ctx: Context) -> _Process | _NotStarted:
        stack_file = str(self.logs / f"{role.source.replace(':', '-')}.stack")
        self.stacks.append(stack_file)
        self.channel.beats[role.slot] = 0.0  # "starting": the child's first beat sets it
        process = self.spawn.Process(
            target=_child_main,
            args=(self.job.function(role), attrs.evolve(ctx, channel=self.channel),
                  self.threads, stack_file, self._leftovers(), self.mark),
            name=f"mprl-{role.kind}" + (f"-{role.rank}" if role.rank >= 0 else ""),
            daemon=True,
        )  # fmt: skip
        why = self._launch(process)
        if why is not None and "stopped" in why:  # its forkserver was: a new one, once
            why = self._launch(process)
        return _Process(self, role, process, stack_file) if why is None else _NotStarted(why)

    def _launch(self, process: Any) -> str | None:
        """Start ``process`` in a thread of its own (the signals of this one keep working),
        never waiting on a stopped forkserver for ever; why it did not start, else ``None``."""
        failed: list[BaseException] = []

        def start() -> None:
            try:
                with child_environment(self.threads):
                    process.start()
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=start, name="mprl-start", daemon=True)
        thread.start()
        said = None
        while thread.join(0.1) or thread.is_alive():
            asked = self._stop_reason()  # a Ctrl-C: the forkserver it waits on goes now
            said = self.watch.look(time.monotonic(), at_once=bool(asked)) or said
            if said:
                self.event("forkserver", said)
        if not failed:
            return None
        return said or f"could not start ({type(failed[0]).__name__}: {failed[0]})"

    def take(self) -> list[int]:
        said = self.watch.look(time.monotonic())
        if said:
            self.event("forkserver", said)
        batch = []
        while True:
            try:
                sent = self.records.get_nowait()  # a child's batch of records
            except queue.Empty:
                break
            for item in self.channel.unpack(sent):
                if "_error" in item:
                    self.errors[item["source"]] = item["_error"]
                else:
                    batch.append(item)
        if batch:
            self.monitor.on_records(batch)
        return self.channel.steps.tolist()

    def wait(self, until: float, handles: Sequence[Any]) -> None:
        sentinels = [h.process.sentinel for h in handles if isinstance(h, _Process)]
        if self.server is not None:
            sentinels.append(self.server.process.sentinel)
        wait(sentinels, timeout=max(0.0, min(until - time.monotonic(), TICK_S)))

    def release(self) -> None:
        self._end_what_children_left()
        for stack_file in set(self.stacks):
            with contextlib.suppress(OSError):
                if not os.path.getsize(stack_file):
                    os.unlink(stack_file)  # kept when it holds a hung child's stack
        with contextlib.suppress(OSError):
            self.logs.rmdir()  # only if empty
        if self._tmp is not None:
            self._tmp.cleanup()
        self.records.close()
        self.records.join_thread()
        if self.server is not None:
            self.server.shutdown()
        stop_forkserver()
        set_subreaper(self.was_subreaper)

    def _end_what_children_left(self) -> None:
        """A process a child started and left running (a daemon: a new session, a double fork)
        ends with the run, and is said: nothing of a run outlives it."""
        ours = {forkserver_pid(), self.server and self.server.process.pid}
        ours |= {h.process.pid for h in self._handles()}
        with open("/proc/self/cmdline", "rb") as f:  # the children's, if forked from here
            forked = (FORKSERVER_PRELOAD[0].encode(), f.read())
        for _ in range(3):  # a leftover's own children come here when it is killed
            left = [p for p in marked(RUN_MARK, self.mark, forked) if p not in ours]
            for pid in left:
                command = _command(pid)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, 0)  # an orphan that came to this process: reaped
                self.event("leftover", f"a process the run's children left running (pid {pid}: "
                           f"{command}) was killed")  # fmt: skip
            if not left:
                return


def _reap_group(group: int) -> None:
    """Reap what of process group ``group`` came to this process (orphans of a child, which
    find this process as their subreaper), once they are gone: no zombie is left."""
    deadline = time.monotonic() + 1.0
    with contextlib.suppress(ChildProcessError):
        while time.monotonic() < deadline:
            if os.waitpid(-group, os.WNOHANG)[0] == 0:
                time.sleep(0.01)


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    return text if len(text) <= 80 else text[:77] + "..."
