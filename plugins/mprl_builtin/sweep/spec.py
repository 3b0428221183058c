"""What a sweep is: ``--seeds``, ``--grid`` and ``--search`` read and checked against the
plugin's config and the run options (:func:`make_spec`), the :class:`Spec` that
``SWEEP_DIR/sweep.json`` keeps, and each config's key and ``run --config`` file."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mprl.errors import UsageError
from mprl.files import NotRegularFile
from mprl.host.config import build, coerce, fields_of, parse_value
from mprl.host.plugins import PluginManager
from mprl_builtin.sweep.sweepdir import read_text, refusal

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


def read_spec(root: Path) -> Spec:
    """The :class:`Spec` of sweep directory ``root`` (a link at ``sweep.json`` is refused)."""
    try:
        return Spec.from_dict(json.loads(read_text(root / SPEC_FILE)))
    except FileNotFoundError:
        raise UsageError(f"{str(root)!r} is not a sweep directory (no {SPEC_FILE})") from None
    except NotRegularFile as exc:
        raise refusal(root, exc) from None
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"cannot read {str(root / SPEC_FILE)!r}: {exc}") from None
