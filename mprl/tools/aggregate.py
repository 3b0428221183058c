"""Statistics across seeds, as rliable (Agarwal et al. 2021) reports them: the interquartile
mean (IQM: the mean of the middle half of the runs) with a 95% stratified-bootstrap interval,
and performance profiles (the fraction of runs scoring above each threshold, with its band).

``mprl sweep``'s report and ``mprl plot`` of several seeds use it. The IQM itself needs only
numpy; the intervals and profiles need rliable (``pip install "mprl[stats]"``): without it
each caller says so in one line (:data:`RLIABLE_MISSING`) and prints no interval.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mprl.errors import UsageError
from mprl.tools.report import (
    Run,
    _check_plot,
    draw_thresholds,
    matplotlib_classes,
    rolling_mean,
    shown,
)

RLIABLE_MISSING = (
    'intervals across seeds need rliable, which is not installed: pip install "mprl[stats]"'
)
CONFIDENCE = 0.95
REPS = 5_000  # bootstrap resamples of a final score's interval (rliable's default: 50,000)
CURVE_REPS = 2_000  # of each point of a curve (rliable's own curves use 2,000)
CURVE_POINTS = 100  # where a curve across seeds is computed
SEED = 0  # of the bootstrap: the same runs give the same interval every time


def rliable() -> tuple[Any, Any] | None:
    """rliable's ``library`` and ``metrics`` modules, or ``None`` when it is not installed."""
    try:
        from rliable import library, metrics
    except ImportError:
        return None
    return library, metrics


def _bootstrap(library: Any, scores: Mapping[str, np.ndarray], func: Callable, reps: int) -> Any:
    """rliable's ``get_interval_estimates``: stratified over runs, the same every time."""
    # rliable 1.2's StratifiedBootstrap draws from numpy's global generator whatever
    # random_state it is given: seed that for the call and put it back
    state = np.random.get_state()
    np.random.seed(SEED)
    try:
        with warnings.catch_warnings():  # arch 7 warns that random_state is going
            warnings.simplefilter("ignore", FutureWarning)
            return library.get_interval_estimates(
                scores,
                func,
                reps=reps,
                confidence_interval_size=CONFIDENCE,
                random_state=np.random.RandomState(SEED),
            )
    finally:
        np.random.set_state(state)


def iqm(values: Sequence[float] | np.ndarray, axis: int | None = None) -> Any:
    """The interquartile mean: ``floor(n / 4)`` values cut from each end, the rest averaged
    (scipy's ``trim_mean(values, 0.25)``, which is rliable's ``aggregate_iqm``)."""
    x = np.sort(np.asarray(values, dtype=float), axis=axis)
    if axis is None:
        x, axis = x.ravel(), 0
    n = x.shape[axis]
    cut = int(0.25 * n)
    return np.take(x, range(cut, n - cut), axis=axis).mean(axis=axis)


def final_score(run: Run, window: int = 100) -> tuple[float, str] | None:
    """A run's final score and what it is: ``"eval"``, the mean return of its last evaluation
    (``--eval-every``: the policy of its end, without exploration), or else ``"training"``, the
    mean return of its last ``window`` training episodes (``summary.json``'s
    ``mean_return_100`` where there are no episodes to read); ``None`` when it has neither."""
    if run.evals:
        return run.evals[-1][2], "eval"
    if run.episodes:
        last = [ret for _, _, ret in run.episodes[-window:]]
        return float(np.mean(last)), "training"
    value = (run.summary or {}).get("mean_return_100")
    if isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value):
        return float(value), "training"
    return None


def interval(
    scores: Sequence[float], reps: int | None = None
) -> tuple[float, tuple[float, float] | None]:
    """The IQM of ``scores`` (one per seed) and its 95% stratified-bootstrap interval
    (rliable's ``get_interval_estimates`` of ``aggregate_iqm``, :data:`REPS` resamples unless
    ``reps``); the interval is ``None`` with fewer than 2 scores (one seed has no spread to
    resample) or without rliable."""
    point = float(iqm(scores))
    lib = rliable()
    if lib is None or len(scores) < 2:
        return point, None
    library, _ = lib
    matrix = np.asarray(scores, dtype=float).reshape(-1, 1)  # runs x tasks: one task
    # iqm(m) is metrics.aggregate_iqm(m) (scipy's trim_mean), computed with numpy alone: the
    # same interval, a fifth of the time (tests/unit/test_aggregate.py)
    _, cis = _bootstrap(library, {"x": matrix}, lambda m: np.array([iqm(m)]), reps or REPS)
    low, high = cis["x"][:, 0]
    return point, (float(low), float(high))


