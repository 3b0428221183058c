"""Progress while training: a live panel on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import Any, TextIO

from mprl.errors import UsageError
from mprl.host.stats import Snapshot

PLAIN_EVERY_S = 5.0

#: what ``mprl.run(progress=...)`` takes (:class:`Progress`)
MODES = ("auto", "live", "plain", "none")


def check_mode(mode: object) -> None:
    """Refuse a progress mode other than :data:`MODES` with a :class:`UsageError` naming them."""
    if not isinstance(mode, str) or mode not in MODES:
        allowed = ", ".join(repr(m) for m in MODES)
        raise UsageError(f"progress={mode!r}: not a progress mode; use one of {allowed}")


def _fmt(x: float, digits: int = 1) -> str:
    return (
        "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"
    )


IDLE_S = 5.0  # a worker whose count has not moved for this long is shown as idle


def eval_text(s: Snapshot) -> str:
    """The last evaluation (--eval-every): ``487.3 ± 12.1 @ 24,000``; ``-`` before the first."""
    e = s.last_eval
    if e is None:
        return "-"
    return f"{_fmt(e['eval_return_mean'])} ± {_fmt(e['eval_return_std'])} @ {e['step']:,}"


def summary_line(s: Snapshot) -> str:
    budget = f"/{s.total_steps:,}" if s.total_steps else ""
    eta = f"  ETA {s.eta_s:.0f}s" if s.eta_s is not None else ""
    return (
        f"[{s.wall_s:7.1f}s] steps {s.env_steps:,}{budget}  {s.steps_per_s:,.0f} steps/s{eta}  "
        f"episodes {s.episodes:,}  mean return(100) {_fmt(s.mean_return_100)}  "
        f"best {_fmt(s.best_return)}"
        + (f"  eval {eval_text(s)}" if s.last_eval is not None else "")
        + (f"  restarts {s.restarts}" if s.restarts else "")
    )


def worker_rows(s: Snapshot) -> list[tuple[str, str, str, str]]:
    """(worker, env steps, steps/s, status) for each worker rank."""
    rows = []
    for rank, idle in enumerate(s.worker_idle_s):
        rate = s.worker_rates[rank] if rank < len(s.worker_rates) else 0.0
        status = f"idle {idle:.0f}s" if idle >= IDLE_S else "stepping"
        rows.append((f"worker {rank}", f"{s.per_worker_steps[rank]:,}", f"{rate:,.0f}", status))
    return rows


class SafeStream:
    """A text stream whose writes never raise: output must never end a run.

    Once the reader is gone (``mprl run ... 2>&1 | head``, a ``tee`` killed by Ctrl-C: a
    broken pipe; a closed terminal: EIO) every later write is dropped, and the stream's file
    descriptor is pointed at ``/dev/null``, so that nothing else writing there (warnings, the
    interpreter's last flush at exit) fails or complains either. A write that would block (a
    non-blocking pipe that is full) is dropped alone. Everything else is the stream's own.
    """

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.broken = stream is None  # Python's own when it started with the descriptor closed

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self.stream.write(text)
            except BlockingIOError:
                pass
            except (OSError, ValueError):  # a closed pipe or terminal; a closed file object
                self._break()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except BlockingIOError:
                pass
            except (OSError, ValueError):
                self._break()

    def _break(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = self.stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, fd)
            finally:
                os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


_STDERR: Any = object()  # say()'s default: sys.stderr as it is when called


def say(text: str, stream: Any = _STDERR) -> None:
    """Print the line ``text`` to ``stream`` (``sys.stderr`` by default; ``None``: nowhere, as
    ``sys.stdout`` is when Python started with it closed); never raises (see
    :class:`SafeStream`): a run's last lines too are printed where nobody may be reading."""
    if stream is _STDERR:
        stream = sys.stderr
    out = stream if isinstance(stream, SafeStream) else SafeStream(stream)
    out.write(text + "\n")
    out.flush()


