"""A sweep's results, read back from its run directories alone: one row per config, its
objective, the table, ``results.csv``, ``results.json``, the plot ``sweep.png`` and the
performance profiles ``profiles.png``. Across seeds each config has the IQM of its runs' final
scores with a 95% stratified-bootstrap interval (rliable, :mod:`mprl.tools.aggregate`)."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mprl.errors import UsageError
from mprl.tools import aggregate
from mprl.tools.report import (
    format_wall,
    matplotlib_classes,
    read_run,
    reward_thresholds,
    rolling_mean,
)
from mprl_builtin.sweep.spec import OBJECTIVES, Spec, read_spec
from mprl_builtin.sweep.sweepdir import read_text, write

DONE = ("finished", "failed")  # a run's summary status that is a result, never re-run


def _summary(path: Path) -> dict[str, Any] | None:
    try:  # a regular file only: a link there is no result of the run's
        data = json.loads(read_text(path / "summary.json"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_done(path: Path) -> bool:
    """Whether run directory ``path`` ended with a result (finished or failed): never re-run."""
    summary = _summary(path)
    return summary is not None and summary.get("status") in DONE


# -- results -----------------------------------------------------------------------------------


def _solve(summary: Mapping[str, Any], key: str) -> float | None:
    """``wall_s`` or ``env_steps`` at which the run was solved; ``None`` when it was not."""
    if not summary.get("solved"):
        return None
    at = summary.get("solved_at") or summary
    value = at.get(key)
    return float(value) if isinstance(value, int | float) else None


def objective_value(
    objective: str, runs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]
) -> float:
    """The objective over a config's runs, each ``(summary, run options of config.json)``."""
    if objective == "return":
        means = [
            s["mean_return_100"]
            for s, _ in runs
            if isinstance(s.get("mean_return_100"), int | float)
        ]
        return statistics.fmean(means) if means else -math.inf
    key, cap_of = ("wall_s", "max_time") if objective == "time" else ("env_steps", "total_steps")
    values = []
    for summary, run in runs:
        solved = _solve(summary, key)
        cap = run.get(cap_of)
        values.append(solved if solved is not None else float(cap) if cap else math.inf)
    return statistics.median(values) if values else math.inf


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def sweep_results(sweep_dir: str | Path) -> tuple[Spec, list[dict[str, Any]]]:
    """The sweep's spec and one row per config that has a finished run, best objective first.

    A row: ``config`` (``name=value ...``), ``key``, ``params``, ``runs`` (finished or failed),
    ``failed``, ``solved``, ``solve_rate``, ``median_solve_s`` / ``median_solve_steps`` (of the
    solved runs), ``best_return`` (the best episode of any run), ``mean_return_100`` (the mean
    over the runs of their final mean return(100)), ``objective`` and ``run_dirs``. Read from
    the run directories alone.

    :raises UsageError: ``sweep_dir`` holds no ``sweep.json``.
    """
    root = Path(sweep_dir)
    spec = read_spec(root)
    groups: dict[str, list[Path]] = {}
    trials = root / "trials"
    for path in sorted(trials.iterdir()) if trials.is_dir() and not trials.is_symlink() else []:
        key, sep, _ = path.name.rpartition("-seed")
        if sep and not path.is_symlink() and is_done(path):  # a link: not a run of the sweep
            groups.setdefault(key, []).append(path)
    rows = [_row(spec, key, paths) for key, paths in groups.items()]
    sign = -1 if spec.direction == "maximize" else 1
    rows.sort(key=lambda r: (sign * r["objective"], r["config"]))
    return spec, rows


def _row(spec: Spec, key: str, paths: list[Path]) -> dict[str, Any]:
    runs = []
    params: dict[str, Any] = {}
    scores: list[tuple[float, str]] = []
    for path in paths:
        run = read_run(path)
        if (score := aggregate.final_score(run)) is not None:
            scores.append(score)
        summary = run.summary or {}
        options = run.config.get("run") or {}
        runs.append((summary, options))
        config = run.config.get("config") or {}
        for name in spec.axes:
            params[name] = config[name] if name in config else options.get(name)
    summaries = [s for s, _ in runs]
    solved_s = [v for s in summaries if (v := _solve(s, "wall_s")) is not None]
    solved_steps = [v for s in summaries if (v := _solve(s, "env_steps")) is not None]
    best = [s["best_return"] for s in summaries if isinstance(s.get("best_return"), int | float)]
    means = [
        s["mean_return_100"] for s in summaries if isinstance(s.get("mean_return_100"), int | float)
    ]
    return {
        "config": " ".join(
            f"{n}={json.dumps(v) if not isinstance(v, str) else v}" for n, v in params.items()
        )
        or "base",
        "key": key,
        "params": params,
        "runs": len(runs),
        "failed": sum(s.get("status") == "failed" for s in summaries),
        "solved": len(solved_s),
        "solve_rate": len(solved_s) / len(runs),
        "median_solve_s": _median(solved_s),
        "median_solve_steps": _median(solved_steps),
        "best_return": max(best) if best else None,
        "mean_return_100": statistics.fmean(means) if means else None,
        "objective": objective_value(spec.objective, runs),
        **_across_seeds(scores),
        "run_dirs": [str(p) for p in paths],
    }


