"""What ``python -m mprl run`` starts before it imports torch, for the backend that will take it.

A command line is read once, here (:func:`preparse`), before anything heavy is imported; each
early start registered in the entry-point group ``mprl.early`` is offered it in turn, and the
first that starts something (the local backend's forkserver, which imports torch on another
core while this process does; the Ray backend's Ray on this machine) keeps it for the backend
that will run. That backend takes it by its entry point's name once it is prepared
(:func:`claim`); what no backend took is stopped then, and at exit (:func:`stop_unclaimed`):
a config file or a resumed run may name another backend than the command line.

An early start is a function ``start(command) -> handle | None`` (:class:`Command`); its handle
has ``stop()``. The seam names no backend: a third-party backend registers its own the same way.
This module imports nothing of torch, and neither may an early start before it has started.

A Ctrl-C while the command starts (these imports: Ray, torch, the CLI) is this module's to act
on too (:func:`guard_interrupts`): Python would raise ``KeyboardInterrupt`` wherever it finds
the main thread, a traceback out of an import; the command ends as interrupted instead.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata as md
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

#: the entry-point group of the early starts
GROUP = "mprl.early"


@attrs.frozen
class Command:
    """The options of a ``python -m mprl run`` command line, as far as it gives them.

    :ivar options: ``{name: value}`` of every ``--name value`` / ``--name=value``, with the
        name's dashes as underscores (``--worker-cpus 2``: ``{"worker_cpus": "2"}``); a flag
        without a value is ``""``.
    """

    options: Mapping[str, str]

    def value(self, cls: type, name: str) -> Any:
        """Option ``name`` of the attrs class ``cls`` (:class:`mprl.RunConfig`, a backend's
        options): as given, converted to the field's type, else the field's default. A value
        that does not convert is the default too: the command's parser says what is wrong."""
        field = attrs.fields_dict(cls)[name]
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()  # type: ignore[attr-defined]
        if name not in self.options:
            return default
        raw = self.options[name]
        kind = type(default) if default is not None else str
        try:
            if kind is bool:
                return raw.lower() not in ("0", "false", "no")
            return kind(raw)
        except (TypeError, ValueError):
            return default


def preparse(argv: Sequence[str]) -> Command | None:
    """The :class:`Command` of ``argv`` (``python -m mprl``'s arguments) when it runs a job:
    ``run``, no ``--help``; else ``None``."""
    args = list(argv)
    if not args or args[0] != "run":
        return None
    options: dict[str, str] = {}
    for i, arg in enumerate(args[1:], start=1):
        if arg in ("-h", "--help"):
            return None
        if not arg.startswith("--"):
            continue
        name, eq, value = arg[2:].partition("=")
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
        options[name.replace("-", "_")] = value
    return Command(options)


#: what the early starts started, by entry point name, until a backend claims it
_started: dict[str, Any] = {}


def start_early(argv: Sequence[str]) -> str | None:
    """Offer the command line ``argv`` to each early start, until one starts something; its
    name. Nothing is started for a command that runs no job. What no backend claims is
    stopped at this process's exit."""
    command = preparse(argv)
    if command is None:
        return None
    for entry in md.entry_points(group=GROUP):
        # a Ctrl-C (SIGTERM, SIGHUP) meanwhile is acted on once what it started is known here,
        # and so stopped on the exit it asks for (a Ray starting in a thread)
        with _signals_held():
            try:
                handle = entry.load()(command)
            except Exception:  # the backend says what is wrong when the run starts it for real
                continue
            if handle is not None:
                _started[entry.name] = handle
                atexit.register(stop_unclaimed)
                return entry.name
    return None


def pending(name: str) -> bool:
    """Whether the early start ``name`` started something that no backend claimed yet."""
    return name in _started


def claim(name: str) -> Any:
    """What the early start ``name`` started, for the backend that takes it (``None`` when it
    started nothing); it is the backend's from now on."""
    return _started.pop(name, None)


def stop_unclaimed() -> None:
    """Stop what was started early and taken by no backend (called once the run's backend is
    prepared, and at exit)."""
    while _started:
        _, handle = _started.popitem()
        with contextlib.suppress(Exception):
            handle.stop()


