"""Reading finished (or unfinished) run directories back: learning-curve plots and a run table.

``python -m mprl plot RUN_DIR ...`` and ``python -m mprl runs [DIR]`` are built on this module.
matplotlib is needed for plots only (``pip install "mprl[plot]"``); listing runs needs nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mprl.errors import UsageError
from mprl.files import open_regular

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RUNNING_WITHIN_S = 60.0  # no summary.json and metrics written this recently: "running?"
MAX_DEPTH = 3  # how deep `list_runs` looks for run directories
MISSING = "-"


@dataclass
class Run:
    """What a run directory holds, as far as it got.

    ``episodes`` holds one ``(step, wall, return)`` per episode record of ``metrics.jsonl``, in
    file order; ``evals`` one ``(step, wall, mean return, std of the returns)`` per evaluation
    (``--eval-every``: the records of source ``"eval"``), by env step; ``summary`` is ``None``
    while the run is going on or when it was killed before writing it.
    """

    path: Path
    label: str
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    episodes: list[tuple[int, float, float]] = field(default_factory=list)
    evals: list[tuple[int, float, float, float]] = field(default_factory=list)
    #: by name, the ``(step, wall, value)`` of each record holding that metric, for the
    #: names :func:`read_run` was asked for (``metrics``)
    series: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)
    last_step: int | None = None  # the last "step" of any metrics record
    last_wall: float | None = None  # the last "wall" of any metrics record

    @property
    def env(self) -> str | None:
        """The env id, from ``config.json`` or else ``summary.json``."""
        env = (self.config.get("run") or {}).get("env")
        if env is None and self.summary is not None:
            env = self.summary.get("env")
        return env

    @property
    def plugin(self) -> str | None:
        """The plugin name, from ``config.json`` or else ``summary.json``."""
        plugin = self.config.get("plugin")
        if plugin is None and self.summary is not None:
            plugin = self.summary.get("plugin")
        return plugin

    @property
    def reward_threshold(self) -> float | None:
        """The env's reward threshold recorded in ``config.json`` (``None`` when it has none)."""
        value = self.config.get("reward_threshold")
        return float(value) if isinstance(value, int | float) else None


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; ``None`` when it is missing. Unreadable is a UsageError."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {str(path)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{str(path)!r} does not hold a JSON object; is it from an mprl run?")
    return data


def _readable(path: Path) -> dict[str, Any] | None:
    """:func:`_read_json`, with ``None`` for a file that is there but cannot be read."""
    try:
        return _read_json(path)
    except UsageError:
        return None


