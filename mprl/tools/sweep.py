"""``python -m mprl sweep``: several seeds, a grid or an Optuna search over config fields.

Each run of a sweep is a plain ``python -m mprl run`` subprocess with its own run directory,
``SWEEP_DIR/trials/<config key>-seed<N>/``. Optuna (``pip install "mprl[sweep]"``) keeps what
was asked and what finished in ``SWEEP_DIR/optuna.db`` (SQLite): an Optuna trial is one config,
run once per seed, and its value is the sweep's objective over those runs. That storage is what
makes a stopped sweep resume; the results table is read back from the run directories alone,
so ``--report`` needs neither Optuna nor a finished sweep.

Layout of a sweep directory: ``sweep.json`` (what the sweep is: plugin, config, run options,
seeds, grid, search, objective), ``optuna.db``, ``configs/KEY.toml`` (each config as
``run --config`` takes it), ``trials/KEY-seedN/`` (the run directories), ``logs/KEY-seedN.log``
(each run's output), and at the end ``results.csv``, ``results.json`` and ``sweep.png``.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mprl.errors import UsageError
from mprl.host.config import build, coerce, fields_of, parse_value
from mprl.host.plugins import PluginManager
from mprl.host.progress import say
from mprl.tools.report import format_wall, read_run

INSTALL = 'pip install "mprl[sweep]"'
STUDY = "mprl-sweep"
SPEC_FILE = "sweep.json"
#: objective name -> (Optuna direction, what it is)
OBJECTIVES = {
    "return": ("maximize", "mean over the seeds of the final mean return(100)"),
    "time": (
        "minimize",
        "median over the seeds of the wall seconds to solve; an unsolved run counts as "
        "--max-time (inf without one)",
    ),
    "steps": (
        "minimize",
        "median over the seeds of the env steps to solve; an unsolved run counts as "
        "--total-steps (inf without one)",
    ),
}
DONE = ("finished", "failed")  # a run's summary status that is a result, never re-run
POLL_S = 0.2
_DIST = re.compile(r"^(log|uniform|int|intlog|choice)\((.*)\)$")
_SAFE = re.compile(r"^[A-Za-z0-9._+=,-]+$")


# -- what the user asked for -------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``"0-9"`` (a range, both ends in), ``"0,3,7"`` (a list) or ``"5"`` (a count: 0-4).

    :raises UsageError: anything else, naming ``--seeds`` and the forms it takes.
    """
    spec = text.strip()
    fix = "give a range 0-9, a list 0,3,7 or a count 5 (seeds 0-4)"
    try:
        if re.fullmatch(r"\d+-\d+", spec):
            first, last = (int(n) for n in spec.split("-"))
            if last < first:
                raise ValueError
            return list(range(first, last + 1))
        if "," in spec:
            seeds = [int(part) for part in spec.split(",")]
            if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
                raise ValueError
            return seeds
        count = int(spec)
        if count < 1:
            raise ValueError
        return list(range(count))
    except ValueError:
        raise UsageError(f"--seeds {text!r}: {fix}") from None


def split_values(text: str) -> list[str]:
    """``"1e-3,3e-4"`` -> ``["1e-3", "3e-4"]``; commas inside ``[...]`` stay (``[64,64],[128]``)."""
    values, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            values.append(current.strip())
            current = ""
        else:
            current += char
    values.append(current.strip())
    return values


