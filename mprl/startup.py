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
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata as md
import signal
from collections.abc import Mapping, Sequence
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
    raise SystemExit(128 + signum)
