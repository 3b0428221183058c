"""What the backends that start operating-system processes share: how a child process starts
(its name, signals, the parent-death watch), what it cleans up when the main process dies, and
the Manager server that holds a run's Manager kinds (the local backend's on a Unix socket, the
Ray backend's on TCP with the run's key)."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import math
import multiprocessing as mp
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing import resource_tracker
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Any

from mprl.errors import UsageError
from mprl.run_types import ChildFailure

KIB, MIB, GIB = 2**10, 2**20, 2**30
#: the memory of one child of its own: torch, gymnasium and an env imported (see
#: benchmarks/README.md, "A child's memory: 160 MiB")
CHILD_BYTES = 160 * MIB
PARENT_DIED_EXIT = 70  # a child's exit code when it left because the main process died
#: seconds the Manager server may stay stopped (SIGSTOP, a debugger) before it is killed: every
#: read of shared state waits on it, the main process's too, with no timeout of its own
MANAGER_STOPPED_S = 5.0


#: the signals a child starts with blocked (:func:`child_environment`)
BLOCKED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextlib.contextmanager
def child_environment(threads: int) -> Iterator[None]:
    """What children (and a server they fork from) start with: thread counts, and SIGINT,
    SIGTERM and SIGHUP blocked.

    The signal mask survives exec, so a Ctrl-C while a child is still importing cannot print a
    KeyboardInterrupt traceback there, and a SIGTERM to the process group cannot kill the
    Manager server before it answers; the main process gets them once starting is over.
    """
    # multiprocessing's resource tracker, started with the first child, unblocks SIGINT and
    # SIGTERM once it has started (SIG_UNBLOCK, not the mask it found): started before they
    # are blocked, or the child after it (the forkserver) would start with them unblocked, and
    # a Ctrl-C would kill it in its imports ("Fatal Python error: init_import_site")
    resource_tracker.ensure_running()
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    for key in saved:
        os.environ.setdefault(key, str(threads))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (``MemAvailable``), ``None`` where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def describe_exit(code: int | None) -> str:
    """A process's exit code in words: ``killed by signal SIGKILL``, ``exited with code 3``."""
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def set_process_name(name: str) -> None:
    """Show ``name`` in ps / top (Linux: the 15-character comm field)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def remove_leftovers(leftovers: Sequence[str]) -> None:
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


def init_child(name: str, ignore_sigterm: bool = False, leftovers: Sequence[str] = ()) -> None:
    """First thing in every child process, the Manager server included.

    Ctrl-C (and a closed terminal's SIGHUP) reaches the whole process group, but only the main
    process decides what it means. SIGINT, SIGTERM and SIGHUP arrive blocked
    (:func:`child_environment`), or ignored in a child forked from the forkserver
    (:mod:`mprl.backends.local.forkserver_init`); they are unblocked once SIGINT and SIGHUP are
    ignored and SIGTERM is the default (ignored, for the Manager server), so a signal to the
    group while a child is still starting does not kill it halfway. If the main process dies
    without stopping us (SIGKILL, OOM), exit: nothing else would.
    """
    set_process_name(name)
    # a process group of its own: what it starts (a plugin's subprocess, a fork) is ended with
    # it (end_group), and a signal to the main process's group is the main process's to act on
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_sigterm else signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, BLOCKED)
    parent = mp.parent_process()
    if parent is not None:

        def exit_with_parent() -> None:
            parent.join()  # returns when the parent's end of the sentinel pipe closes
            remove_leftovers(leftovers)
            with contextlib.suppress(OSError):  # what it started goes too, then itself
                os.killpg(0, signal.SIGKILL)
            os._exit(PARENT_DIED_EXIT)

        threading.Thread(target=exit_with_parent, name="mprl-parent-watch", daemon=True).start()


def _init_manager(name: str, leftovers: Sequence[str]) -> None:
    """First thing in the Manager server: as any child, and SIGTERM ignored too. A SIGTERM to the
    whole process group (``kill -TERM -PGID``, ``docker stop``) is the main process's to act on:
    it stops the run cleanly, with the shared state still there for the final checkpoint, then
    shuts the server down (which kills it if it does not go).

    Its listening socket goes in a ``pymp-*`` directory of its own, not in the one it inherits
    from the main process (which holds the forkserver's socket): the main process removes the
    server's directory when it shuts the server down."""
    mp.current_process()._config["tempdir"] = None  # type: ignore[attr-defined]
    init_child(name, ignore_sigterm=True, leftovers=leftovers)


def end_group(pid: int) -> None:
    """Kill what is left of the process group of child ``pid`` (which has ended): processes a
    plugin started and left running. A group id is not reused while the group has members."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def size_text(nbytes: float) -> str:
    """``nbytes`` for a message: MiB from 1 MiB up, KiB below (never "0 MiB" for 300 KiB)."""
    if nbytes >= MIB:
        return f"{nbytes / MIB:,.0f} MiB"
    return f"{math.ceil(nbytes / KIB):,} KiB"


def check_memory(processes: int, available: int | None = None, shared_bytes: int = 0) -> list[str]:
    """Refuse a run whose child processes and shared state (model, optimizer state, replay
    buffers, rollouts: ``shared_bytes``) cannot fit the machine's memory; a note when they take
    most of it, or when each process would get little of a core. ``available``: the free
    memory (default: what the machine says)."""
    available = available_memory() if available is None else available
    own = processes * CHILD_BYTES
    need = own + shared_bytes
    notes = []
    if available is not None and need > available and shared_bytes > own:
        raise UsageError(
            f"the run's shared state (model, optimizer state, replay buffers, rollouts) takes "
            f"about {size_text(shared_bytes)}, and its {processes} processes about "
            f"{size_text(own)}: more than the {available / GIB:.1f} GiB this machine has "
            "available. Make the buffers smaller (their sizes in the algorithm's config, e.g. "
            "--set buffer_size=...)"
        )
    if available is not None and need > available:
        raise UsageError(
            f"the run would start {processes} processes of about {CHILD_BYTES // MIB} MiB each "
            f"(torch and the envs in every one): {need / GIB:.1f} GiB, more than the "
            f"{available / GIB:.1f} GiB this machine has available. Use fewer workers "
            f"(--workers {max(1, (available - shared_bytes) // CHILD_BYTES - 2)} at most here)"
        )
    if available is not None and need > 0.8 * available:
        notes.append(
            f"{processes} processes take about {need / GIB:.1f} GiB of the "
            f"{available / GIB:.1f} GiB available: the machine may start swapping"
        )
    cores = os.cpu_count() or 1
    if processes > 4 * cores:
        notes.append(
            f"{processes} processes on {cores} cores: each gets about {100 * cores // processes}% "
            "of a core, and starting them takes a while (start-up gets more time accordingly)"
        )
    return notes


class ManagerServer:
    """The run's Manager server, a spawned child of the main process.

    :param address: where it listens: ``None`` for a Unix socket in a temporary directory,
        ``(host, 0)`` for TCP on ``host``.
    :param authkey: the key clients must hold (``None``: this process's).
    :param leftovers: what it removes if the main process dies (:func:`remove_leftovers`).
    :param context: the multiprocessing context it starts from (:func:`start_context`;
        default: spawn).
    """

    def __init__(
        self,
        address: Any = None,
        authkey: bytes | None = None,
        leftovers: Sequence[str] = (),
        threads: int = 1,
        context: Any = None,
    ) -> None:
        context = context or mp.get_context("spawn")
        self.manager = SyncManager(address=address, authkey=authkey, ctx=context)
        with child_environment(threads):
            self.manager.start(initializer=_init_manager, initargs=("mprl-manager", leftovers))
        self.process: Any = self.manager._process  # type: ignore[attr-defined]
        self.killed_why = ""  # why the watch killed it
        self._done = threading.Event()
        self._watch = threading.Thread(target=self._watch_stopped, name="mprl-manager-watch")
        self._watch.daemon = True
        self._watch.start()

    def _watch_stopped(self) -> None:
        """Kill the server once it has been stopped for :data:`MANAGER_STOPPED_S`: a read
        blocked on it then fails (as when it dies) instead of waiting for ever."""
        since = None
        while not self._done.wait(0.25) and self.process.exitcode is None:
            if not _stopped(self.process.pid):
                since = None
                continue
            since = since or time.monotonic()
            if time.monotonic() - since >= MANAGER_STOPPED_S:
                self.killed_why = (
                    f"stopped (SIGSTOP) and silent for {MANAGER_STOPPED_S:g} s; killed"
                )
                with contextlib.suppress(OSError):
                    os.kill(self.process.pid, signal.SIGKILL)
                self.process.join(MANAGER_STOPPED_S)  # reaped: its exit code is there to read
                return

    def failure(self, settle: bool = False) -> ChildFailure | None:
        """The report of a server that died: every Manager kind of the run is lost with it.

        :param settle: the run is stopping and this is its last look: a server found stopped
            is waited on until the watch has killed it (reported then) or it goes on.
        """
        if settle and _stopped(self.process.pid):
            deadline = time.monotonic() + 2 * MANAGER_STOPPED_S  # room for a loaded machine
            while self._watch.is_alive() and time.monotonic() < deadline:
                if not self.killed_why and not _stopped(self.process.pid):
                    break  # it goes on
                self._watch.join(0.25)  # ends once it has killed and reaped the server
        code = self.process.exitcode
        if code is None and not self.killed_why:  # (killed: lost, though not reaped yet)
            return None
        why = self.killed_why or describe_exit(code)
        return ChildFailure("Manager server", -1, code, f"{why} (shared state is lost)")

    def shutdown(self) -> None:
        """Stop the server (killed if it does not go) and remove its socket's directory."""
        self._done.set()
        if _stopped(self.process.pid):  # its shutdown handshake would wait for ever
            with contextlib.suppress(OSError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.join()
        self.manager.shutdown()
        listener = Path(str(self.manager.address))
        own = mp.current_process()._config.get("tempdir")  # type: ignore[attr-defined]
        if listener.parent.name.startswith("pymp-") and str(listener.parent) != own:
            # the server's own (_init_manager), which a killed server leaves
            shutil.rmtree(listener.parent, ignore_errors=True)


def process_state(pid: int) -> str | None:
    """Process ``pid``'s state letter (``R``, ``S``, ``T`` stopped, ``Z`` a zombie ...), or
    ``None`` when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, SIGTSTP, a tracer)."""
    return process_state(pid) in ("T", "t")


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has ended)."""
    return process_state(pid) not in (None, "Z", "X")


def set_subreaper(on: bool) -> bool:
    """Make this process the one its orphaned descendants go to (Linux's child subreaper), or
    stop being it; whether it was one before. A child of a forkserver that died is then this
    process's own, whose exit it reads; a daemon a child left is found here."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        before = ctypes.c_int(0)
        libc.prctl(37, ctypes.byref(before), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
        libc.prctl(36, int(on), 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        return bool(before.value)
    return False


def marked(name: str, value: str, forked: Sequence[bytes] = ()) -> list[int]:
    """The processes (but this one) whose environment holds ``name=value``: what a run's
    children started, whatever became of their parents. With ``forked``, also this process's
    children whose command line holds one of them: a fork that never ran a new program shows the
    environment and command line of the program it forked from (a forkserver, this one), not the
    mark set after it started; as an orphan it came to this process, the run's subreaper."""
    needle, found, me = f"{name}={value}".encode(), [], os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
                    continue
            if forked and _parent(int(entry)) == me:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    command = f.read()
                    if any(words in command for words in forked):
                        found.append(int(entry))
        except OSError:
            continue
    return found


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