def parse_grid(items: Sequence[str]) -> dict[str, list[str]]:
    """``["lr=1e-3,3e-4", "hidden=64,128"]`` -> ``{"lr": ["1e-3", "3e-4"], ...}`` (the values'
    text, read as ``--set`` reads it when a run starts)."""
    grid: dict[str, list[str]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        values = split_values(text) if sep else []
        if not name or not values or "" in values:
            raise UsageError(f"--grid {item!r}: expected NAME=V1,V2,..., e.g. --grid lr=1e-3,3e-4")
        if name in grid:
            raise UsageError(f"--grid {name}: given twice; give all its values in one --grid")
        if len(set(values)) != len(values):
            raise UsageError(f"--grid {item!r}: a value is given twice")
        grid[name] = values
    return grid


@dataclass(frozen=True)
class Distribution:
    """One ``--search`` axis: ``log(a,b)`` / ``uniform(a,b)`` (floats), ``int(a,b)`` /
    ``intlog(a,b)`` (integers, both ends in), or ``choice(v1,v2,...)``."""

    kind: str
    low: float = 0.0
    high: float = 0.0
    choices: tuple[str, ...] = ()

    def to_optuna(self) -> Any:
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if self.kind == "choice":
            return CategoricalDistribution(list(self.choices))
        if self.kind in ("int", "intlog"):
            return IntDistribution(int(self.low), int(self.high), log=self.kind == "intlog")
        return FloatDistribution(self.low, self.high, log=self.kind == "log")


def parse_distribution(name: str, text: str) -> Distribution:
    """``"log(1e-4,1e-2)"`` -> :class:`Distribution`; anything else is a UsageError naming
    the field and the forms there are."""
    forms = "log(LOW,HIGH), uniform(LOW,HIGH), int(LOW,HIGH), intlog(LOW,HIGH) or choice(A,B,...)"
    bad = f"--search {name}={text}: "
    match = _DIST.match(text.strip().replace(" ", ""))
    if not match:
        raise UsageError(bad + f'expected {forms}, e.g. --search "lr=log(1e-4,1e-2)"')
    kind, args = match.group(1), split_values(match.group(2))
    if kind == "choice":
        if len(args) < 2 or "" in args or len(set(args)) != len(args):
            raise UsageError(bad + "choice() needs two or more different values")
        return Distribution(kind, choices=tuple(args))
    try:
        low, high = (float(parse_value(a)) for a in args)
    except (ValueError, TypeError):
        raise UsageError(bad + f"{kind}() takes two numbers, LOW < HIGH") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise UsageError(bad + f"{kind}() takes two finite numbers, LOW < HIGH")
    if kind in ("log", "intlog") and low <= 0:
        raise UsageError(bad + f"{kind}() needs LOW > 0; use uniform() or int() for 0 and below")
    if kind in ("int", "intlog") and not (low.is_integer() and high.is_integer()):
        raise UsageError(bad + f"{kind}() takes two integers")
    return Distribution(kind, low, high)


def parse_search(items: Sequence[str]) -> dict[str, Distribution]:
    """``["lr=log(1e-4,1e-2)"]`` -> ``{"lr": Distribution("log", 1e-4, 1e-2)}``."""
    search: dict[str, Distribution] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise UsageError(f'--search {item!r}: expected NAME=DIST, e.g. "lr=log(1e-4,1e-2)"')
        if name in search:
            raise UsageError(f"--search {name}: given twice")
        search[name] = parse_distribution(name, text)
    return search


# -- the sweep's spec --------------------------------------------------------------------------


@dataclass
class Spec:
    """What a sweep is, as ``sweep.json`` keeps it: the runs it makes and how they are judged.

    ``config`` and ``run`` are the algorithm config and run options every run gets (``--set``,
    ``--config``, run flags); ``grid`` the texts of each grid axis; ``search`` each search
    axis's distribution text; ``trials`` how many configs a search tries.
    """

    plugin: str
    seeds: list[int]
    config: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[str]] = field(default_factory=dict)
    search: dict[str, str] = field(default_factory=dict)
    trials: int = 0
    objective: str = "return"
    sampler: str = "tpe"
    blocked: list[str] = field(default_factory=list)
    parallel: int | None = None  # --parallel as last given; None: the default

    @property
    def axes(self) -> list[str]:
        """The names a config differs in, grid first."""
        return [*self.grid, *self.search]

    @property
    def is_search(self) -> bool:
        return bool(self.search)

    @property
    def direction(self) -> str:
        return OBJECTIVES[self.objective][0]

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Spec:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def identity(self) -> dict[str, Any]:
        """What must match for a sweep directory to be continued (not ``trials``: a search
        may be given more)."""
        return {k: v for k, v in self.to_dict().items() if k not in ("trials", "parallel")}

    def distributions(self) -> dict[str, Any]:
        """The Optuna distribution of each axis: a grid axis is a choice of its texts."""
        from optuna.distributions import CategoricalDistribution

        out = {name: CategoricalDistribution(values) for name, values in self.grid.items()}
        out.update({n: parse_distribution(n, t).to_optuna() for n, t in self.search.items()})
        return out

    def grid_points(self) -> list[dict[str, str]]:
        """Every combination of the grid's values, in the order given (``[{}]`` without a
        grid: one config)."""
        names = list(self.grid)
        return [
            dict(zip(names, combo, strict=True)) for combo in itertools.product(*self.grid.values())
        ]


