"""How the local backend's children start, without importing torch: the start context, the
forkserver and its early start, and the environment a child starts in.

``python -m mprl run`` starts the forkserver as its first act (:func:`start_early`, called
from ``mprl/__main__.py``), so the server imports torch and gymnasium on the second core while
the main process imports them on the first: the children fork from a ready server the moment
the run starts them (see benchmarks/README.md, "startup.py").
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
from collections.abc import Iterator, Sequence
from typing import Any

#: what a forkserver imports once, before it forks the run's children: a child then starts
#: without importing them itself (about 1.5 s of CPU each on this project's machines); first,
#: the group's signals ignored (:mod:`mprl.backends.forkserver_init`)
FORKSERVER_PRELOAD = (
    "mprl.backends.forkserver_init",
    "torch",
    "gymnasium",
    "mprl.backends.local.backend",
)
_BLOCKED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}  # while a child starts
_early = False  # a server start_early() started that no run has claimed yet


def start_context(method: str) -> Any:
    """The multiprocessing context children start from: ``"forkserver"`` (each child forked
    from a server process that imported :data:`FORKSERVER_PRELOAD`: a fresh server per run,
    started by the first child or by :func:`start_early`, and stopped by
    :func:`stop_forkserver`) or ``"spawn"`` (a fresh interpreter per child). Neither inherits
    the main process's threads or state: a child gets its context by pickle, as under spawn."""
    global _early
    context = mp.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
        _early = False  # the run's now: it stops it
    return context


def stop_forkserver() -> None:
    """Stop this process's forkserver, if one runs, once the run's children have ended: it
    would otherwise live as long as the main process (the next run starts another). It is
    killed: it holds nothing to save, and its interpreter's teardown (torch loaded) would
    take a few tenths of a second of the run's end."""
    global _early
    from multiprocessing import forkserver

    _early = False
    server = forkserver._forkserver  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        if server._forkserver_pid is not None:
            os.kill(server._forkserver_pid, signal.SIGKILL)
        server._stop()  # reaps it and removes its socket


def wants_forkserver(argv: Sequence[str]) -> bool:
    """Whether command line ``argv`` (``python -m mprl``'s) runs the local backend with its
    children forked from a forkserver, as far as the command line says (a config file or a
    resumed run may still name another backend)."""
    args = list(argv)
    if not args or args[0] != "run" or "forkserver" not in mp.get_all_start_methods():
        return False
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if not value and name in ("--backend", "--start-method") and i + 1 < len(args):
            value = args[i + 1]
        if name in ("-h", "--help") or (name == "--backend" and value != "local"):
            return False
        if name == "--start-method" and value != "forkserver":
            return False
    return True


def start_early(argv: Sequence[str]) -> bool:
    """Start the forkserver now when command line ``argv`` :func:`wants_forkserver`: it then
    imports torch while this process does. True when it was started. A run that turns out not
    to use it (another backend in a config file, a resumed Ray run) stops it once its backend
    has prepared (:func:`stop_unclaimed`)."""
    global _early
    if not wants_forkserver(argv):
        return False
    from multiprocessing import forkserver

    from mprl.timeline import mark

    # the server's socket is in this process's temp dir, removed on exit; the server leaves
    # when this process has gone
    exit_on_terminate()
    mp.get_context("forkserver").set_forkserver_preload(list(FORKSERVER_PRELOAD))
    with child_environment(1):
        forkserver.ensure_running()  # returns at once: the server imports in the background
    # a command that ends before its run takes the server (bad usage: exit 2) stops it, rather
    # than leave it to finish its imports before it sees this process gone
    atexit.register(stop_forkserver)
    _early = True
    mark("forkserver", server=forkserver._forkserver._forkserver_pid)  # type: ignore[attr-defined]
    return True


def exit_on_terminate() -> None:
    """Until the run puts in its own handlers (a clean stop): a SIGTERM or SIGHUP while this
    process imports exits it through SystemExit, so what it started ahead is stopped and
    removed as on any exit (its ``atexit`` functions run)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:  # nohup's ignored SIGHUP stays so
            signal.signal(sig, _exit_on)


def _exit_on(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def stop_unclaimed() -> None:
    """Stop the server :func:`start_early` started when the run did not take it (called once
    the run's backend has prepared)."""
    if _early:
        stop_forkserver()


@contextlib.contextmanager
def child_environment(threads: int) -> Iterator[None]:
    """What children (and the forkserver they fork from) start with: thread counts, and
    SIGINT, SIGTERM and SIGHUP blocked.

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
