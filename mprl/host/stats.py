"""What the main process knows about a run's progress, built from the children's records."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

WINDOW = 100  # episodes in "mean return of the last 100", the usual solved criterion
#: seconds the env steps/s shown are counted over: counters that move in bursts (a learner
#: that paces its workers, a rollout committed at once) would read 0 between two bursts over a
#: second alone
RATE_WINDOW_S = 5.0
#: how a non-finite float travels in a record (JSON has none): ``Context.log`` makes it a string
NON_FINITE = frozenset({"inf", "-inf", "nan"})


def _number(value: Any, finite: bool = True) -> bool:
    """Whether ``value`` is a real number (not a bool) that a float holds; finite if asked."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range
        return False
    return not finite or math.isfinite(number)


@attrs.frozen
class Snapshot:
    """One look at the run, for the progress display and the periodic metrics record."""

    wall_s: float
    env_steps: int
    steps_per_s: float
    episodes: int
    mean_return_100: float
    best_return: float
    per_worker_steps: tuple[int, ...]
    total_steps: int | None
    last_values: Mapping[str, Any]
    restarts: int = 0
    worker_rates: tuple[float, ...] = ()  # steps/s of each worker rank
    worker_idle_s: tuple[float, ...] = ()  # seconds since each rank's count last moved
    max_time: float | None = None  # the wall-clock budget (--max-time), seconds
    #: the last evaluation (--eval-every): its ``step``, ``eval_return_mean``, ... (``None``:
    #: none yet)
    last_eval: Mapping[str, Any] | None = None

    @property
    def eta_s(self) -> float | None:
        """Seconds until ``total_steps`` at the current rate, or until ``max_time``, whichever
        comes first; ``None`` without a budget."""
        left = []
        if self.total_steps and self.steps_per_s > 0:
            left.append((self.total_steps - self.env_steps) / self.steps_per_s)
        if self.max_time is not None:
            left.append(self.max_time - self.wall_s)
        return max(0.0, min(left)) if left else None


