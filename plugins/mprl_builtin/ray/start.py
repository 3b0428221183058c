"""Ray started on this machine for one run (``--backend ray`` with no address): its start, its
stop, and the early start of ``python -m mprl run --backend ray`` (:mod:`mprl.startup`), which
begins Ray's start as the command's first act, so Ray's processes start while the main process
imports torch and prepares the run (as the local backend's forkserver does).

Nothing here imports torch or the Ray backend.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from mprl.errors import UsageError
from mprl.run_types import RunConfig
from mprl.startup import Command, exit_on_terminate
from mprl.timeline import mark
from mprl_builtin.ray.options import RayOptions, learner_resources, worker_cpus

QUIET = {"log_to_driver": False, "logging_level": "WARNING"}


def start_here(cpus_needed: float) -> Path | None:
    """Start Ray on this machine (its session directory, when Ray says it)."""
    import ray

    # Ray's processes (GCS, raylet, the actors they start) inherit a mask with the terminal's
    # signals blocked: Ctrl-C and a closed terminal reach the whole process group, but they are
    # the driver's to act on (a clean stop), as they are for the local backend's children
    terminal = {signal.SIGINT, signal.SIGHUP}
    with without_auth_note(), without(INIT_LOGGER, THREAD_NOTE), _blocked(terminal):
        ray.init(
            address="local",
            num_cpus=max(os.cpu_count() or 1, int(-(-cpus_needed // 1))),
            include_dashboard=False,
            # Ray starts workers at nice 15; the run's processes are the work here
            _system_config={"worker_niceness": 0},
            **QUIET,
        )
    mark("ray-started", thread=threading.current_thread().name)
    return session_dir()  # Ray's logs of this run: removed unless it fails


def session_dir() -> Path | None:
    """The session directory (the logs) of the Ray this process runs on, when Ray says it."""
    import ray

    with contextlib.suppress(Exception):
        node = ray._private.worker._global_node  # no public accessor
        return Path(node.get_session_dir_path())
    return None


def sessions_of_this_process() -> set[Path]:
    """The session directories of the Rays this process started (Ray names each after the
    pid of the process that starts it) in Ray's temp dir."""
    with contextlib.suppress(Exception):  # (where Ray keeps them: no public accessor)
        from ray._common.utils import get_default_ray_temp_dir

        return set(Path(get_default_ray_temp_dir()).glob(f"session_*_{os.getpid()}"))
    return set()


def end_processes_of(session: Path, wait_s: float = 10.0) -> None:
    """Kill the processes whose command line names the session directory ``session`` (those of
    a Ray this process started), and wait up to ``wait_s`` for them to be gone: what
    ``ray.shutdown()`` does not reach (an agent its raylet started, still starting on a loaded
    machine), which would write its logs in the session again once it is removed."""
    needle, deadline = str(session).encode(), time.monotonic() + wait_s
    while True:
        found = []
        for entry in os.listdir("/proc"):
            with contextlib.suppress(OSError):
                if entry.isdigit() and needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
        if not found or time.monotonic() > deadline:
            return
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def stop(session: Path | None) -> None:
    """Stop the Ray this process started, and remove its logs (``session``)."""
    import ray

    ray.shutdown()
    if session is not None:
        end_processes_of(session)
        remove_session(session)


# -- the early start -------------------------------------------------------------------------


def wants_embedded(command: Command) -> float | None:
    """The CPUs a run of ``command`` reserves on a Ray started on this machine for it, as far
    as the command line and ``RAY_ADDRESS`` say (a config file may still name an address,
    another backend or other counts); ``None`` when it runs on no such Ray, or when the
    command will be refused for its Ray options."""
    if command.value(RunConfig, "backend") != "ray" or os.environ.get("RAY_ADDRESS"):
        return None
    if "ray_address" in command.options or importlib.util.find_spec("ray") is None:
        return None
    try:
        learner = learner_resources(command.value(RayOptions, "learner_resources"))
        cpus = worker_cpus(command.value(RayOptions, "worker_cpus"))
    except UsageError:  # refused by the command's parser, which says why: no Ray for it
        return None
    return command.value(RunConfig, "workers") * cpus + learner.get("CPU", 1.0)


#: the longest an exit waits for Ray's start on this machine to end, before it stops that Ray
START_WAIT_S = 60.0


def _release_import_lock() -> None:
    """Release the interpreter's import lock where this thread holds it, as it may after a
    Ctrl-C that cut an import between the lock's taking and its release (the start's thread,
    importing too, would wait for it for ever). Called where this thread imports nothing; a
    lock another thread holds is left alone (``RuntimeError``: not this thread's)."""
    import _imp

    with contextlib.suppress(RuntimeError):
        while _imp.lock_held():
            _imp.release_lock()


