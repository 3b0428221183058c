"""How the local backend's children start, without importing torch: the start context, the
forkserver, and its early start.

``python -m mprl run`` offers its command line to the early starts (:mod:`mprl.startup`) as
its first act; this one (:func:`start`) starts the forkserver for a run of the local backend
with forked children, so the server imports torch and gymnasium on the second core while the
main process imports them on the first: the children fork from a ready server the moment the
run starts them (see benchmarks/README.md, "startup.py"). The local backend claims it once it
is prepared (:func:`mprl.startup.claim`).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
from typing import Any

import attrs
from attrs import validators as v

from mprl.backends.processes import child_environment, process_state, set_process_name
from mprl.run_types import RunConfig
from mprl.startup import Command, exit_on_terminate

#: what a forkserver imports once, before it forks the run's children: a child then starts
#: without importing them itself (about 1.5 s of CPU each on this project's machines); first,
#: the group's signals ignored (:mod:`mprl.backends.local.forkserver_init`)
FORKSERVER_PRELOAD = (
    "mprl.backends.local.forkserver_init",
    "torch",
    "gymnasium",
    "mprl.backends.local.backend",
)
START_METHODS = tuple(m for m in ("forkserver", "spawn") if m in mp.get_all_start_methods())


@attrs.frozen
class LocalOptions:
    """The local backend's run options (``--backend local``, the default), registered by it."""

    start_method: str = attrs.field(
        default=START_METHODS[0],
        validator=v.in_(START_METHODS),
        metadata={
            "help": "how children start: forkserver (forked from a server that imported torch "
            "and gymnasium once: no import per child) or spawn (a fresh interpreter each)"
        },
    )


def start_context(method: str) -> Any:
    """The multiprocessing context children start from: ``"forkserver"`` (each child forked
    from a server process that imported :data:`FORKSERVER_PRELOAD`: a fresh server per run,
    started by the first child or by :func:`start`, and stopped by :func:`stop_forkserver`) or
    ``"spawn"`` (a fresh interpreter per child). Neither inherits the main process's threads or
    state: a child gets its context by pickle, as under spawn."""
    context = mp.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return context


def stop_forkserver() -> None:
    """Stop this process's forkserver, if one runs, once the run's children have ended: it
    would otherwise live as long as the main process (the next run starts another). It is
    killed: it holds nothing to save, and its interpreter's teardown (torch loaded) would
    take a few tenths of a second of the run's end."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        if server._forkserver_pid is not None:
            os.kill(server._forkserver_pid, signal.SIGKILL)
        server._stop()  # reaps it and removes its socket


def forkserver_pid() -> int | None:
    """The pid of this process's forkserver, when one was started."""
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]


class ForkserverWatch:
    """Looks after the forkserver while a run goes on: one stopped (SIGSTOP, a debugger) for
    :data:`STOPPED_S` is killed, as nothing it would do (fork a child, tell its exit) can wait
    for ever; one that ended is said once. Its children go on either way (this process is
    their subreaper: their exits are read here), and the next child start brings up a new
    server, as at start-up. :meth:`look` returns what to say, or ``None``."""

    STOPPED_S = 5.0

    def __init__(self) -> None:
        self.stopped_since: float | None = None
        self.said: set[int] = set()

    def look(self, now: float, at_once: bool = False) -> str | None:
        """What happened to the forkserver since the last look (``at_once``: a stopped one is
        killed now: the run waits on it)."""
        pid = forkserver_pid()
        if pid is None or pid in self.said:
            return None
        state = process_state(pid)
        if state in ("T", "t"):
            self.stopped_since = self.stopped_since or now
            if not at_once and now - self.stopped_since < self.STOPPED_S:
                return None
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            self.said.add(pid)
            return (
                f"the forkserver (pid {pid}) was stopped (SIGSTOP); killed: the run's children "
                "go on, a new forkserver starts the next"
            )
        self.stopped_since = None
        if state in (None, "Z", "X"):
            self.said.add(pid)
            return (
                f"the forkserver (pid {pid}) ended: the run's children go on, a new forkserver "
                "starts the next"
            )
        return None


class EarlyServer:
    """The forkserver :func:`start` started (:mod:`mprl.startup`'s handle)."""

    def stop(self) -> None:
        stop_forkserver()


def wants_forkserver(command: Command) -> bool:
    """Whether ``command`` runs the local backend with its children forked from a forkserver,
    as far as it says (a config file or a resumed run may still name another backend)."""
    if command.value(RunConfig, "backend") != "local" or "serial" in command.options:
        return False
    return command.value(LocalOptions, "start_method") == "forkserver"


def start(command: Command) -> EarlyServer | None:
    """The early start (entry point ``mprl.early: local``): the forkserver, when ``command``
    :func:`wants_forkserver` (stopped once the run's backend is prepared, if it is another)."""
    if not wants_forkserver(command):
        return None
    from multiprocessing import forkserver

    from mprl.timeline import mark

    # the server's socket is in this process's temp dir, removed on exit; the server leaves
    # when this process has gone
    exit_on_terminate()
    start_context("forkserver")
    if not fork_server():  # (another thread already: a server of its own, which imports)
        with child_environment(1):
            forkserver.ensure_running()
    mark("forkserver", server=forkserver._forkserver._forkserver_pid)  # type: ignore[attr-defined]
    return EarlyServer()


def fork_server() -> bool:
    """Start this process's forkserver as a fork of this process, once it has imported
    :data:`FORKSERVER_PRELOAD` (the main process needs them too): the server imports nothing,
    where one started by ``multiprocessing`` is a new interpreter that imports them again
    (about 2.5 s of CPU a run; see benchmarks/README.md, "startup.py"). Only while this process
    has one thread and has done nothing yet (the early start): a fork copies one thread, and
    what the process holds open by then is its standard streams. ``False`` when it has more."""
    import importlib
    import socket
    import sys
    import threading
    from multiprocessing import connection, forkserver

    if threading.active_count() > 1:
        return False
    # this process's own imports, with its own thread settings (the first module ignores the
    # terminal's signals: the server's alone)
    for name in FORKSERVER_PRELOAD[1:]:
        importlib.import_module(name)
    server = forkserver._forkserver  # type: ignore[attr-defined]
    with child_environment(1), socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # the server leaves once this process's end is closed
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _serve(listener.fileno(), alive_r, alive_w)
        os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    return True


def _serve(listener: int, alive_r: int, alive_w: int) -> None:
    """The forked server: ``multiprocessing``'s own loop, with the terminal's signals ignored
    (:mod:`mprl.backends.local.forkserver_init`); it never returns into the code it was forked
    from."""
    import traceback
    from multiprocessing import forkserver

    code = 0
    try:
        os.close(alive_w)
        set_process_name("mprl-forkserver")
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        forkserver.main(listener, alive_r, [])  # type: ignore[attr-defined]
    except SystemExit:  # this process's end of the pipe closed: it has gone
        pass
    except BaseException:  # said where the run's output goes; the run's watch names its end
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)
