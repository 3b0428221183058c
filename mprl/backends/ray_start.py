"""Ray started on this machine for one run (``--backend ray`` with no address): its start, its
stop, and the early start of ``python -m mprl run --backend ray``, which begins Ray's start as
the command's first act, so Ray's processes start while the main process imports torch and
prepares the run (as the local backend's forkserver does, :mod:`mprl.backends.forkserver`).

Nothing here imports torch or the Ray backend: ``mprl/__main__.py`` imports it first.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from mprl.backends import forkserver
from mprl.timeline import mark

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
    with contextlib.suppress(Exception):  # Ray's logs of this run: removed unless it fails
        node = ray._private.worker._global_node  # no public accessor
        return Path(node.get_session_dir_path())
    return None


def stop(session: Path | None) -> None:
    """Stop the Ray this process started, and remove its logs (``session``)."""
    import ray

    ray.shutdown()
    _release.set()
    if session is not None:
        remove_session(session)


# -- the early start -------------------------------------------------------------------------

#: whether :func:`start_early` started Ray that no run has taken yet; what the start ended
#: with (``(session, None)`` or ``(None, exception)``), once ``_started`` is set; and
#: ``_release``, set once Ray is stopped (the thread that started it ends then)
_early = False
_early_out: list[tuple[Path | None, BaseException | None]] = []
_started = threading.Event()
_release = threading.Event()


def wants_embedded(argv: Sequence[str]) -> float | None:
    """The CPUs a run of command line ``argv`` (``python -m mprl``'s) reserves on a Ray started
    on this machine for it, as far as the command line and ``RAY_ADDRESS`` say (a config file
    may still name an address, another backend or other counts); ``None`` when it runs on no
    such Ray."""
    args = list(argv)
    if not args or args[0] != "run" or os.environ.get("RAY_ADDRESS"):
        return None
    given: dict[str, str] = {}
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in ("-h", "--help", "--ray-address"):
            return None
        if not eq and i + 1 < len(args):
            value = args[i + 1]
        given[name] = value
    if given.get("--backend") != "ray" or importlib.util.find_spec("ray") is None:
        return None
    try:  # as RunConfig and RayOptions default them; a bad value is the parser's to say
        workers = int(given.get("--workers", os.cpu_count() or 1))
        worker_cpus = float(given.get("--worker-cpus", 1.0))
        learner = json.loads(given.get("--learner-resources") or "{}").get("CPU", 1.0)
        return workers * worker_cpus + float(learner)
    except (ValueError, TypeError, AttributeError):
        return 0.0


def start_early(argv: Sequence[str]) -> bool:
    """Start Ray on this machine in a thread now when command line ``argv``
    :func:`wants_embedded`: Ray's processes start while this process imports torch and
    prepares the run, which then takes it (:func:`mprl.backends.ray.cluster.connect`). True
    when it was started. A run that turns out not to use it stops it once its backend has
    prepared (:func:`stop_unclaimed`), and so does this process's exit (a usage error,
    Ctrl-C)."""
    global _early
    cpus = wants_embedded(argv)
    if cpus is None:
        return False
    _early_out.clear()
    _started.clear()
    _release.clear()
    forkserver.exit_on_terminate()  # Ray's start ends, then it is stopped (below)
    import ray  # noqa: F401  (here: its atexit shutdown then runs after stop_unclaimed)

    def start() -> None:
        try:
            _early_out.append((start_here(cpus), None))
        except BaseException as exc:  # said by connect(), which starts Ray again
            _early_out.append((None, exc))
        _started.set()
        # Linux sends Ray's processes the parent-death signal when the thread that started
        # them ends, not the process: this thread lives until Ray is stopped
        _release.wait()

    # an exit joins the start first (stop_unclaimed), then stops Ray
    atexit.register(stop_unclaimed)
    threading.Thread(target=start, name="mprl-ray-start", daemon=True).start()
    _early = True
    return True


def started_early() -> bool:
    """Whether :func:`start_early` started Ray and no run has taken it yet."""
    return _early


def take_early() -> tuple[Path | None, BaseException | None] | None:
    """What :func:`start_early` started, once its start has ended; ``None`` when it started
    nothing. A Ctrl-C meanwhile comes once Ray has started (it is stopped again)."""
    global _early
    if not _early:
        return None
    _early = False
    try:
        while not _started.wait(0.1):  # a Ctrl-C comes between two waits
            pass
    except KeyboardInterrupt:
        _started.wait()
        stop(_early_out[0][0])
        raise
    return _early_out[0]


def stop_unclaimed() -> None:
    """Stop the Ray :func:`start_early` started when no run took it."""
    started = take_early()
    if started is not None:
        stop(started[0])


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
