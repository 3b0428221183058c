"""Reading finished (or unfinished) run directories back: learning-curve plots and a run table.

``python -m mprl plot RUN_DIR ...`` and ``python -m mprl runs [DIR]`` are built on this module.
matplotlib is needed for plots only (``pip install "mprl[plot]"``); listing runs needs nothing.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mprl.errors import UsageError
from mprl.files import held_by

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RUNNING_WITHIN_S = 60.0  # no summary.json and metrics written this recently: "running?"
MAX_DEPTH = 3  # how deep `list_runs` looks for run directories
MISSING = "-"
MAX_CELL = 60  # characters of a value read from a file that `mprl runs` shows
#: the most episodes one summed-up record of ``metrics.jsonl`` may stand for (a worker's
#: episodes of one second): a record that says more is not read
MAX_EPISODE_COUNT = 1_000_000


def shown(value: Any) -> str:
    """``value`` as text that is safe to print on a terminal: each control character (an
    escape sequence's ESC, a newline, a bidi override) and each undecodable byte of a file name
    is shown as Python writes it in a string (``\\x1b``, ``\\n``, ``\\u202e``, ``\\udcff``)."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


#: what the values of a run's ``config.json`` and ``summary.json`` that `runs` and `plot` read
#: must be, in JSON's words, when they are there: a file with one of another kind is not read
CONFIG_FIELDS = {"plugin": "string", "run": "object", "reward_threshold": "number or null"}
RUN_FIELDS = {"env": "string"}  # of config.json's "run"
SUMMARY_FIELDS = {
    "status": "string", "plugin": "string", "env": "string", "env_steps": "integer or null",
    "episodes": "integer or null", "wall_s": "number or null", "best_return": "number or null",
    "solved": "boolean or null",
}  # fmt: skip


def _kind(value: Any) -> str:
    """The kind of a JSON value in JSON's words (``NaN`` and ``Infinity`` named as such)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value).replace("nan", "NaN").replace("inf", "Infinity")
    if isinstance(value, int):
        return "integer"
    kinds = {float: "number", str: "string", list: "array", dict: "object"}
    return kinds.get(type(value), type(value).__name__)


def _fits(value: Any, wanted: str) -> bool:
    """Whether ``value`` is of the kinds ``wanted`` names (an integer is a number too)."""
    kind = _kind(value)
    return kind in wanted.split(" or ") or (kind == "integer" and "number" in wanted)


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
    #: what of the run directory could not be read and was left out, one line per file
    #: (``'runs/x/config.json' (nested too deeply)``); a missing file is not in it
    skipped: list[str] = field(default_factory=list)

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


class _Unreadable(Exception):
    """Why a file of a run directory cannot be read (its text: ``nested too deeply``)."""


def _read_json(path: Path, fields: dict[str, str] | None = None) -> Any:
    """The JSON object of ``path``, its ``fields`` (those present) of the types given, and their
    ``run`` object's :data:`RUN_FIELDS`, of the kinds named there; ``None`` when the file is
    missing.

    :raises _Unreadable: it cannot be read, is no JSON object, or a field has another type.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise _Unreadable("not UTF-8 text") from None
    except OSError as exc:
        raise _Unreadable(exc.strerror or str(exc)) from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise _Unreadable("nested too deeply") from None
    except ValueError as exc:
        raise _Unreadable(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _Unreadable(f"a JSON {_kind(data)}, not an object")
    for where, want, have in [("", fields or {}, data), ("run.", RUN_FIELDS, data.get("run"))]:
        if not isinstance(have, dict):
            continue
        for key, wanted in want.items():
            if key in have and not _fits(have[key], wanted):
                kind = _kind(have[key])
                raise _Unreadable(f"{where}{key} is {kind}, not {wanted}")
    return data


def _readable(
    path: Path, skipped: list[str], fields: dict[str, str] | None = None
) -> dict[str, Any] | None:
    """:func:`_read_json`, with ``None`` for a file that is there but cannot be read, which is
    named in ``skipped`` with why."""
    try:
        return _read_json(path, fields)
    except _Unreadable as exc:
        skipped.append(f"{str(path)!r} ({exc})")
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
    agent's return of a multi-agent run (``return_<agent>``), ``"teams"`` for each team's
    (``return_team_<team>``, logged where the agents make several teams).

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
    skipped: list[str] = []
    run = Run(
        path=p,
        label=label if label is not None else (p.resolve().name or str(p)),
        # damaged: what the rest holds still counts
        config=_readable(p / "config.json", skipped, CONFIG_FIELDS) or {},
        summary=_readable(p / "summary.json", skipped, SUMMARY_FIELDS),
        skipped=skipped,
    )
    if not metrics_file.is_file():
        return run
    try:
        with metrics_file.open("rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read {str(metrics_file)!r}: {exc}") from None
    bad = _add_records(run, lines, metrics)
    if bad:
        run.skipped.append(
            f"{bad:,} line{'s' * (bad > 1)} of {str(metrics_file)!r} (nested too deeply, or a "
            "step, wall or episode count that no run writes)"
        )
    return run


def _add_records(run: Run, lines: list[bytes], metrics: Sequence[str]) -> int:
    """The episodes, evaluations and ``metrics`` of ``metrics.jsonl``'s ``lines`` into ``run``;
    returns how many lines were records no run writes (nested too deeply, a step or wall that
    is no finite number, more episodes than :data:`MAX_EPISODE_COUNT` or than env steps), which
    are left out. A line cut short by a kill (not JSON) is left out without a count."""
    bad = 0
    for line in lines:
        try:
            record = json.loads(line)
        except RecursionError:
            bad += 1
            continue
        except ValueError:  # a line cut short by a kill, or garbage: not a record
            continue
        if not isinstance(record, dict):
            continue
        step, wall = record.get("step"), record.get("wall")
        if not isinstance(step, int | float) or not isinstance(wall, int | float):
            continue
        count = record.get("episode_count", 1)  # summed-up episodes count as many
        count = count if isinstance(count, int) and count > 0 else 1
        if not (_finite(step) and _finite(wall)) or count > min(MAX_EPISODE_COUNT, max(step, 1)):
            bad += 1
            continue
        run.last_step, run.last_wall = int(step), float(wall)
        ret = record.get("episode_return")
        if _finite(ret):
            run.episodes.extend([(int(step), float(wall), float(ret))] * count)
        if metrics:
            _collect(run.series, record, metrics, int(step), float(wall))
        mean, std = record.get("eval_return_mean"), record.get("eval_return_std", 0.0)
        if record.get("source") == "eval" and _finite(mean):
            std = float(std) if _finite(std) else 0.0
            run.evals.append((int(step), float(wall), float(mean), std))
    run.episodes.sort(key=lambda episode: episode[1])  # stable: ties keep the file's order
    run.evals.sort(key=lambda evaluation: evaluation[0])
    return bad


def _collect(
    series: dict[str, list[tuple[int, float, float]]],
    record: dict[str, Any],
    metrics: Sequence[str],
    step: int,
    wall: float,
) -> None:
    for key, value in record.items():
        team = key.startswith("return_team_")
        wanted = (
            key in metrics
            or ("agents" in metrics and key.startswith("return_") and not team)
            or ("teams" in metrics and team)
        )
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
    """The directories' names (:func:`shown`: a name can hold anything), or their paths where
    two have one name."""
    labels = [shown(r.label) for r in runs]
    if len(set(labels)) == len(labels):
        return labels
    return [shown(r.path) for r in runs]  # two runs/x/run directories: tell them apart by path


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
    draw_thresholds(by_steps, by_wall, runs)
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


def draw_thresholds(by_steps: Any, by_wall: Any, runs: Sequence[Run]) -> None:
    """Each reward threshold of the runs' envs as a dashed line on both axes (labelled on the
    first)."""
    for value, envs in reward_thresholds(runs):
        label = f"reward threshold {value:g} ({', '.join(envs)})"
        by_steps.axhline(value, color="0.3", linestyle="--", linewidth=1, label=label)
        by_wall.axhline(value, color="0.3", linestyle="--", linewidth=1)


def reward_thresholds(runs: Sequence[Run]) -> list[tuple[float, list[str]]]:
    """Each reward threshold of the runs' envs, with the envs that have it."""
    thresholds: dict[float, list[str]] = {}
    for run in runs:
        if run.reward_threshold is not None:
            envs = thresholds.setdefault(run.reward_threshold, [])
            if shown(run.env or "?") not in envs:
                envs.append(shown(run.env or "?"))
    return sorted(thresholds.items())


def plot_runs(
    run_dirs: Sequence[str | Path],
    out_path: str | Path,
    labels: Sequence[str] | None = None,
    window: int = 100,
    metrics: Sequence[str] = (),
    skipped: list[str] | None = None,
    across_seeds: Callable[[Sequence[Run], int], Figure | None] | None = None,
) -> Path:
    """Plot the learning curves of ``run_dirs`` into ``out_path`` and return its path.

    The format follows the suffix (``.png``, ``.svg``, ``.pdf``, ...); a path without a suffix
    gets ``.png``. See :func:`build_figure` for what is drawn; ``across_seeds(runs, window)``
    may draw several runs without ``labels`` or ``metrics`` instead, unless it returns ``None``
    (`mprl plot`: :func:`mprl.tools.aggregate.seeds_figure`). What of the run directories
    cannot be read (a damaged ``config.json``, lines of ``metrics.jsonl`` no run writes) is left
    out, each file named in ``skipped`` when given (:attr:`Run.skipped`); so is a run that
    has nothing left to draw for it, while another has (named there too).

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
    left_out = [line for run in runs for line in run.skipped]
    drawn = [i for i, r in enumerate(runs) if r.episodes or r.evals or (metrics and r.series)]
    if drawn and len(drawn) < len(runs):  # a damaged run with nothing to draw: the rest is
        for i, run in enumerate(runs):
            if i not in drawn and run.skipped:
                left_out.append(f"{str(run.path)!r} (nothing in it could be drawn)")
        drawn = [i for i, r in enumerate(runs) if i in drawn or not r.skipped]
        runs = [runs[i] for i in drawn]
        labels = None if labels is None else [labels[i] for i in drawn]
    if skipped is not None:
        skipped.extend(left_out)
    several = across_seeds is not None and len(runs) > 1 and not (metrics or labels is not None)
    fig = across_seeds(runs, window) if several else None  # type: ignore[misc]
    if fig is None:
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
    return None


def _status(run: Run, now: float) -> str:
    if run.summary is not None:
        return str(run.summary.get("status") or MISSING)
    holder = held_by(run.path)
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


def list_runs(
    directory: str | Path = "runs", skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    """The run directories under ``directory`` (itself included, up to 3 levels down), oldest
    first by the time ``config.json`` was written.

    Each row has ``run_dir`` (``directory`` joined with the run's relative path, as ``plot`` and
    ``run --resume`` take it), ``plugin``, ``env``, ``env_steps``, ``wall_s``, ``best_return``,
    ``last_eval`` (the mean return of its last evaluation, ``--eval-every``), ``solved`` and
    ``status``; a value the run never wrote is ``None``. A run without
    ``summary.json`` gets its numbers from ``metrics.jsonl`` and the status ``"running (pid N)"``
    while a process holds its lock (``"running?"``: no lock file, metrics written in the last
    minute), else ``"incomplete"``. A damaged ``config.json`` or ``summary.json`` (not JSON,
    nested too deeply, a value of the wrong type) leaves the values it would have given
    missing, and so do the lines of ``metrics.jsonl`` that no run writes; the rest is shown,
    and each such file is named in ``skipped`` when given (:attr:`Run.skipped`).

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
            run.config = _readable(path / "config.json", run.skipped, CONFIG_FIELDS) or {}
        if skipped is not None:
            skipped.extend(run.skipped)
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
    """A value of a row as ``runs`` shows it; what was read from a file is :func:`shown` (its
    control characters visible), and cut at :data:`MAX_CELL` characters."""
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
    text = shown(value)
    if key != "run_dir" and len(text) > MAX_CELL:
        text = text[: MAX_CELL - 3] + "..."
    return text


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