def exit_on_terminate() -> None:
    """Until the run puts in its own handlers (a clean stop): a SIGTERM or SIGHUP while this
    process imports exits it through SystemExit, so what it started ahead is stopped and
    removed as on any exit (its ``atexit`` functions run). For an early start to call."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:  # nohup's ignored SIGHUP stays so
            signal.signal(sig, _exit_on)


def _exit_on(signum: int, frame: Any) -> None:
    if _held is not None:
        _held.append(signum)
        return
    raise SystemExit(128 + signum)


# -- Ctrl-C while the command starts ---------------------------------------------------------

#: the phases of ``python -m mprl`` for a Ctrl-C (:func:`guard_interrupts`); ``None``: not
#: guarded (SIGINT ignored when it started, or :func:`mprl.tools.cli.main` called in-process)
STARTING, MAIN, EXITING = "starting", "main", "exiting"
_phase: str | None = None
#: signals that came while an early start ran, acted on after it (:func:`_signals_held`)
_held: list[int] | None = None
INTERRUPTED = "mprl: interrupted"
#: what the second Ctrl-C since the exit began says: it ends the process at once (what was
#: started ahead may be left)
FORCED = "mprl: forced exit (Ctrl-C while exiting)"
_exit_interrupts = 0  # Ctrl-Cs since the exit began


def guard_interrupts(interrupted: bool = False) -> None:
    """``python -m mprl``'s first act, SIGINT being at Python's default (an ignored SIGINT, as
    in a background job, stays ignored: not called). Until :func:`mprl.tools.cli.main` takes
    over (:func:`entering_main`), a Ctrl-C ends the command as interrupted: the last line says
    so (:data:`INTERRUPTED`), the exit code is 130 and what was started ahead is stopped as on
    any exit (its ``atexit`` functions run), with no traceback out of an import. Once ``main()``
    has returned (:func:`leaving_main`), or that Ctrl-C came, one more lets the exit go on (it
    may be stopping a Ray started ahead, whose processes keep the terminal's signals blocked),
    and a further one forces it (:data:`FORCED`: an exit that does not end). ``interrupted``: a
    Ctrl-C came already, while ``mprl`` itself imported."""
    global _phase
    _phase = STARTING
    signal.signal(signal.SIGINT, _on_sigint)
    if interrupted:
        _on_sigint(signal.SIGINT, None)


def entering_main() -> None:
    """From here on (``main()``'s first act) a Ctrl-C is a ``KeyboardInterrupt``, ``main()``'s
    to handle (once: the exit it asks for begins with it). One that came before and whose exit
    something swallowed ends the command now."""
    global _phase
    if _phase == STARTING:
        _phase = MAIN
    elif _phase == EXITING:
        raise SystemExit(130)


def leaving_main() -> None:
    """``main()`` has returned (or raised): a Ctrl-C from here on lets the exit go on."""
    global _phase
    if _phase is not None:
        _phase = EXITING


def _on_sigint(signum: int, frame: Any) -> None:
    global _phase, _exit_interrupts
    if _held is not None:
        _held.append(signum)
    elif _phase == MAIN:  # main() ends on it (no one else catches it): its exit begins
        _phase = EXITING
        signal.default_int_handler(signum, frame)  # KeyboardInterrupt
    elif _phase == STARTING:
        _phase = EXITING
        _say(INTERRUPTED)
        raise SystemExit(130)
    elif _phase == EXITING:  # the first lets the exit go on; one more forces it
        _exit_interrupts += 1
        if _exit_interrupts > 1:
            _say(FORCED)
            os._exit(130)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT (and SIGTERM, SIGHUP where :func:`exit_on_terminate` put its handler in) acted
    on after the block, not in it: what it starts is registered to be stopped first."""
    global _held
    _held = []
    try:
        yield
    finally:
        held, _held = _held, None
    if held:
        handler = signal.getsignal(held[0])
        if callable(handler):
            handler(held[0], None)


def _say(line: str) -> None:
    """``line`` on stderr from a signal handler (which may have come while stderr was being
    written: then past its buffer)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except RuntimeError:  # reentrant call
        with contextlib.suppress(OSError):
            os.write(2, (line + "\n").encode())
