"""What the experiment-tracker plugins (``mprl_builtin.wandb``, ``mprl_builtin.mlflow``) share:
the run's parameters, its records as metrics by source, its totals, the file that lets a resumed
run go on in the same tracker run, and the one warning line a tracker's failure prints.

Not a plugin of its own: no entry point names it. Everything here runs in the main process.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

AXES = ("step", "wall")  # the x axes of every record, not values of their own
#: the run's totals, from ``summary.json``: logged when the run ends
TOTALS = ("env_steps", "episodes", "wall_s", "mean_return_100", "best_return", "solved")


def parameters(run: Any) -> dict[str, Any]:
    """The run's config and metadata: ``config.json`` as the run wrote it (``plugin``,
    ``plugin_version``, ``plugin_distribution``, ``algorithm``, ``mprl_version``,
    ``reward_threshold``, ``session``, the run options under ``run`` and the algorithm's config
    under ``config``) and ``run_dir``; from ``run`` itself when the file cannot be read."""
    try:
        written = json.loads((Path(run.run_dir) / "config.json").read_text())
    except (OSError, ValueError):
        config = run.config
        written = {
            "plugin": run.plugin,
            "plugin_version": run.plugin_version,
            "algorithm": run.algorithm,
            "reward_threshold": run.reward_threshold,
            "run": run.run.to_dict(),
            "config": attrs.asdict(config) if attrs.has(type(config)) else dict(config or {}),
        }
    return {**written, "run_dir": str(Path(run.run_dir).resolve())}


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of dotted keys (``run.workers``, ``config.lr``)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def is_number(value: Any) -> bool:
    """A value a tracker plots: an int or a finite float (not a bool, a string or nan)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


def metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's numeric values as ``SOURCE/NAME`` (``worker:0/episode_return``,
    ``trainer/policy_loss``, ``main/mean_return_100``); events' strings and bools are left out."""
    source = record.get("source", "main")
    return {
        f"{source}/{name}": value
        for name, value in record.items()
        if name not in AXES and is_number(value)
    }


def totals(summary: Mapping[str, Any]) -> dict[str, float]:
    """The run's totals from its summary (``solved`` as 0 or 1), those it has."""
    out: dict[str, float] = {}
    for name in TOTALS:
        value = summary.get(name)
        if isinstance(value, bool):
            value = int(value)
        if is_number(value):
            out[name] = value
    return out


def artifact_name(run_dir: Path) -> str:
    """A name for the run's checkpoint that trackers take (letters, digits, ``-_.``)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(run_dir).resolve().name)
    return re.sub(r"-{2,}", "-", name).strip("-.") or "run"


def checkpoint_of(summary: Mapping[str, Any]) -> Path | None:
    """The run's final checkpoint file, if it ended with one that is there."""
    found = summary.get("checkpoint") or {}
    path = found.get("path") if isinstance(found, Mapping) else None
    return Path(path) if path and Path(path).is_file() else None


def load_id(run_dir: Path, name: str) -> dict[str, Any] | None:
    """What ``save_id`` kept in the run directory of a resumed run, if anything."""
    try:
        found = json.loads((Path(run_dir) / name).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def save_id(run_dir: Path, name: str, values: Mapping[str, Any]) -> None:
    """Keep the tracker run's id in the run directory, for ``--resume`` to go on with it."""
    (Path(run_dir) / name).write_text(json.dumps(dict(values), indent=2, sort_keys=True) + "\n")


#: run directory -> tracker -> how to take back its start (while the run is starting)
_undo: dict[Path, dict[str, Callable[[], None]]] = {}


def started(run_dir: Path, tracker: str, undo: Callable[[], None]) -> None:
    """``tracker`` started its run for ``run_dir``: ``undo`` takes it back if another tracker
    then fails to start (the run is refused, and nothing of it may stay)."""
    _undo.setdefault(run_dir, {})[tracker] = undo


def ended(run_dir: Path, tracker: str) -> None:
    """``tracker``'s run for ``run_dir`` ended: nothing to take back any more."""
    undos = _undo.get(run_dir, {})
    undos.pop(tracker, None)
    if not undos:
        _undo.pop(run_dir, None)


def abort(run_dir: Path) -> None:
    """A tracker could not start: take back what the others started for ``run_dir``."""
    for tracker, undo in _undo.pop(run_dir, {}).items():
        try:
            undo()
        except Exception as exc:
            say(tracker, f"warning: taking back its run failed ({one_line(exc)})")


def say(tracker: str, text: str) -> None:
    """One line on stderr, as mprl's own are."""
    print(f"mprl: {tracker}: {text}", file=sys.stderr, flush=True)


def one_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


class Failures:
    """A tracker's failures during a run: the first is one warning line, the rest are counted
    (a tracker never stops a run; what it could not log stays in ``metrics.jsonl``)."""

    def __init__(self, tracker: str) -> None:
        self.tracker, self.count = tracker, 0

    def __call__(self, what: str, exc: BaseException) -> None:
        self.count += 1
        if self.count == 1:
            say(
                self.tracker,
                f"warning: {what} failed ({one_line(exc)}); the run goes on, its records are in "
                "metrics.jsonl (further failures are counted, not shown)",
            )