def _across_seeds(scores: Sequence[tuple[float, str]]) -> dict[str, Any]:
    """``scores`` (each run's final score, :func:`mprl.tools.aggregate.final_score`), their
    kinds (``eval``, ``training`` or ``mixed``), their IQM and its 95% interval (``None`` with
    one score or without rliable)."""
    values = [v for v, _ in scores]
    kinds = {k for _, k in scores}
    point, ci = aggregate.interval(values) if values else (None, None)
    return {
        "scores": values,
        "score_kind": kinds.pop() if len(kinds) == 1 else "mixed" if kinds else None,
        "iqm": point,
        "iqm_ci": list(ci) if ci is not None else None,
    }


def format_results(spec: Spec, rows: Sequence[dict[str, Any]]) -> str:
    """The results table: one line per config."""
    if not rows:
        return "no finished runs yet"
    direction = "max" if spec.direction == "maximize" else "min"
    head = ["CONFIG", "RUNS", "SOLVED", "SOLVE TIME", "SOLVE STEPS", "BEST RETURN", "RETURN(100)",
            "IQM [95% CI]", f"{spec.objective.upper()} ({direction})"]  # fmt: skip

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    table = [head]
    for r in rows:
        solved = f"{r['solved']}/{r['runs']} ({r['solve_rate']:.0%})"
        if r["failed"]:
            solved += f", {r['failed']} failed"
        steps = None if r["median_solve_steps"] is None else int(r["median_solve_steps"])
        table.append([
            r["config"], str(r["runs"]), solved, format_wall(r["median_solve_s"]),
            num(steps, ","), num(r["best_return"], ".1f"), num(r["mean_return_100"], ".1f"),
            _iqm_cell(r), num(r["objective"], ".4g"),
        ])  # fmt: skip
    widths = [max(len(line[i]) for line in table) for i in range(len(head))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in table
    )


def _iqm_cell(row: Mapping[str, Any]) -> str:
    if row["iqm"] is None:
        return "-"
    if row["iqm_ci"] is None:  # one seed, or no rliable: no interval to show
        return f"{row['iqm']:.1f} [-]"
    low, high = row["iqm_ci"]
    return f"{row['iqm']:.1f} [{low:.1f}, {high:.1f}]"