def performance_profiles(
    scores: Mapping[str, Sequence[float]], taus: np.ndarray, reps: int | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each name, the fraction of its runs scoring above each of ``taus`` and the 95%
    stratified-bootstrap band of it (:data:`CURVE_REPS` resamples unless ``reps``),
    ``(2, len(taus))`` (what rliable's
    ``create_performance_profile`` computes). Needs rliable (a :class:`UsageError` without it)."""
    lib = rliable()
    if lib is None:
        raise UsageError(RLIABLE_MISSING)
    library, _ = lib
    # create_performance_profile's own call, made the same every time as the others, with
    # library.score_distributions(m, taus) (a Python loop over taus) as one numpy comparison:
    # the same band, a twentieth of the time (tests/unit/test_aggregate.py)
    matrices = {k: np.asarray(v, dtype=float).reshape(-1, 1) for k, v in scores.items()}
    points, cis = _bootstrap(library, matrices, _above(taus), reps or CURVE_REPS)
    return {k: (np.asarray(points[k]), np.asarray(cis[k])) for k in scores}


def _above(taus: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The fraction of a runs x tasks matrix's scores above each of ``taus``, as rliable's
    ``score_distributions`` computes it (strictly above)."""
    taus = np.asarray(taus, dtype=float)

    def fractions(matrix: np.ndarray) -> np.ndarray:
        return (np.asarray(matrix, dtype=float).reshape(-1, 1) > taus).mean(axis=0)

    return fractions


def iqm_curve(
    series: Sequence[Sequence[tuple[float, float]]], points: int = CURVE_POINTS
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The IQM across runs of ``series`` (each run's ``(x, value)`` pairs, x rising) at
    ``points`` xs, and its 95% bootstrap band ``(2, points)`` (``None`` with one run or
    without rliable).

    Each run counts at an x with its last value at or before it; a run that ended earlier (a
    run stops once solved) keeps its last value, and the curve starts where every run has one.
    """
    series = [s for s in series if len(s)]
    if not series:
        raise UsageError("no runs with values to draw")
    start = max(s[0][0] for s in series)
    end = max(s[-1][0] for s in series)
    xs = np.linspace(start, end, points) if end > start else np.array([float(start)])
    values = np.empty((len(series), len(xs)))
    for i, s in enumerate(series):
        x, y = (np.asarray(c, dtype=float) for c in zip(*s, strict=True))
        values[i] = y[np.searchsorted(x, xs, side="right") - 1]  # the last at or before
    curve = iqm(values, axis=0)
    lib = rliable()
    if lib is None or len(series) < 2:
        return xs, curve, None
    library, _ = lib
    _, cis = _bootstrap(library, {"x": values}, _columns_iqm, CURVE_REPS)
    return xs, curve, np.asarray(cis["x"])


def _columns_iqm(matrix: np.ndarray) -> np.ndarray:
    """The IQM of each column (each x) of a runs x xs matrix, as rliable's curves take it."""
    return np.asarray(iqm(matrix, axis=0))


def group_runs(runs: Sequence[Run]) -> list[tuple[str, list[Run]]]:
    """The runs grouped by configuration, the order of their first run kept: plugin, env and
    algorithm config (``config.json``'s ``config``), every seed of one in a group. A group's
    name is ``PLUGIN ENV``, with the config fields that tell it from the others where several
    share a plugin and env."""
    groups: dict[tuple[str, str, str], list[Run]] = {}
    configs: dict[tuple[str, str, str], dict[str, Any]] = {}
    for run in runs:
        config = run.config.get("config")
        config = config if isinstance(config, dict) else {}
        key = (str(run.plugin), str(run.env), json.dumps(config, sort_keys=True, default=str))
        groups.setdefault(key, []).append(run)
        configs[key] = config
    named = []
    for key, members in groups.items():
        name = shown(f"{key[0]} {key[1]}")
        others = [configs[k] for k in groups if k[:2] == key[:2] and k != key]
        differ = sorted(
            f
            for f in configs[key]
            if any(json.dumps(o.get(f), default=str) != json.dumps(configs[key][f], default=str)
                   for o in others)
        )  # fmt: skip
        if differ:
            name += " " + shown(" ".join(f"{f}={json.dumps(configs[key][f], default=str)}"
                                         for f in differ))  # fmt: skip
        named.append((name, members))
    return named


def training_series(run: Run, window: int, x: Callable[[tuple[int, float, float]], float]) -> list:
    """``(x, mean return of the last window episodes)`` per episode of ``run``."""
    means = rolling_mean([ret for _, _, ret in run.episodes], window)
    return [(x(e), m) for e, m in zip(run.episodes, means, strict=True)]


def build_iqm_figure(runs: Sequence[Run], window: int = 100) -> Any:
    """The learning curves of ``runs`` across seeds: for each configuration
    (:func:`group_runs`), the IQM over its seeds of the mean return of the last ``window``
    episodes vs env steps (left) and wall seconds (right), with its 95% stratified-bootstrap
    band (:func:`iqm_curve`); where every seed of it has evaluations, their IQM too (dotted,
    with its band). A configuration of one run is its own line. Each env's reward threshold is
    dashed. Needs matplotlib, and rliable for the bands."""
    Figure, FigureCanvasAgg = matplotlib_classes()
    _check_plot(runs, None, window)
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    by_steps, by_wall = fig.subplots(1, 2, sharey=True)
    for index, (name, members) in enumerate(group_runs(runs)):
        color = f"C{index % 10}"
        n = len(members)
        what = f"{name}: IQM of {n} seeds, 95% CI" if n > 1 else f"{name} (1 seed)"
        for ax, x in ((by_steps, _step), (by_wall, _wall)):
            label = what if ax is by_steps else None
            if all(r.episodes for r in members):
                _band(ax, [training_series(r, window, x) for r in members], color, "-", label)
            if all(r.evals for r in members):
                evals = [[(x(e), e[2]) for e in r.evals] for r in members]
                _band(ax, evals, color, ":", f"{what} (eval)" if label else None)
    draw_thresholds(by_steps, by_wall, runs)
    by_steps.set_xlabel("env steps")
    by_wall.set_xlabel("wall time (s)")
    by_steps.set_ylabel(
        f"mean return of the last {window} episodes\n(IQM across seeds; eval: of the means)"
    )
    for ax in (by_steps, by_wall):
        ax.grid(True, alpha=0.3)
    by_steps.set_title("return vs env steps, across seeds")
    by_wall.set_title("return vs wall time, across seeds")
    by_steps.legend(loc="best", fontsize="small")
    return fig


def _step(point: tuple) -> float:
    return float(point[0])


def _wall(point: tuple) -> float:
    return float(point[1])


def _band(ax: Any, series: list, color: str, style: str, label: str | None) -> None:
    """The IQM line of ``series`` on ``ax`` and, with several runs, its band."""
    xs, curve, band = iqm_curve(series)
    ax.plot(xs, curve, style, color=color, linewidth=1.5, label=label)
    if band is not None:
        ax.fill_between(xs, band[0], band[1], color=color, alpha=0.2, linewidth=0)


def seeds_figure(runs: Sequence[Run], window: int, notes: list[str] | None = None) -> Any:
    """:func:`build_iqm_figure` of ``runs`` where a configuration has several seeds among them;
    ``None`` (one line per run: :func:`mprl.tools.report.build_figure`) where none has, or
    without rliable, which ``notes`` is told."""
    if not any(len(members) > 1 for _, members in group_runs(runs)):
        return None
    if rliable() is None:
        if notes is not None:
            notes.append(f"one line per run, no IQM bands: {RLIABLE_MISSING}")
        return None
    return build_iqm_figure(runs, window=window)