def make_spec(
    pm: PluginManager,
    plugin: str,
    *,
    config: Mapping[str, Any],
    run: Mapping[str, Any],
    seeds: str,
    grid: Sequence[str] = (),
    search: Sequence[str] = (),
    trials: int | None = None,
    objective: str = "return",
    sampler: str = "tpe",
    blocked: Sequence[str] = (),
) -> Spec:
    """A checked :class:`Spec`: every grid value and search bound is built into the plugin's
    config class (or checked as a run option) here, so a bad one is refused before anything
    starts, naming the field.

    :raises UsageError: unknown field, bad value, bad ``--seeds`` or distribution, a field
        both in the grid and the search, ``--seed`` among the run options.
    """
    _, algo = pm.algorithm(plugin)
    if "seed" in run:
        raise UsageError("sweep takes --seeds (a range 0-9, a list 0,3,7 or a count 5), not --seed")
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective {objective!r}: one of {', '.join(OBJECTIVES)}")
    axes_grid, axes_search = parse_grid(grid), parse_search(search)
    both = set(axes_grid) & set(axes_search)
    if both:
        raise UsageError(f"field {sorted(both)[0]!r} is in both --grid and --search; give it once")
    if axes_search and trials is not None and trials < 1:
        raise UsageError(f"--trials {trials}: give 1 or more")
    if trials is not None and not axes_search:
        raise UsageError("--trials is the number of configs a --search tries; give --search too")
    spec = Spec(
        plugin=algo.name, seeds=parse_seeds(seeds), config=dict(config), run=dict(run),
        grid=axes_grid, search=dict(zip(axes_search, search_texts(search), strict=True)),
        trials=(trials or 20) if axes_search else 0, objective=objective, sampler=sampler,
        blocked=list(blocked),
    )  # fmt: skip
    known = pm.run_options()
    for name in spec.axes:
        _check_axis(spec, name, algo.config_cls, known)
    for name, values in spec.grid.items():  # each value on its own: the error names it
        for value in values:
            trial_inputs(spec, {name: value}, algo.config_cls, known, f"--grid {name}={value}")
    for values in spec.grid_points() or [{}]:  # every combination builds, as a run would
        trial_inputs(spec, values, algo.config_cls, known)
    return spec


def search_texts(items: Sequence[str]) -> list[str]:
    """The distribution text of each ``--search NAME=DIST``, spaces removed."""
    return [item.partition("=")[2].strip().replace(" ", "") for item in items]


def _check_axis(spec: Spec, name: str, config_cls: type, known: Any) -> None:
    fields = fields_of(config_cls)
    flag = "--grid" if name in spec.grid else "--search"
    if name == "seed":
        raise UsageError(f"{flag} seed: give the seeds with --seeds (0-9, 0,3,7 or a count)")
    if name not in fields and name not in known.names:
        raise UsageError(
            f"{flag} {name}: unknown field {name!r}; {spec.plugin}'s config fields: "
            f"{', '.join(sorted(fields))}; run options: {', '.join(known.names)}"
        )
    if name not in spec.search:
        return
    dist = parse_distribution(name, spec.search[name])
    tp = fields[name].type if name in fields else known.field(name).type
    values = list(dist.choices) if dist.kind == "choice" else [dist.low, dist.high]
    if dist.kind in ("log", "uniform"):
        try:
            coerce(0.5, tp)
        except TypeError:
            raise UsageError(
                f"--search {name}={spec.search[name]}: field {name!r} takes whole numbers; "
                f"use int(LOW,HIGH) or intlog(LOW,HIGH)"
            ) from None
    for value in values:  # both ends (each choice) must be values the field takes
        params = {name: value if not isinstance(value, float) or dist.kind == "choice" else
                  (int(value) if dist.kind in ("int", "intlog") else value)}  # fmt: skip
        trial_inputs(spec, params, config_cls, known, f"--search {name}={spec.search[name]}")