def stats_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the IQM column is, how many seeds each config had, and why an interval is not
    there (one seed; rliable missing)."""
    if not rows:
        return []
    kinds = {r["score_kind"] for r in rows if r["score_kind"]}
    what = {
        frozenset({"eval"}): "its last evaluation's mean return (--eval-every)",
        frozenset({"training"}): "the mean return of its last 100 training episodes",
    }.get(frozenset(kinds), "its last evaluation's mean return where it has evaluations, "
                           "else the mean return of its last 100 training episodes")  # fmt: skip
    seeds = sorted({len(r["scores"]) for r in rows})
    counts = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]} to {seeds[-1]}"
    lines = [
        f"IQM: the interquartile mean over each config's {counts} seeds of each run's "
        f"final score, {what}; [95% CI]: stratified bootstrap (rliable, "
        f"{aggregate.REPS:,} resamples)"
    ]
    if aggregate.rliable() is None:
        lines.append(f"no intervals: {aggregate.RLIABLE_MISSING}")
    elif one := [r["config"] for r in rows if len(r["scores"]) == 1]:
        lines.append(
            f"no interval for {len(one)} config{'s' * (len(one) > 1)} with 1 seed "
            f"({', '.join(one[:3])}{', ...' if len(one) > 3 else ''}): an interval needs at "
            "least 2 seeds (--seeds)"
        )
    return lines


_CSV = ("config", "key", "runs", "failed", "solved", "solve_rate", "median_solve_s",
        "median_solve_steps", "best_return", "mean_return_100", "iqm", "iqm_low", "iqm_high",
        "score_kind", "objective")  # fmt: skip


def write_results(sweep_dir: str | Path, plot: bool = True) -> str:
    """Write ``results.csv``, ``results.json`` and (with matplotlib) ``sweep.png`` into the
    sweep directory; return the table and where they went, as ``--report`` prints them."""
    root = Path(sweep_dir)
    spec, rows = sweep_results(root)
    data = {"objective": spec.objective, "direction": spec.direction, "sweep": spec.to_dict(),
            "rows": rows}  # fmt: skip
    # each replaced whole (a link there is replaced, never written through)
    write(root / "results.json", (json.dumps(data, indent=2, default=str) + "\n").encode())
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=[*_CSV, *spec.axes], extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        low, high = r["iqm_ci"] or (None, None)
        params = {n: r["params"].get(n) for n in spec.axes}
        writer.writerow({**r, "iqm_low": low, "iqm_high": high, **params})
    write(root / "results.csv", table.getvalue().encode())
    lines = [
        format_results(spec, rows),
        *stats_lines(rows),
        f"objective: {spec.objective}: {OBJECTIVES[spec.objective][1]}",
    ]
    written = [root / "results.csv", root / "results.json"]
    if plot and rows:
        try:
            written.append(plot_sweep(root, rows))
        except UsageError as exc:  # matplotlib missing, no episodes: the table still counts
            lines.append(f"no plot: {exc}")
        if aggregate.rliable() is not None and any(r["scores"] for r in rows):
            try:
                written.append(plot_profiles(root, rows))
            except UsageError as exc:
                lines.append(f"no performance profiles: {exc}")
    lines.append("written: " + ", ".join(str(p) for p in written))
    return "\n".join(lines)


def plot_sweep(sweep_dir: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """``sweep.png``: the mean return(100) of every run vs env steps and vs wall time, one
    colour per config (its seeds as thin lines), the env's threshold dashed."""
    Figure, FigureCanvasAgg = matplotlib_classes()
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    by_steps, by_wall = fig.subplots(1, 2, sharey=True)
    runs = []
    for index, row in enumerate(rows):
        color = f"C{index % 10}"
        for n, path in enumerate(row["run_dirs"]):
            run = read_run(path)
            runs.append(run)
            if not run.episodes:
                continue
            steps, walls, returns = zip(*run.episodes, strict=True)
            mean = rolling_mean(returns, 100)
            label = row["config"] if n == 0 else None
            by_steps.plot(steps, mean, color=color, linewidth=1, alpha=0.8, label=label)
            by_wall.plot(walls, mean, color=color, linewidth=1, alpha=0.8)
    for value, envs in reward_thresholds(runs):
        by_steps.axhline(
            value,
            color="0.3",
            linestyle="--",
            linewidth=1,
            label=f"threshold {value:g} ({', '.join(envs)})",
        )
        by_wall.axhline(value, color="0.3", linestyle="--", linewidth=1)
    by_steps.set_xlabel("env steps")
    by_wall.set_xlabel("wall time (s)")
    by_steps.set_ylabel("mean return of the last 100 episodes")
    for ax in (by_steps, by_wall):
        ax.grid(True, alpha=0.3)
    by_steps.legend(loc="best", fontsize="small")
    out, image = sweep_dir / "sweep.png", io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    write(out, image.getvalue())
    return out


def plot_profiles(sweep_dir: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """``profiles.png``: each config's performance profile, the fraction of its runs whose
    final score is above each threshold tau, with its 95% stratified-bootstrap band (rliable's
    ``create_performance_profile``); the env's reward threshold dashed."""
    Figure, FigureCanvasAgg = matplotlib_classes()
    scored = [r for r in rows if r["scores"]]
    thresholds = reward_thresholds([read_run(p) for r in scored for p in r["run_dirs"][:1]])
    # from the lowest score to the highest, the env's threshold within (all 500: 475 to 500)
    every = [v for r in scored for v in r["scores"]] + [value for value, _ in thresholds]
    low, high = min(every), max(every)
    if high == low:
        low, high = low - 1, high + 1
    taus = np.linspace(low, high, 201)
    profiles = aggregate.performance_profiles({r["config"]: r["scores"] for r in scored}, taus)
    fig = Figure(figsize=(7, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for index, row in enumerate(scored):
        color = f"C{index % 10}"
        point, band = profiles[row["config"]]
        label = f"{row['config']} ({len(row['scores'])} seed{'s' * (len(row['scores']) > 1)})"
        ax.plot(taus, point, color=color, linewidth=1.5, label=label)
        if len(row["scores"]) > 1:  # one run has no spread to resample
            ax.fill_between(taus, band[0], band[1], color=color, alpha=0.2, linewidth=0)
    for value, envs in thresholds:
        ax.axvline(value, color="0.3", linestyle="--", linewidth=1,
                   label=f"threshold {value:g} ({', '.join(envs)})")  # fmt: skip
    kinds = {r["score_kind"] for r in scored}
    ax.set_xlabel("final score tau: " + ("last evaluation's mean return" if kinds == {"eval"}
                  else "mean return of the last 100 episodes" if kinds == {"training"}
                  else "last evaluation's, else the last 100 episodes', mean return"))  # fmt: skip
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, alpha=0.3)
    ax.set_title("performance profiles (95% stratified-bootstrap bands)")
    ax.legend(loc="best", fontsize="small")
    out, image = sweep_dir / "profiles.png", io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    write(out, image.getvalue())
    return out