class EarlyRay:
    """Ray starting on this machine in a thread (:func:`start`'s handle): Ray's processes
    start while this process imports torch and prepares the run, which then takes it
    (:func:`mprl_builtin.ray.cluster.connect`)."""

    def __init__(self, cpus: float) -> None:
        self.out: list[tuple[Path | None, BaseException | None]] = []
        self.started = threading.Event()
        self.released = threading.Event()
        import argparse  # noqa: F401  (what ray.init imports, imported here first: see stop())

        import ray  # noqa: F401  (here: its atexit shutdown then runs after ours)

        self.thread = threading.Thread(target=self._start, args=(cpus,), name="mprl-ray-start",
                                       daemon=True)  # fmt: skip
        self.thread.start()
        mark("ray-starting")

    def _start(self, cpus: float) -> None:
        before = sessions_of_this_process()
        try:
            self.out.append((start_here(cpus), None))
        except BaseException as exc:  # said by connect(), which starts Ray again
            # a start that failed part-way (a raylet slow to register on a loaded machine) has
            # made its session directory all the same: it goes when this start is stopped
            made = sorted(sessions_of_this_process() - before)
            self.out.append((made[-1] if made else None, exc))
        self.started.set()
        # Linux sends Ray's processes the parent-death signal when the thread that started
        # them ends, not the process: this thread lives until Ray is stopped
        self.released.wait()

    def take(self) -> tuple[Path | None, BaseException | None]:
        """What the start ended with, once it has ended: ``(session, None)`` or ``(None,
        exception)``. A Ctrl-C meanwhile comes once Ray has started (it is stopped again)."""
        try:
            while not self.started.wait(0.1):  # a Ctrl-C comes between two waits
                pass
            return self.out[0]  # (one just as it ends, too)
        except KeyboardInterrupt:
            self.started.wait()
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the Ray it started (once started), and remove its logs. The wait for the start
        is bounded (:data:`START_WAIT_S`): a Ctrl-C that cut an import of this thread can leave
        the import lock held (released here first), and the start, importing too, would wait
        for it for ever; past the bound this process exits without it, and the processes Ray
        had started get their parent-death signal as the start's thread ends with it."""
        _release_import_lock()
        if not self.started.wait(START_WAIT_S):
            with contextlib.suppress(Exception):  # (the reader may be gone)
                print(
                    f"mprl: Ray's start on this machine did not end within {START_WAIT_S:g} s; "
                    "exiting without it",
                    file=sys.stderr,
                    flush=True,
                )
            return
        session, failed = self.out[0]
        if failed is None:
            stop(session)
            self.released.set()
            return
        # a start that failed part-way: what it started ends with its thread (the parent-death
        # signal), but not what that started in turn (Ray's agents outlive their raylet for
        # seconds, and write their logs in the session meanwhile)
        self.released.set()
        self.thread.join(START_WAIT_S)
        if session is not None:
            end_processes_of(session)
            remove_session(session)


def start(command: Command) -> EarlyRay | None:
    """The early start (entry point ``mprl.early: ray``): Ray on this machine, in a thread,
    when ``command`` :func:`wants_embedded` it. A run that turns out not to use it stops it
    once its backend has prepared, and so does this process's exit (a usage error, Ctrl-C)."""
    cpus = wants_embedded(command)
    if cpus is None:
        return None
    exit_on_terminate()  # Ray's start ends, then it is stopped
    return EarlyRay(cpus)


@contextlib.contextmanager
def _blocked(signals: set[signal.Signals]) -> Iterator[None]:
    """``signals`` blocked in this thread (a signal that comes meanwhile is delivered after)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


#: what Ray (2.5x and later) logs on every ``ray.init()`` that starts a cluster while
#: ``RAY_AUTH_MODE`` is unset, having turned token authentication on for it
AUTH_NOTE = "Token authentication is enabled for this Ray cluster"
AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
#: what Ray logs when ``ray.init()`` runs outside the main thread (the early start, a join in
#: time): the driver's SIGTERM is mprl's to handle, as on every backend
THREAD_NOTE = "SIGTERM handler is not set because current thread is not the main thread"
INIT_LOGGER = "ray._private.worker"


class _Drop(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


@contextlib.contextmanager
def without(logger_name: str, text: str) -> Iterator[None]:
    """Ray's log records that contain ``text`` left out meanwhile: news about something that
    is not the user's to act on. Everything else Ray says is said."""
    logger = logging.getLogger(logger_name)
    drop = _Drop(text)
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def without_auth_note() -> contextlib.AbstractContextManager[None]:
    """Ray's :data:`AUTH_NOTE` left out while mprl starts its own throw-away cluster for one
    run: news about a cluster the user never sees. Authentication is as Ray sets it (token
    authentication on, as the note says); joining a cluster (``--ray-address``) goes
    elsewhere, and whatever Ray says there about it is said."""
    return without(AUTH_LOGGER, AUTH_NOTE)


def remove_session(session: Path) -> None:
    """Remove an embedded Ray's session directory (its logs) and the link to it."""
    shutil.rmtree(session, ignore_errors=True)
    latest = session.parent / "session_latest"
    with contextlib.suppress(OSError):
        if latest.is_symlink() and Path(os.readlink(latest)) in (session, Path(session.name)):
            latest.unlink()