class Progress:
    """``mode``: ``"auto"`` (live on a TTY, else plain), ``"live"``, ``"plain"`` or ``"none"``.

    Nothing it shows can end a run: its stream is a :class:`SafeStream`, and whatever the live
    display raises is dropped (the display with it)."""

    def __init__(self, mode: str = "auto", stream: TextIO | None = None) -> None:
        self.stream = SafeStream(stream or sys.stderr)
        if mode == "auto":
            mode = "live" if self._on_a_terminal() else "plain"
        self.mode = mode
        self._live: Any = None
        self._last_plain = -math.inf
        self.title = ""

    def _on_a_terminal(self) -> bool:
        try:
            return not self.stream.broken and bool(self.stream.isatty())
        except (AttributeError, ValueError, OSError):  # a closed or odd stream
            return False

    def start(self, title: str) -> None:
        self.title = title
        if self.mode == "none":
            return
        if self.mode == "live":
            from rich.console import Console
            from rich.live import Live

            self._live = Live(
                console=Console(file=self.stream), refresh_per_second=4, transient=False
            )
            self._guarded(self._live.start)
        else:
            say(title, self.stream)

    def _guarded(self, call: Any, *args: Any) -> None:
        """``call(*args)`` of the live display; if it fails, the display is dropped."""
        try:
            call(*args)
        except Exception:
            live, self._live, self.mode = self._live, None, "none"
            if live is not None:
                with contextlib.suppress(Exception):
                    live.stop()

    def update(self, s: Snapshot) -> None:
        if self.stream.broken:
            return
        if self.mode == "live" and self._live is not None:
            self._guarded(self._live.update, self._render(s))
        elif self.mode == "plain" and time.monotonic() - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = time.monotonic()
            say(summary_line(s), self.stream)

    def _render(self, s: Snapshot) -> Any:
        """The live panel: totals (with the learner's latest values below), a line per worker."""
        from rich.console import Group
        from rich.table import Table

        table = Table(title=self.title, show_header=True, expand=False)
        table.add_column("elapsed")
        table.add_column("ETA", justify="right")
        table.add_column("env steps", justify="right")
        table.add_column("steps/s", justify="right")
        table.add_column("episodes", justify="right")
        table.add_column("mean return (100)", justify="right")
        table.add_column("best", justify="right")
        if s.last_eval is not None:
            table.add_column("eval return", justify="right")
        table.add_column("restarts", justify="right")
        steps = f"{s.env_steps:,}" + (f" / {s.total_steps:,}" if s.total_steps else "")
        evaluated = [eval_text(s)] if s.last_eval is not None else []
        table.add_row(
            f"{s.wall_s:.0f}s" + (f" / {s.max_time:.0f}s" if s.max_time is not None else ""),
            f"{s.eta_s:.0f}s" if s.eta_s is not None else "-",
            steps,
            f"{s.steps_per_s:,.0f}",
            f"{s.episodes:,}",
            _fmt(s.mean_return_100),
            _fmt(s.best_return),
            *evaluated,
            str(s.restarts),
        )
        if s.last_values:
            extras = "  ".join(
                f"{k}={v:.4g}" for k, v in sorted(s.last_values.items()) if k != "episode_length"
            )
            table.caption = extras
        workers = Table(show_header=True, expand=False, box=None)
        for name in ("worker", "env steps", "steps/s", "status"):
            workers.add_column(name, justify="left" if name in ("worker", "status") else "right")
        for row in worker_rows(s):
            workers.add_row(*row)
        return Group(table, workers)

    def message(self, text: str, detail: str = "") -> None:
        """A line that must be seen whatever the mode (a restart, a slow stop): shown above the
        live panel on a terminal, printed as it is otherwise, even with ``--quiet``."""
        out = text + (f"\n{detail.rstrip()}" if detail.strip() else "")
        if self._live is not None:
            self._guarded(lambda: self._live.console.print(out, markup=False, highlight=False))
        if self._live is None:  # not live, or the live display just failed
            say(out, self.stream)

    def stop(self, s: Snapshot | None = None) -> None:
        if self._live is not None:
            if s is not None:
                self._guarded(self._live.update, self._render(s))
            if self._live is not None:
                self._guarded(self._live.stop)
            self._live = None
        elif self.mode == "plain" and s is not None:
            say(summary_line(s), self.stream)