class RunStats:
    """Episode returns, counters and rates, updated from records in the main process."""

    def __init__(
        self, threshold: float | None, total_steps: int | None, max_time: float | None = None
    ) -> None:
        self.threshold = threshold
        self.total_steps = total_steps
        self.max_time = max_time
        self.start = time.monotonic()
        self._stopped_at: float | None = None  # stop_clock()
        self.env_steps = 0
        self.per_worker: tuple[int, ...] = ()
        self.episodes = 0
        self.returns: deque[float] = deque(maxlen=WINDOW)
        self.best_return = -math.inf
        self.last_values: dict[str, Any] = {}  # latest scalar per name, e.g. loss
        #: (time, env steps) once a second over the last RATE_WINDOW_S: the rate shown
        self._rate_marks: deque[tuple[float, int]] = deque([(self.start, 0)])
        self.steps_per_s = 0.0
        self.restarts = 0
        self.solved_at: dict[str, Any] | None = None  # the moment it was found solved
        self.workers = 0  # worker ranks: the first slots of the counters
        self.worker_rates: tuple[float, ...] = ()
        self._worker_mark: tuple[float, tuple[int, ...]] = (self.start, ())
        self._moved: list[float] = []  # when each rank's count last changed
        self.last_eval: dict[str, Any] | None = None  # the last evaluation's numbers

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps, so a resumed run's counters and "solved" carry on."""
        return {
            "episodes": self.episodes,
            "returns": list(self.returns),
            "best_return": self.best_return,
            "wall_s": self.wall_s,
            "solved": self.solved(),
            "solved_at": self.solved_at,
            "last_eval": self.last_eval,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.episodes = int(state["episodes"])
        self.returns.extend(float(r) for r in state["returns"])
        self.best_return = float(state["best_return"])
        self.solved_at = state.get("solved_at")
        self.last_eval = state.get("last_eval")
        if self.solved_at is None and state.get("solved", self.reached()):  # older checkpoints
            self.solved_at = {}
        if self.solved_at and self.threshold is not None:  # a resume may raise the target
            at = self.solved_at.get("eval_return_mean", self.solved_at.get("mean_return_100"))
            if at is not None and at < self.threshold:
                self.solved_at = None  # solved at a lower target: not at this one (yet)
        self.start = time.monotonic() - float(state["wall_s"])
        self._rate_marks = deque()  # set by the first set_steps

    @property
    def wall_s(self) -> float:
        """Seconds the run has run, over all its sessions (a resumed run starts from its
        checkpoint's): each session from when its monitor was made, before the processes
        start, to :meth:`stop_clock`, when they have all stopped. Time between sessions does
        not count. ``summary.json``'s ``wall_s``, the metrics' ``wall``, the progress display
        and ``--max-time`` all read it."""
        return (self._stopped_at or time.monotonic()) - self.start

    def stop_clock(self) -> None:
        """Stop :attr:`wall_s` where it is: every process has stopped, and the final checkpoint
        and the summary must hold the same time, which a resumed run continues from."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()

    @property
    def mean_return_100(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else math.nan

    @staticmethod
    def check(record: Mapping[str, Any]) -> tuple[str, str] | None:
        """What is wrong with a child's record, as (field, why), or ``None`` when it can be
        counted: the fields mprl fills in itself (``time``, ``step``, ``source``) and those of
        an episode (``episode_return``, ``episode_length``) must be what mprl makes them. A
        plugin's ``ctx.log(time="soon")`` or ``ctx.log(episode_return="x")`` is not."""
        if "time" in record and not _number(record["time"]):
            return "time", "'time' is mprl's own field (when the record was made, in seconds)"
        if not _number(record.get("step", 0)):
            return "step", "'step' is mprl's own field (the run's env steps, a number)"
        if not isinstance(record.get("source", ""), str):
            return "source", "'source' is mprl's own field (who logged it, a string)"
        if "episode_return" in record:
            ret = record["episode_return"]
            if not (_number(ret, finite=False) or (isinstance(ret, str) and ret in NON_FINITE)):
                return "episode_return", "an episode's return must be a number"
            if not _number(record.get("episode_length", 0)):
                return "episode_length", "an episode's length must be a number"
        return None

    def add(self, record: Mapping[str, Any]) -> None:
        """Count ``record`` (one :meth:`check` passed)."""
        if "episode_return" in record:
            ret = float(record["episode_return"])
            self.episodes += 1
            self.returns.append(ret)
            self.best_return = max(self.best_return, ret)
        for key, value in record.items():
            if key not in ("source", "step", "time", "wall") and _number(value, finite=False):
                self.last_values[key] = value

    def set_steps(self, per_worker: Sequence[int]) -> None:
        self.per_worker = tuple(per_worker)
        self.env_steps = sum(per_worker)
        now = time.monotonic()
        marks = self._rate_marks
        if not marks:  # the first counters of a resumed run: rates start from here
            marks.append((now, self.env_steps))
        elif now - marks[-1][0] >= 1.0:  # a mark a second; the rate over the window's marks
            marks.append((now, self.env_steps))
            while len(marks) > 2 and now - marks[0][0] > RATE_WINDOW_S:
                marks.popleft()
            t0, s0 = marks[0]
            self.steps_per_s = (self.env_steps - s0) / (now - t0)
        counts = self.per_worker[: self.workers]
        t0, before = self._worker_mark
        if len(before) != len(counts):  # the first counters: rates start from here
            self._worker_mark, self._moved = (now, counts), [now] * len(counts)
        elif now - t0 >= 1.0:
            pairs = list(zip(counts, before, self._moved, strict=True))
            self.worker_rates = tuple((c - b) / (now - t0) for c, b, _ in pairs)
            self._moved = [now if c != b else m for c, b, m in pairs]
            self._worker_mark = (now, counts)

    def reached(self) -> bool:
        """The mean return of the last 100 episodes is at the env's reward threshold now."""
        return (
            self.threshold is not None
            and len(self.returns) == WINDOW
            and self.mean_return_100 >= self.threshold
        )

    def solved(self) -> bool:
        """The run was found solved (:meth:`mark_solved`); episodes that arrive while it stops
        do not undo it."""
        return self.solved_at is not None

    def mark_solved(self, evaluation: Mapping[str, Any] | None = None) -> None:
        """Latch "solved", and keep when: ``solved_at`` holds the wall seconds, env steps,
        episodes and mean return of the last 100 episodes of this moment (the summary's own
        numbers also count what finished while the run stopped). Solved by ``evaluation`` (the
        record of an evaluation that reached the threshold), it is the moment of the weights
        that evaluation played, and ``eval_return_mean`` says what they played."""
        mean = self.mean_return_100
        self.solved_at = {
            "wall_s": round(self.wall_s, 3),
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "mean_return_100": round(mean, 2) if math.isfinite(mean) else None,
        }
        if evaluation is not None:
            self.solved_at.update(
                wall_s=evaluation["wall"],
                env_steps=evaluation["step"],
                eval_return_mean=round(evaluation["eval_return_mean"], 2),
            )

    def add_eval(self, record: Mapping[str, Any]) -> None:
        """Keep an evaluation's numbers (its record, :class:`mprl.host.policy_check.Evaluation`)
        as the last one."""
        keys = ("step", "wall", "eval_return_mean", "eval_return_std", "eval_length_mean")
        self.last_eval = {k: record[k] for k in keys} | {"episodes": record["eval_episodes"]}

    def snapshot(self) -> Snapshot:
        return Snapshot(
            wall_s=self.wall_s,
            env_steps=self.env_steps,
            steps_per_s=self.steps_per_s,
            episodes=self.episodes,
            mean_return_100=self.mean_return_100,
            best_return=self.best_return,
            per_worker_steps=self.per_worker,
            total_steps=self.total_steps,
            last_values=dict(self.last_values),
            restarts=self.restarts,
            worker_rates=self.worker_rates,
            worker_idle_s=tuple(time.monotonic() - m for m in self._moved),
            max_time=self.max_time,
            last_eval=self.last_eval,
        )
