"""Run-wide types: what a run is (:class:`RunConfig`, :class:`RunInfo`) and how it ended
(:class:`Summary`, :class:`ChildFailure`). A leaf: the host, the backends and hooks all use them."""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
from attrs import validators as v

T = TypeVar("T")
MAX_SEED = 2**32 - 1  # what every generator a run seeds (numpy's too) takes
MAX_THREADS = 256  # torch threads per child; far more crashed torch here (100,000: SIGSEGV)
MAX_EVAL_EPISODES = 100_000  # episodes of one evaluation (--eval-episodes)


def _positive_or_none(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"'{attribute.name}' must be >= 1 or unset (no limit): {value}")


#: seconds in each unit a duration may be given in (``90s``, ``10m``, ``1.5h``, ``1h30m``)
_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = r"[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?"
_PART = re.compile(rf"({_NUMBER})\s*([a-z]+)\s*")


def duration(value: float | str | None) -> float | None:
    """Seconds of a duration: a number of seconds, or text such as ``600``, ``90s``, ``10m``,
    ``1.5h``, ``1h30m``, ``2d``; ``None`` (or ``"none"``) for no limit. Anything else raises
    ``ValueError`` saying what is accepted (``max_time`` converts with it)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "off")):
        return None
    seconds = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if re.fullmatch(_NUMBER, text):
            seconds = float(text)
        elif text and re.fullmatch(rf"(?:{_PART.pattern})+", text):
            parts = _PART.findall(text)
            if all(unit in _UNITS for _, unit in parts):
                seconds = sum(float(n) * _UNITS[unit] for n, unit in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        shown = int(value) if isinstance(value, float) and value.is_integer() else value
        raise ValueError(
            "a wall-clock time above 0: seconds or a number with a unit, e.g. 90s, 10m, 1.5h, "
            f"1h30m (none: no limit); got {shown!r}"
        )
    return seconds


@attrs.frozen
class RunConfig:
    """Options of a run that are not the algorithm's: what ``--env``, ``--workers`` ... set."""

    env: str = attrs.field(
        default="", metadata={"help": "gymnasium env id (default: the algorithm's default env)"}
    )
    workers: int = attrs.field(
        factory=lambda: os.cpu_count() or 1,
        validator=v.ge(1),
        metadata={"help": "number of worker processes (default: number of cores)"},
    )
    seed: int = attrs.field(
        default=0, validator=[v.ge(0), v.le(MAX_SEED)], metadata={"help": "run seed"}
    )
    total_steps: int | None = attrs.field(
        default=None,
        validator=_positive_or_none,
        metadata={"help": "stop after this many env steps (default: when solved)"},
    )
    target_return: float | None = attrs.field(
        default=None,
        metadata={
            "help": "solved when the mean return of the last 100 episodes reaches this "
            "(default: the env's reward threshold; envs without one, such as MPE's, run to "
            "--total-steps or --max-time)"
        },
    )
    start_interval: float = attrs.field(
        default=0.0, validator=v.ge(0), metadata={"help": "seconds to sleep between worker starts"}
    )
    torch_threads: int = attrs.field(
        default=0,
        validator=[v.ge(0), v.le(MAX_THREADS)],
        metadata={"help": "torch threads per child (0: cores / children)"},
    )
    backend: str = attrs.field(
        default="local",
        metadata={
            "help": "where processes run: local (spawned), serial (see --serial), ray (Ray "
            'actors; pip install "mprl[ray]"), or another backend a plugin registers'
        },
    )
    env_batch: str = attrs.field(
        default="gym",
        validator=v.in_(("gym", "envpool")),
        metadata={
            "help": "how a worker steps its envs: gym (one gymnasium env at a time, through "
            "the mprl_make_env hook) or envpool (one EnvPool, in C++; classic control, Atari)"
        },
    )
    device: str = attrs.field(
        default="auto",
        metadata={
            "help": "where the train process learns: auto (a GPU where there is one), cpu, "
            "cuda, cuda:N; workers act on the CPU"
        },
    )
    max_restarts: int = attrs.field(
        default=0,
        validator=v.ge(0),
        metadata={"help": "restarts allowed per worker rank before the run fails (default 0)"},
    )
    restart_delay: float = attrs.field(
        default=1.0,
        validator=v.ge(0),
        metadata={"help": "seconds before a restart; doubles with each failure in a row"},
    )
    max_consecutive_failures: int = attrs.field(
        default=3,
        validator=v.ge(1),
        metadata={"help": "give up on a worker that failed this often without taking a step"},
    )
    worker_timeout: float = attrs.field(
        default=60.0,
        validator=v.ge(0),
        metadata={"help": "seconds without a heartbeat (after start-up) until hung; 0: off"},
    )
    checkpoint_every: float = attrs.field(
        default=60.0,
        validator=v.ge(0),
        metadata={"help": "seconds between checkpoints (0: only at the end)"},
    )
    full_metrics: bool = attrs.field(
        default=False,
        metadata={
            "help": "write every episode to metrics.jsonl; by default a long fast run sums "
            "them up per second once it wrote 20,000 (50 a second on average)"
        },
    )
    max_time: float | str | None = attrs.field(
        default=None,
        converter=duration,
        metadata={
            "type": "duration",
            "help": "stop after this wall-clock time, with a final checkpoint: seconds or 90s, "
            "10m, 1.5h; counts the whole run, earlier sessions too (default: no limit)",
        },
    )
    eval_every: int = attrs.field(
        default=0,
        validator=v.ge(0),
        metadata={
            "help": "every this many env steps, play --eval-episodes episodes of the current "
            "policy, deterministic, in the main process; 'solved' is then judged on them "
            "(0: off)"
        },
    )
    eval_episodes: int = attrs.field(
        default=10,
        validator=[v.ge(1), v.le(MAX_EVAL_EPISODES)],
        metadata={"help": "episodes of each evaluation (--eval-every)"},
    )
    #: the values of the run options plugins register (``mprl_register_options``), by field
    #: name; read them with :meth:`of`
    extra: Mapping[str, Any] = attrs.field(factory=dict, init=True, repr=False)

    def of(self, cls: type[T]) -> T:
        """The options of ``cls`` (an attrs class a plugin registered with
        ``mprl_register_options``) this run was given, defaults for the rest."""
        names = attrs.fields_dict(cls)  # type: ignore[arg-type]
        return cls(**{k: v for k, v in self.extra.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """Every run option by name, the registered ones too, as ``config.json`` holds them."""
        out = attrs.asdict(self, recurse=True, filter=lambda a, _: a.name != "extra")
        return {**out, **self.extra}

    def __getattr__(self, name: str) -> Any:
        # 0.1.0 read the TensorBoard plugin's option as run.tensorboard: a registered option
        # read as an attribute still works for a release, with a warning
        extra = object.__getattribute__(self, "extra") if name != "extra" else {}
        if name in extra:
            warnings.warn(
                f"RunConfig.{name} is deprecated: {name!r} is a run option a plugin registers; "
                f"read it with run.of(ITS_OPTIONS_CLASS).{name}; removed in 0.3.0",
                DeprecationWarning,
                stacklevel=2,
            )
            return extra[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


@attrs.frozen
class RunInfo:
    """What a run is, as hooks see it."""

    plugin: str
    plugin_version: str
    algorithm: str
    config: Any
    run: RunConfig
    run_dir: Path
    reward_threshold: float | None


@attrs.frozen
class ChildFailure:
    """A process that ended badly: who it was and why."""

    role: str
    rank: int
    exitcode: int | None
    reason: str
    traceback: str = ""

    @property
    def who(self) -> str:
        return self.role if self.rank < 0 else f"{self.role} {self.rank}"


@attrs.frozen
class Summary:
    """How a run ended; also written as ``summary.json``."""

    status: str  # "finished", "failed" or "interrupted"
    stop_reason: str
    solved: bool
    env_steps: int
    episodes: int
    wall_s: float
    mean_return_100: float | None
    best_return: float | None
    run_dir: Path
    plugin: str
    algorithm: str
    env: str
    per_worker_steps: tuple[int, ...] = ()
    restarts: tuple[int, ...] = ()  # per worker rank, in this session
    session: int = 0  # how many times the run was resumed
    shutdown_s: float | None = None  # seconds from the stop signal to the last child gone
    failures: tuple[ChildFailure, ...] = ()
    signal: int | None = None
    #: when it was found solved: ``wall_s``, ``env_steps``, ``episodes``, ``mean_return_100``
    #: (empty for a run solved before this was kept)
    solved_at: Mapping[str, Any] | None = None
    #: the checkpoint the run can be resumed from: its ``path`` and the ``env_steps`` it holds
    #: (``None`` for one written before this was kept); ``None`` when it ended with none
    checkpoint: Mapping[str, Any] | None = None
    #: what "solved" was judged on: ``"training"`` (the mean return of the last 100 training
    #: episodes, confirmed by the policy check) or ``"eval"`` (evaluation episodes,
    #: ``--eval-every``)
    solved_on: str = "training"
    #: the last evaluation (``--eval-every``): ``step``, ``wall``, ``eval_return_mean``,
    #: ``eval_return_std``, ``eval_length_mean``, ``episodes``; ``None`` when none was played
    last_eval: Mapping[str, Any] | None = None
    #: checkpoint writes that failed in this session (a full disk, ``checkpoints/`` removed)
    checkpoint_failures: int = 0

    @property
    def exit_code(self) -> int:
        """0 finished, 1 failed, 128 + signal number when stopped by a signal."""
        if self.status == "failed":
            return 1
        if self.signal is not None:
            return 128 + self.signal
        return 0

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self, recurse=True)
        out["run_dir"] = str(self.run_dir)
        out["exit_code"] = self.exit_code
        return out