def _value(known: Any, name: str, value: Any) -> Any:
    """A grid text or choice read as a run reads it; a sampled number stays as it is."""
    if not isinstance(value, str):
        return value
    if name in known.names and known.field(name).type is str:
        return value
    return parse_value(value)


def trial_inputs(
    spec: Spec, params: Mapping[str, Any], config_cls: type, known: Any, source: str = ""
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The algorithm config and run options of the config ``params``, checked as a run checks
    them (an error names the field and ``--grid`` / ``--search``)."""
    config, run = dict(spec.config), dict(spec.run)
    fields = fields_of(config_cls)
    for name, value in params.items():
        (config if name in fields else run)[name] = _value(known, name, value)
    where = ", ".join(f"{n}={v}" for n, v in params.items()) or "the base config"
    source = source or f"sweep config {where}"
    build(config_cls, config, source=source)
    known.check(run, source)
    return config, run


# -- configs, keys and run directories ---------------------------------------------------------


def param_text(value: Any) -> str:
    """A config value as the key and the table show it: a grid text as given, a number in
    its shortest exact form."""
    return value if isinstance(value, str) else repr(value)


def config_key(params: Mapping[str, Any]) -> str:
    """The short key of a config, its run directories' prefix: ``lr=0.001,hidden=64``
    (``base`` for a sweep with no axes); ``cfg-<hash>`` where that would be long or hold
    characters that do not belong in a file name."""
    if not params:
        return "base"
    text = ",".join(f"{name}={param_text(value)}" for name, value in params.items())
    if len(text) <= 64 and _SAFE.match(text):
        return text
    return "cfg-" + hashlib.sha1(text.encode()).hexdigest()[:10]


def toml_text(config: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """``config`` at the top level and ``run`` as a ``[run]`` table, as ``run --config``
    reads them (JSON's numbers, strings, booleans and lists are TOML's too)."""

    def lines(values: Mapping[str, Any]) -> list[str]:
        return [f"{k} = {json.dumps(v)}" for k, v in values.items() if v is not None]

    return "\n".join([*lines(config), "[run]", *lines(run)]) + "\n"


def _summary(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((path / "summary.json").read_text(encoding="utf-8"))
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
    for path in sorted(trials.iterdir()) if trials.is_dir() else []:
        key, sep, _ = path.name.rpartition("-seed")
        if sep and is_done(path):
            groups.setdefault(key, []).append(path)
    rows = [_row(spec, key, paths) for key, paths in groups.items()]
    sign = -1 if spec.direction == "maximize" else 1
    rows.sort(key=lambda r: (sign * r["objective"], r["config"]))
    return spec, rows


def _row(spec: Spec, key: str, paths: list[Path]) -> dict[str, Any]:
    runs = []
    params: dict[str, Any] = {}
    for path in paths:
        run = read_run(path)
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
        "run_dirs": [str(p) for p in paths],
    }


def format_results(spec: Spec, rows: Sequence[dict[str, Any]]) -> str:
    """The results table: one line per config."""
    if not rows:
        return "no finished runs yet"
    direction = "max" if spec.direction == "maximize" else "min"
    head = ["CONFIG", "RUNS", "SOLVED", "SOLVE TIME", "SOLVE STEPS", "BEST RETURN", "RETURN(100)",
            f"{spec.objective.upper()} ({direction})"]  # fmt: skip

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
            num(r["objective"], ".4g"),
        ])  # fmt: skip
    widths = [max(len(line[i]) for line in table) for i in range(len(head))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in table
    )


_CSV = ("config", "key", "runs", "failed", "solved", "solve_rate", "median_solve_s",
        "median_solve_steps", "best_return", "mean_return_100", "objective")  # fmt: skip


def write_results(sweep_dir: str | Path, plot: bool = True) -> str:
    """Write ``results.csv``, ``results.json`` and (with matplotlib) ``sweep.png`` into the
    sweep directory; return the table and where they went, as ``--report`` prints them."""
    root = Path(sweep_dir)
    spec, rows = sweep_results(root)
    data = {"objective": spec.objective, "direction": spec.direction, "sweep": spec.to_dict(),
            "rows": rows}  # fmt: skip
    (root / "results.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    with (root / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*_CSV, *spec.axes], extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, **{n: r["params"].get(n) for n in spec.axes}})
    lines = [
        format_results(spec, rows),
        f"objective: {spec.objective}: {OBJECTIVES[spec.objective][1]}",
    ]
    written = [root / "results.csv", root / "results.json"]
    if plot and rows:
        try:
            written.append(plot_sweep(root, rows))
        except UsageError as exc:  # matplotlib missing, no episodes: the table still counts
            lines.append(f"no plot: {exc}")
    lines.append("written: " + ", ".join(str(p) for p in written))
    return "\n".join(lines)


def plot_sweep(sweep_dir: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """``sweep.png``: the mean return(100) of every run vs env steps and vs wall time, one
    colour per config (its seeds as thin lines), the env's threshold dashed."""
    from mprl.tools.report import _matplotlib, _thresholds, rolling_mean

    Figure, FigureCanvasAgg = _matplotlib()
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
    for value, envs in _thresholds(runs):
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
    out = sweep_dir / "sweep.png"
    fig.savefig(out, dpi=100)
    return out


def read_spec(root: Path) -> Spec:
    """The :class:`Spec` of sweep directory ``root``."""
    try:
        return Spec.from_dict(json.loads((root / SPEC_FILE).read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise UsageError(f"{str(root)!r} is not a sweep directory (no {SPEC_FILE})") from None
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"cannot read {str(root / SPEC_FILE)!r}: {exc}") from None


# -- running a sweep ---------------------------------------------------------------------------


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise UsageError(f"mprl sweep needs Optuna, which is not installed: {INSTALL}") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def default_parallel(spec: Spec, pm: PluginManager) -> int:
    """How many runs go on at once by default: the cores (a Ray cluster's CPUs with
    ``--backend ray --ray-address``) over the processes one run has (workers, and its train
    process), at least 1."""
    _, algo = pm.algorithm(spec.plugin)
    cores = os.cpu_count() or 1
    workers = [int(parse_value(v)) for v in spec.grid.get("workers", [])] or [
        spec.run.get("workers") or cores
    ]
    per_run = max(workers) + (1 if algo.train is not None else 0)
    backend = spec.run.get("backend", "local")
    if backend == "serial":
        per_run = 1
    address = spec.run.get("ray_address") or os.environ.get("RAY_ADDRESS", "")
    if backend == "ray" and address:
        cores = cluster_cpus(address) or cores
    return max(1, int(cores // per_run))


def cluster_cpus(address: str) -> float | None:
    """The CPUs of the Ray cluster at ``address``, asked once in a subprocess (a Ray session in
    the sweep's own process would outlive its runs); ``None`` when it cannot be reached."""
    code = (
        f"import ray; ray.init(address={address!r}, logging_level='ERROR', "
        "log_to_driver=False); print(ray.cluster_resources().get('CPU', 0)); ray.shutdown()"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        return float(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
        return None


@dataclass
class _Config:
    """An Optuna trial in flight: one config, one run per seed."""

    trial: Any
    params: dict[str, Any]
    key: str
    left: set[int]
    results: dict[int, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)


@dataclass
class _Run:
    config: _Config
    seed: int
    path: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0


class Sweep:
    """One session of a sweep: asks Optuna for configs, runs each config's seeds as
    ``python -m mprl run`` subprocesses, ``parallel`` at a time, and tells Optuna each config's
    objective once all its seeds are done."""

    def __init__(self, root: Path, spec: Spec, parallel: int, pm: PluginManager) -> None:
        self.root, self.spec, self.parallel, self.pm = root, spec, parallel, pm
        _, algo = pm.algorithm(spec.plugin)
        self.config_cls, self.known = algo.config_cls, pm.run_options()
        self.pending: list[_Run] = []
        self.running: list[_Run] = []
        self.in_flight: list[_Config] = []
        self.signal: int | None = None
        self.forced = False
        self.error: str | None = None
        self.done = 0
        self.study: Any = None

    # the study, and what an earlier session left
    def open_study(self) -> str:
        """Load (or create) the Optuna study; a config an earlier session left unfinished is
        failed and asked again. Returns what the session resumes, for its first line."""
        optuna = _optuna()
        sampler = (
            optuna.samplers.RandomSampler()
            if self.spec.sampler == "random"
            else optuna.samplers.TPESampler(constant_liar=True)
        )
        self.study = optuna.create_study(
            storage=f"sqlite:///{self.root / 'optuna.db'}", study_name=STUDY,
            direction=self.spec.direction, sampler=sampler, load_if_exists=True,
        )  # fmt: skip
        trials = self.study.get_trials(deepcopy=False)
        if not trials:
            # a grid (seeds alone: its one point, {}) is asked in order, as enqueued
            for params in self.spec.grid_points() if not self.spec.is_search else []:
                self.study.enqueue_trial(params)
            return ""
        State = optuna.trial.TrialState
        stale = [t for t in trials if t.state == State.RUNNING]
        for t in stale:  # this session holds the sweep's lock: no one else is running it
            self.study.tell(t.number, state=State.FAIL)
        retried = {t.user_attrs.get("retry_of") for t in trials}
        failed = [t for t in self.study.get_trials(deepcopy=False, states=(State.FAIL,))]
        again = [t for t in failed if t.number not in retried]
        for t in again:
            self.study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
        done = len(self.study.get_trials(deepcopy=False, states=(State.COMPLETE,)))
        self.done = done * len(self.spec.seeds)
        return f"resuming: {done} configs done, {len(again)} to run again"

    def total_configs(self) -> int:
        if self.spec.is_search:
            return self.spec.trials
        return max(1, len(self.spec.grid_points()))

    def _next_config(self) -> _Config | None:
        optuna = _optuna()
        State = optuna.trial.TrialState
        waiting = self.study.get_trials(deepcopy=False, states=(State.WAITING,))
        if self.spec.is_search:
            complete = self.study.get_trials(deepcopy=False, states=(State.COMPLETE,))
            if len(complete) + len(self.in_flight) >= self.spec.trials:
                return None
        elif not waiting:
            return None
        trial = self.study.ask(self.spec.distributions())
        params = {name: trial.params[name] for name in self.spec.axes}
        config = _Config(trial, params, config_key(params), set(self.spec.seeds))
        config_toml, run_options = trial_inputs(self.spec, params, self.config_cls, self.known)
        (self.root / "configs").mkdir(exist_ok=True)
        (self.root / "configs" / f"{config.key}.toml").write_text(
            toml_text(config_toml, run_options)
        )
        trial.set_user_attr("key", config.key)
        self.in_flight.append(config)
        for seed in self.spec.seeds:
            path = self.root / "trials" / f"{config.key}-seed{seed}"
            if is_done(path):  # an earlier session ran it: its result stands
                self._result(config, seed, path)
                continue
            if any(r.path == path for r in (*self.pending, *self.running)):
                raise RuntimeError(f"config {config.key} seed {seed} asked twice")  # a bug
            if path.exists():  # interrupted: run again from scratch
                shutil.rmtree(path)
            self.pending.append(_Run(config, seed, path, self.root / "logs" / f"{path.name}.log"))
        if not config.left:
            self._tell(config)
        return config

    def _next_run(self) -> _Run | None:
        while not self.pending:
            if self._next_config() is None:
                return None
        return self.pending.pop(0)

    def _command(self, run: _Run) -> list[str]:
        blocked = [arg for name in self.spec.blocked for arg in ("-p", f"no:{name}")]
        return [
            sys.executable, "-m", "mprl", "run", *blocked, "--plugin", self.spec.plugin,
            "--config", str(self.root / "configs" / f"{run.config.key}.toml"),
            "--seed", str(run.seed), "--run-dir", str(run.path), "--quiet",
        ]  # fmt: skip

    def _start(self, run: _Run) -> None:
        run.path.parent.mkdir(parents=True, exist_ok=True)
        run.log.parent.mkdir(parents=True, exist_ok=True)
        with run.log.open("wb") as log:
            # its own session: a Ctrl-C at the terminal reaches the sweep alone, which passes
            # one SIGINT on to each run (two would force the run's fast exit)
            run.proc = subprocess.Popen(
                self._command(run), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        run.started = time.monotonic()
        self.running.append(run)
        if self.signal is not None:  # a signal came while it started
            run.proc.send_signal(signal.SIGINT)

    # results
    def _result(self, config: _Config, seed: int, path: Path, started: float | None = None) -> None:
        run = read_run(path)
        summary, options = run.summary or {}, run.config.get("run") or {}
        config.results[seed] = (summary, options)
        config.left.discard(seed)
        self.done += 1
        total = self.total_configs() * len(self.spec.seeds)
        when = "done earlier"
        if started is not None:
            elapsed = format_wall(time.monotonic() - started)
            when = f"run {format_wall(summary.get('wall_s'))}, {elapsed} with its start"
        outcome = _outcome(summary)
        say(f"mprl sweep: [{self.done}/{total}] {config.key} seed {seed}: {outcome} ({when})")

    def _tell(self, config: _Config) -> None:
        runs = [config.results[s] for s in self.spec.seeds]
        config.trial.set_user_attr("run_dirs", [f"{config.key}-seed{s}" for s in self.spec.seeds])
        self.study.tell(config.trial, objective_value(self.spec.objective, runs))
        self.in_flight.remove(config)

    def _ended(self, run: _Run, code: int) -> None:
        self.running.remove(run)
        if is_done(run.path):
            self._result(run.config, run.seed, run.path, run.started)
            if not run.config.left:
                self._tell(run.config)
            return
        if code == 2 and self.error is None:  # refused before it started: every run would be
            self.error = _last_line(run.log) or f"a run exited 2; see {run.log}"
            self.stop(signal.SIGINT)
        elif self.signal is None and self.error is None:  # someone stopped it, or it was killed
            say(f"mprl sweep: {run.path.name} ended with exit code {code} and no result "
                f"(see {run.log}); stopping the sweep")  # fmt: skip
            self.stop(signal.SIGINT)

    # stopping
    def stop(self, signum: int) -> None:
        """Stop starting runs and pass ``signum`` on to the running ones (they stop cleanly)."""
        if self.signal is None:
            self.signal = signum
        elif signum == signal.SIGINT:
            self.forced = True
        for run in self.running:
            with contextlib.suppress(ProcessLookupError):
                assert run.proc is not None
                run.proc.send_signal(signum)

    def _handle(self, signum: int, frame: Any) -> None:
        self.stop(signum)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        wanted = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
        old = {s: signal.signal(s, self._handle) for s in wanted}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)

    def execute(self) -> int:
        """Run until every config is done or a signal stops it; the exit code."""
        with self._signals():
            while True:
                while self.signal is None and len(self.running) < self.parallel:
                    run = self._next_run()
                    if run is None:
                        break
                    self._start(run)
                if not self.running:
                    break
                time.sleep(POLL_S)
                for run in list(self.running):
                    assert run.proc is not None
                    code = run.proc.poll()
                    if code is not None:
                        self._ended(run, code)
        optuna = _optuna()
        for config in list(self.in_flight):  # asked again when the sweep is resumed
            self.study.tell(config.trial, state=optuna.trial.TrialState.FAIL)
            self.in_flight.remove(config)
        if self.error is not None:
            raise UsageError(self.error)
        return 0 if self.signal is None else 128 + self.signal


def _outcome(summary: Mapping[str, Any]) -> str:
    if not summary:
        return "no summary.json"
    mean = summary.get("mean_return_100")
    tail = f"return(100) {mean:.1f}" if isinstance(mean, int | float) else "no episodes"
    if summary.get("status") == "failed":
        return f"FAILED ({summary.get('stop_reason')}), {tail}"
    at = summary.get("solved_at") or {}
    if summary.get("solved"):
        steps = at.get("env_steps", 0)
        return f"solved at {format_wall(at.get('wall_s'))}, {steps:,} env steps, {tail}"
    return f"not solved ({summary.get('stop_reason')}), {tail}"


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].removeprefix("mprl: error: ") if lines else ""


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Hold ``SWEEP_DIR/.lock`` while the sweep runs: a second session is refused."""
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UsageError(f"sweep directory {str(root)!r} is in use by pid {holder}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def _prepare_dir(root: Path, spec: Spec | None) -> Spec:
    """The spec the sweep in ``root`` runs: ``spec`` written to a new directory, the stored one
    for ``--resume`` (``spec`` None); a directory holding another sweep is refused."""
    if spec is None:
        return read_spec(root)
    if (root / SPEC_FILE).is_file():
        stored = read_spec(root)
        if stored.identity() != spec.identity():
            differs = [k for k, v in spec.identity().items() if stored.identity().get(k) != v]
            raise UsageError(
                f"--sweep-dir {str(root)!r} holds another sweep (its {', '.join(differs)} "
                f"differ); give another --sweep-dir, or --resume {root} to continue that one"
            )
        spec.trials = max(spec.trials, stored.trials)
    elif any(p.name != ".lock" for p in root.iterdir()):
        raise UsageError(
            f"--sweep-dir {str(root)!r} exists and is not a sweep directory; give another"
        )
    root.mkdir(parents=True, exist_ok=True)
    (root / SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
    return spec


def run_sweep(
    pm: PluginManager,
    spec: Spec | None,
    sweep_dir: str | Path | None,
    *,
    parallel: int | None = None,
    trials: int | None = None,
) -> int:
    """Run (or, with ``spec`` None, resume) the sweep in ``sweep_dir``; print a line per
    finished run, then the results table. Returns the exit code: 0 done, 128 + the signal's
    number when a signal stopped it (the sweep can be resumed).

    :raises UsageError: Optuna is missing, the directory holds another sweep or is in use, a
        run refused its config.
    """
    _optuna()
    if sweep_dir is None:
        assert spec is not None
        env = str(spec.run.get("env", "default")).replace("/", "_").replace(":", "_")
        sweep_dir = Path("sweeps") / f"{spec.plugin}-{env}-{time.strftime('%Y%m%d-%H%M%S')}"
    root = Path(sweep_dir)
    if spec is None and not (root / SPEC_FILE).is_file():
        raise UsageError(f"--resume {str(root)!r}: not a sweep directory (no {SPEC_FILE})")
    if spec is not None and not (root / SPEC_FILE).is_file():
        root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        spec = _prepare_dir(root, spec)
        if trials is not None:
            if not spec.is_search:
                raise UsageError("--trials is the number of configs a --search tries")
            spec.trials = trials
            (root / SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
        if parallel is not None and parallel < 1:
            raise UsageError(f"--parallel {parallel}: give 1 or more")
        if parallel is not None and parallel != spec.parallel:  # kept for --resume
            spec.parallel = parallel
            (root / SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
        k = spec.parallel or default_parallel(spec, pm)
        sweep = Sweep(root, spec, k, pm)
        resumed = sweep.open_study()
        n = sweep.total_configs()
        what = f"{n} config{'s' * (n != 1)}" + (" (search)" if spec.is_search else "")
        seeds = len(spec.seeds)
        runs = f"{k} run{'s' * (k != 1)} at a time"
        say(f"mprl sweep: {spec.plugin}: {what} x {seeds} seeds, {runs} -> {root}")
        if resumed:
            say(f"mprl sweep: {resumed}")
        code = sweep.execute()
        print(write_results(root), flush=True)
        if code:
            say(f"mprl sweep: stopped; continue with: python -m mprl sweep --resume {root}")
        return code