def is_run_dir(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding a run's ``config.json`` or ``summary.json``."""
    p = Path(path)
    return (p / "config.json").is_file() or (p / "summary.json").is_file()


def read_run(path: str | Path, label: str | None = None, metrics: Sequence[str] = ()) -> Run:
    """Read a run directory: ``config.json``, ``summary.json`` (if written) and the episodes of
    ``metrics.jsonl``.

    Lines of ``metrics.jsonl`` that do not decode (the half-written last line of a run that was
    killed, which a resumed session leaves as a line of its own) are skipped. Episodes are in
    the order they finished (their ``wall`` stamps), not the order the processes' batched
    records reached the file. ``label`` defaults to the directory's name. ``metrics`` names
    other values to collect into ``series`` (``tom_accuracy``); ``"agents"`` stands for each
    agent's return of a multi-agent run (``return_<agent>``).

    :raises UsageError: ``path`` is not a run directory (neither ``metrics.jsonl`` nor
        ``summary.json``), or one of its JSON files is unreadable.
    """
    p = Path(path)
    metrics_file = p / "metrics.jsonl"
    try:
        found = p.is_dir() and (metrics_file.is_file() or (p / "summary.json").is_file())
    except OSError as exc:  # a name longer than the file system allows
        raise UsageError(f"cannot read {str(p)!r}: {exc.strerror or exc}") from None
    if not found:
        raise UsageError(
            f"{str(p)!r} is not a run directory (no metrics.jsonl); give a directory made by "
            "`python -m mprl run`"
        )
    run = Run(
        path=p,
        label=label if label is not None else (p.resolve().name or str(p)),
        config=_readable(p / "config.json") or {},  # damaged: what the rest holds still counts
        summary=_readable(p / "summary.json"),
    )
    if not metrics_file.is_file():
        return run
    try:
        with metrics_file.open("rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read {str(metrics_file)!r}: {exc}") from None
    _add_records(run, lines, metrics)
    return run


def _add_records(run: Run, lines: list[bytes], metrics: Sequence[str]) -> None:
    """The episodes, evaluations and ``metrics`` of ``metrics.jsonl``'s ``lines`` into ``run``."""
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by a kill, or garbage: not a record
            continue
        if not isinstance(record, dict):
            continue
        step, wall = record.get("step"), record.get("wall")
        if not isinstance(step, int | float) or not isinstance(wall, int | float):
            continue
        run.last_step, run.last_wall = int(step), float(wall)
        ret = record.get("episode_return")
        if _finite(ret):
            count = record.get("episode_count", 1)  # summed-up episodes count as many
            count = count if isinstance(count, int) and count > 0 else 1
            run.episodes.extend([(int(step), float(wall), float(ret))] * count)
        if metrics:
            _collect(run.series, record, metrics, int(step), float(wall))
        mean, std = record.get("eval_return_mean"), record.get("eval_return_std", 0.0)
        if record.get("source") == "eval" and _finite(mean):
            std = float(std) if _finite(std) else 0.0
            run.evals.append((int(step), float(wall), float(mean), std))
    run.episodes.sort(key=lambda episode: episode[1])  # stable: ties keep the file's order
    run.evals.sort(key=lambda evaluation: evaluation[0])


def _collect(
    series: dict[str, list[tuple[int, float, float]]],
    record: dict[str, Any],
    metrics: Sequence[str],
    step: int,
    wall: float,
) -> None:
    for key, value in record.items():
        wanted = key in metrics or ("agents" in metrics and key.startswith("return_"))
        if wanted and _finite(value):
            series.setdefault(key, []).append((step, wall, float(value)))


def _finite(value: Any) -> bool:
    """Whether ``value`` is a finite number (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """The mean of the last ``window`` values at each position (of fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def matplotlib_classes() -> tuple[Any, Any]:
    """matplotlib's ``Figure`` and the Agg canvas; a UsageError with the fix when missing."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(
            'plotting needs matplotlib, which is not installed: pip install "mprl[plot]"'
        ) from None
    return Figure, FigureCanvasAgg


def _default_labels(runs: Sequence[Run]) -> list[str]:
    labels = [r.label for r in runs]
    if len(set(labels)) == len(labels):
        return labels
    return [str(r.path) for r in runs]  # two runs/x/run directories: tell them apart by path


def build_figure(
    runs: Sequence[Run],
    labels: Sequence[str] | None = None,
    window: int = 100,
    metrics: Sequence[str] = (),
) -> Figure:
    """The learning-curve figure of ``runs``: the mean of the last ``window`` episode returns
    against env steps (left) and wall seconds (right), one line per run, and each env's reward
    threshold as a dashed horizontal line. A run with evaluations (``--eval-every``) also gets
    its evaluation curve, in the run's colour: the mean return of each evaluation as a point
    with the returns' standard deviation as error bars, joined by a dotted line.

    The figure is not attached to pyplot (nothing global changes); it has an Agg canvas, so
    ``fig.savefig`` works headless.

    With ``metrics`` (the runs read with them), each of those series of each run is drawn
    instead (its moving mean over ``window`` records), and no threshold.

    :raises UsageError: no runs, a run without episodes, ``labels`` not one per run, or
        ``window`` < 1; matplotlib is missing.
    """
    Figure, FigureCanvasAgg = matplotlib_classes()
    _check_plot(runs, labels, window)
    names = list(labels) if labels is not None else _default_labels(runs)
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    by_steps, by_wall = fig.subplots(1, 2, sharey=True)
    if metrics:
        return _metric_figure(by_steps, by_wall, runs, names, window, fig)
    for run, name in zip(runs, names, strict=True):
        color = None
        if run.episodes:
            steps, walls, returns = zip(*run.episodes, strict=True)
            mean = rolling_mean(returns, window)
            (line,) = by_steps.plot(steps, mean, label=name, linewidth=1.5)
            color = line.get_color()
            by_wall.plot(walls, mean, color=color, linewidth=1.5)
        if run.evals:
            steps, walls, means, stds = zip(*run.evals, strict=True)
            style = {"fmt": "o:", "markersize": 3, "capsize": 2, "linewidth": 1}
            bars = by_steps.errorbar(
                steps, means, yerr=stds, color=color, label=f"{name} (eval)", **style
            )
            by_wall.errorbar(walls, means, yerr=stds, color=bars.lines[0].get_color(), **style)
    for value, envs in reward_thresholds(runs):
        label = f"reward threshold {value:g} ({', '.join(envs)})"
        by_steps.axhline(value, color="0.3", linestyle="--", linewidth=1, label=label)
        by_wall.axhline(value, color="0.3", linestyle="--", linewidth=1)
    by_steps.set_xlabel("env steps")
    by_wall.set_xlabel("wall time (s)")
    ylabel = f"mean return of the last {window} episodes"
    if any(run.evals for run in runs):
        ylabel += "\n(eval: mean ± std of each evaluation)"
    by_steps.set_ylabel(ylabel)
    for ax in (by_steps, by_wall):
        ax.grid(True, alpha=0.3)
    by_steps.set_title("return vs env steps")
    by_wall.set_title("return vs wall time")
    by_steps.legend(loc="best", fontsize="small")
    return fig


def _metric_figure(
    by_steps: Any, by_wall: Any, runs: Sequence[Run], names: list[str], window: int, fig: Any
) -> Any:
    """:func:`build_figure` of the runs' ``series``: one line per run and metric."""
    for run, name in zip(runs, names, strict=True):
        if not run.series:
            raise UsageError(f"run {str(run.path)!r} has none of the metrics asked for")
        for key, points in sorted(run.series.items()):
            steps, walls, values = zip(*points, strict=True)
            mean = rolling_mean(values, window)
            (line,) = by_steps.plot(steps, mean, label=f"{name}: {key}", linewidth=1.2)
            by_wall.plot(walls, mean, color=line.get_color(), linewidth=1.2)
    by_steps.set_xlabel("env steps")
    by_wall.set_xlabel("wall time (s)")
    by_steps.set_ylabel(f"mean of the last {window} records")
    for ax in (by_steps, by_wall):
        ax.grid(True, alpha=0.3)
    by_steps.legend(loc="best", fontsize="small")
    return fig


def _check_plot(runs: Sequence[Run], labels: Sequence[str] | None, window: int) -> None:
    if not runs:
        raise UsageError("give at least one run directory to plot")
    if window < 1:
        raise UsageError(f"--window must be >= 1, got {window}")
    if labels is not None and len(labels) != len(runs):
        raise UsageError(
            f"{len(labels)} --label given for {len(runs)} run directories; give one per run "
            "directory, in the same order, or none"
        )
    for run in runs:
        if not run.episodes and not run.evals:
            raise UsageError(
                f"run {str(run.path)!r} has no episodes in metrics.jsonl yet; nothing to plot "
                "(leave it out or wait until it has finished a few episodes)"
            )


def reward_thresholds(runs: Sequence[Run]) -> list[tuple[float, list[str]]]:
    """Each reward threshold of the runs' envs, with the envs that have it."""
    thresholds: dict[float, list[str]] = {}
    for run in runs:
        if run.reward_threshold is not None:
            envs = thresholds.setdefault(run.reward_threshold, [])
            if (run.env or "?") not in envs:
                envs.append(run.env or "?")
    return sorted(thresholds.items())


def plot_runs(
    run_dirs: Sequence[str | Path],
    out_path: str | Path,
    labels: Sequence[str] | None = None,
    window: int = 100,
    metrics: Sequence[str] = (),
) -> Path:
    """Plot the learning curves of ``run_dirs`` into ``out_path`` and return its path.

    The format follows the suffix (``.png``, ``.svg``, ``.pdf``, ...); a path without a suffix
    gets ``.png``. See :func:`build_figure` for what is drawn.

    :raises UsageError: a directory is not a run directory or has no episodes yet, the suffix is
        not a format matplotlib writes, the output's directory does not exist, or matplotlib is
        missing (``pip install "mprl[plot]"``).
    """
    _, FigureCanvasAgg = matplotlib_classes()
    out = Path(out_path)
    if not out.suffix:
        out = out.with_suffix(".png")
    fmt = out.suffix[1:].lower()
    supported = FigureCanvasAgg.get_supported_filetypes()
    if fmt not in supported:
        raise UsageError(
            f"cannot write {str(out)!r}: unknown image format {out.suffix!r}; use one of "
            + ", ".join("." + s for s in sorted(supported))
        )
    if not out.parent.is_dir():
        raise UsageError(
            f"cannot write {str(out)!r}: directory {str(out.parent)!r} does not exist; create it "
            "or give another -o"
        )
    runs = [read_run(d, metrics=metrics) for d in run_dirs]
    fig = build_figure(runs, labels=labels, window=window, metrics=metrics)
    try:
        fig.savefig(out, format=fmt, dpi=100)
    except OSError as exc:
        raise UsageError(f"cannot write {str(out)!r}: {exc}") from None
    return out


def _find_run_dirs(root: Path, depth: int) -> list[Path]:
    if is_run_dir(root):
        return [root]  # a run's own checkpoints/ and logs/ hold no runs
    if depth >= MAX_DEPTH:
        return []
    found: list[Path] = []
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    for child in children:
        found.extend(_find_run_dirs(child, depth + 1))
    return found


def _holder(path: Path) -> str | None:
    """The pid holding the run directory's lock (its run is going on), else ``None``."""
    try:  # not through a link, nor blocking on a FIFO planted there
        fd = open_regular(path / ".lock", os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
    finally:
        os.close(fd)
    return None


def _status(run: Run, now: float) -> str:
    if run.summary is not None:
        return str(run.summary.get("status") or MISSING)
    holder = _holder(run.path)
    if holder is not None:
        return f"running (pid {holder})"
    if (run.path / ".lock").exists():  # the lock of a run that ended without a summary
        return "incomplete"
    try:
        modified = (run.path / "metrics.jsonl").stat().st_mtime
    except OSError:
        return "incomplete"
    return "running?" if now - modified < RUNNING_WITHIN_S else "incomplete"


def _started(path: Path) -> float:
    for name in ("config.json", "summary.json"):
        try:
            return (path / name).stat().st_mtime
        except OSError:
            continue
    return 0.0


def list_runs(directory: str | Path = "runs") -> list[dict[str, Any]]:
    """The run directories under ``directory`` (itself included, up to 3 levels down), oldest
    first by the time ``config.json`` was written.

    Each row has ``run_dir`` (``directory`` joined with the run's relative path, as ``plot`` and
    ``run --resume`` take it), ``plugin``, ``env``, ``env_steps``, ``wall_s``, ``best_return``,
    ``last_eval`` (the mean return of its last evaluation, ``--eval-every``), ``solved`` and
    ``status``; a value the run never wrote is ``None``. A run without
    ``summary.json`` gets its numbers from ``metrics.jsonl`` and the status ``"running (pid N)"``
    while a process holds its lock (``"running?"``: no lock file, metrics written in the last
    minute), else ``"incomplete"``. A damaged ``config.json`` or ``summary.json`` leaves the
    values it would have given missing; the rest is shown.

    :raises UsageError: ``directory`` does not exist or is not a directory.
    """
    root = Path(directory)
    try:
        found, there = root.is_dir(), root.exists()
    except OSError as exc:  # a name longer than the file system allows
        raise UsageError(f"cannot read {str(root)!r}: {exc.strerror or exc}") from None
    if not found:
        what = "does not exist" if not there else "is not a directory"
        raise UsageError(
            f"{str(root)!r} {what}; give the directory your runs are in (default: runs)"
        )
    now = time.time()
    rows = []
    for path in sorted(_find_run_dirs(root, 0), key=lambda p: (_started(p), str(p))):
        try:
            run = read_run(path)
        except UsageError:  # config.json alone: a run that died before its first record
            run = Run(path=path, label=path.name)
            with contextlib.suppress(UsageError):
                run.config = _read_json(path / "config.json") or {}
        s = run.summary or {}
        best = s.get("best_return") if run.summary is not None else None
        if run.summary is None and run.episodes:
            best = max(r for _, _, r in run.episodes)
        rows.append(
            {
                "run_dir": str(path),
                "plugin": run.plugin,
                "env": run.env,
                "env_steps": s.get("env_steps", run.last_step),
                "wall_s": s.get("wall_s", run.last_wall),
                "best_return": best,
                "last_eval": run.evals[-1][2] if run.evals else None,
                "solved": s.get("solved"),
                "status": _status(run, now),
            }
        )
    return rows


def format_wall(seconds: float | None) -> str:
    """``12.3 s``, ``4m05s``, ``2h07m``; ``-`` for ``None``."""
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return MISSING
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _cell(key: str, value: Any) -> str:
    if value is None:
        return MISSING
    if key == "env_steps" and isinstance(value, int | float):
        return f"{int(value):,}"
    if key == "wall_s":
        return format_wall(value)
    if key in ("best_return", "last_eval") and isinstance(value, int | float):
        return f"{value:.1f}"
    if key == "solved":
        return "yes" if value else "no"
    return str(value)


_COLUMNS = (
    ("run_dir", "RUN DIR"),
    ("plugin", "PLUGIN"),
    ("env", "ENV"),
    ("env_steps", "ENV STEPS"),
    ("wall_s", "WALL"),
    ("best_return", "BEST RETURN"),
    ("last_eval", "LAST EVAL"),  # shown when a run has evaluations (--eval-every)
    ("solved", "SOLVED"),
    ("status", "STATUS"),
)
_RIGHT = {"env_steps", "wall_s", "best_return", "last_eval"}


def format_runs(rows: Sequence[dict[str, Any]], directory: str | Path = "runs") -> str:
    """``rows`` of :func:`list_runs` as an aligned text table (``-`` where a value is missing;
    the ``LAST EVAL`` column only when a run has evaluations); ``no runs under DIRECTORY`` when
    there are none."""
    if not rows:
        return f"no runs under {directory}"
    evaluated = any(row.get("last_eval") is not None for row in rows)
    columns = [c for c in _COLUMNS if evaluated or c[0] != "last_eval"]
    table = [[title for _, title in columns]]
    table += [[_cell(key, row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    lines = []
    for line in table:
        cells = [
            text.rjust(width) if key in _RIGHT else text.ljust(width)
            for (key, _), text, width in zip(columns, line, widths, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
