"""Time-to-solve benchmark: Stable-Baselines3 PPO vs. mprl plugins, in one run.

What is measured
----------------
CartPole-v1 (discrete actions): for every (system, seed) pair, how long it takes to
*solve* it, i.e. until the mean return of the last 100 training episodes reaches 475
(the gymnasium ``reward_threshold``): wall seconds and env steps.

Pendulum-v1 (continuous actions, no solve threshold): the mean return of the last 100
training episodes reached within a fixed wall-clock budget (``--budget-s``, default 60).

Each run happens in a fresh Python interpreter (a subprocess), and runs are
interleaved by seed (seed 0: every system, seed 1: every system, ...) so that
background load affects all systems alike.

Systems
-------
``sb3_ppo``
    Stable-Baselines3 PPO with the rl-zoo tuned hyperparameters (``hyperparams/ppo.yml``).
    CartPole-v1: 8 envs (``DummyVecEnv`` + ``Monitor``), ``n_steps=32``,
    ``batch_size=256``, ``gae_lambda=0.8``, ``gamma=0.98``, ``n_epochs=20``,
    ``ent_coef=0.0``, ``learning_rate=lin_1e-3``, ``clip_range=lin_0.2``; as in rl-zoo,
    ``learn(total_timesteps=100_000)`` (the schedules reach 0 there), so a run not
    solved by 1e5 steps counts as unsolved. Pendulum-v1: 4 envs, ``n_steps=1024``,
    ``gae_lambda=0.95``, ``gamma=0.9``, ``n_epochs=10``, ``ent_coef=0.0``,
    ``learning_rate=1e-3``, ``clip_range=0.2``, ``use_sde=True``, ``sde_sample_freq=4``
    (constant schedules, so training simply runs until the budget). Episodes are read
    from the ``Monitor`` records by a callback, which also stops training (solved, cap
    or budget). ``wall_s`` is measured from the start of ``learn()``; model + env
    construction is reported separately as ``construct_s``. Torch threading is left at
    its default (recorded as ``torch_num_threads``).

``mprl:<plugin>``
    ``python -m mprl run --plugin <plugin> --env ENV --seed S --run-dir DIR --quiet``
    with the plugin's defaults; for Pendulum-v1, ppo gets
    ``benchmarks/configs/ppo-pendulum.toml`` (mprl's counterpart of the zoo values).
    Its clock (``wall`` in ``metrics.jsonl``, ``wall_s`` in ``summary.json``) starts
    before the worker processes are spawned, so it includes their start-up, which
    SB3's ``learn()`` clock does not. Pendulum runs are stopped with SIGINT once the
    run's clock passes the budget; only episodes finished within it count.

For all systems ``wall_total_s`` is the wall time of the whole subprocess, including
interpreter start-up and imports. Every CartPole run is capped (``--cap-s``, default
120 s); a capped run counts as unsolved.

Output: a table per environment on stdout, JSON (``--out``) with every run's numbers
and learning curve (mean of the last 100 returns vs. wall seconds), and a PNG of those
curves next to it.

Usage
-----
::

    python benchmarks/time_to_solve.py                       # 5 seeds, everything
    python benchmarks/time_to_solve.py --seeds 3 --budget-s 0   # CartPole only
    python benchmarks/time_to_solve.py --no-sb3 --plugins ppo   # mprl only

Requires ``stable-baselines3`` for the SB3 baseline and ``matplotlib`` for the plot
(``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "time_to_solve.json"
SB3_SYSTEM = "sb3_ppo"
SOLVE_ENV = "CartPole-v1"
BUDGET_ENV = "Pendulum-v1"
SOLVE_THRESHOLD = 475.0
WINDOW = 100  # episodes in the "mean of the last N" that decides and is reported
#: Seconds a run stopped at its cap (SIGINT) gets to exit cleanly before SIGKILL.
STOP_GRACE_S = 20.0
#: Extra seconds the SB3 subprocess gets beyond the cap for imports/construction.
SB3_STARTUP_SLACK_S = 60.0
CURVE_POINTS = 300  # learning-curve points kept per run in the JSON
#: env steps at which budget runs report the mean of the last WINDOW returns (sample efficiency)
STEP_MARKS = (50_000, 100_000, 200_000)

#: rl-zoo hyperparams/ppo.yml, tuned entries. "lr" / "clip": (value, linearly annealed?)
SB3_ZOO: dict[str, dict[str, Any]] = {
    SOLVE_ENV: {
        "n_envs": 8,
        "n_timesteps": 100_000,
        "lr": (1e-3, True),
        "clip": (0.2, True),
        "kwargs": {
            "n_steps": 32,
            "batch_size": 256,
            "gae_lambda": 0.8,
            "gamma": 0.98,
            "n_epochs": 20,
            "ent_coef": 0.0,
        },
    },
    BUDGET_ENV: {
        "n_envs": 4,
        "n_timesteps": None,  # constant schedules: train until the budget is spent
        "lr": (1e-3, False),
        "clip": (0.2, False),
        "kwargs": {
            "n_steps": 1024,
            "gae_lambda": 0.95,
            "gamma": 0.9,
            "n_epochs": 10,
            "ent_coef": 0.0,
            "use_sde": True,
            "sde_sample_freq": 4,
        },
    },
}
#: mprl configs per (env, plugin); plugins not listed run with their defaults
MPRL_CONFIGS = {(BUDGET_ENV, "ppo"): REPO_ROOT / "benchmarks" / "configs" / "ppo-pendulum.toml"}


@dataclass
class RunRecord:
    """Result of one (env, system, seed) run.

    Attributes:
        env: The gymnasium env id.
        system: ``"sb3_ppo"`` or ``"mprl:<plugin>"``.
        seed: Seed passed to the system.
        solved: Whether the solve criterion was met within the cap (CartPole).
        capped: Whether the run was stopped by the wall-clock cap.
        wall_s: Training wall seconds as reported by the system itself (SB3: from
            the start of ``learn()``; mprl: its run clock, worker start-up included).
        wall_total_s: Wall seconds of the whole subprocess, start-up included.
        env_steps: Environment steps when the run ended (at solve if solved).
        episodes: Completed training episodes when the run ended.
        mean_return_100: Mean return of the last 100 training episodes at the end
            (for Pendulum: of those finished within the budget).
        construct_s: SB3 only: env + model construction seconds.
        torch_num_threads: SB3 only: ``torch.get_num_threads()`` during training.
        returncode: Exit code of the subprocess (``None`` if killed at the cap).
        error: Short description of a failure, if any.
        curve: ``[wall_s, mean of the last 100 returns]`` after each episode (thinned).
        extra: Anything else (e.g. the raw mprl summary, the run directory).
    """

    env: str
    system: str
    seed: int
    solved: bool = False
    capped: bool = False
    wall_s: float | None = None
    wall_total_s: float | None = None
    env_steps: int | None = None
    episodes: int | None = None
    mean_return_100: float | None = None
    construct_s: float | None = None
    torch_num_threads: int | None = None
    returncode: int | None = None
    error: str | None = None
    curve: list[list[float]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def at_step_marks(episodes: list[tuple[int, float]]) -> dict[str, float | None]:
    """Mean of the last WINDOW returns of the ``(env step, return)`` episodes that ended by
    each of :data:`STEP_MARKS` (``None`` where the run did not get that far): returns against
    env steps, which the machine's speed does not change."""
    marks: dict[str, float | None] = {}
    for mark in STEP_MARKS:
        done = [ret for step, ret in episodes if step <= mark]
        reached = any(step > mark for step, _ in episodes)
        marks[str(mark)] = statistics.fmean(done[-WINDOW:]) if done and reached else None
    return marks


def learning_curve(episodes: list[tuple[float, float]]) -> list[list[float]]:
    """``[wall, mean of the last WINDOW returns]`` after each ``(wall, return)`` episode,
    thinned to at most ``CURVE_POINTS`` points (the last one always kept)."""
    from mprl.tools.report import rolling_mean

    means = rolling_mean([ret for _, ret in episodes], WINDOW)
    points = [[round(w, 3), round(m, 2)] for (w, _), m in zip(episodes, means, strict=True)]
    step = max(1, len(points) // CURVE_POINTS)
    thinned = points[::step]
    if points and thinned[-1] is not points[-1]:
        thinned.append(points[-1])
    return thinned


# --------------------------------------------------------------------------- SB3


def _schedule(initial: float, annealed: bool) -> float | Callable[[float], float]:
    """rl-zoo's ``lin_<x>`` (``initial * progress_remaining``) or a constant."""
    if not annealed:
        return initial
    return lambda progress_remaining: progress_remaining * initial


def sb3_one_run(env_id: str, seed: int, cap_s: float, budget_s: float | None) -> dict[str, Any]:
    """Train SB3 PPO once (in this process) and return a record's fields.

    Args:
        env_id: ``CartPole-v1`` (stop when solved) or ``Pendulum-v1`` (stop at the budget).
        seed: Seed for the vec env and the model.
        cap_s: Stop (unsolved) once ``learn()`` has run this many wall seconds.
        budget_s: For budget runs: stop once ``learn()`` has run this many seconds.
    """
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    zoo = SB3_ZOO[env_id]
    limit_s = budget_s if budget_s is not None else cap_s

    class Watch(BaseCallback):
        """Collects episodes from the Monitor records; stops when solved or out of time."""

        def __init__(self) -> None:
            super().__init__(verbose=0)
            self.episodes: list[tuple[float, float]] = []
            self.by_step: list[tuple[int, float]] = []
            self.window: deque[float] = deque(maxlen=WINDOW)
            self.t0 = 0.0
            self.solved = self.out_of_time = False
            self.wall_s = 0.0
            self.steps_at_end = 0

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            self.wall_s = time.perf_counter() - self.t0
            if self.wall_s >= limit_s:
                self.out_of_time = True
                return False
            # Monitor adds info["episode"] = {"r", "l", "t"} when an episode ends;
            # iterating envs in index order gives completion order within a step.
            for info in self.locals["infos"]:
                episode = info.get("episode")
                if episode is not None:
                    self.episodes.append((self.wall_s, float(episode["r"])))
                    self.by_step.append((self.num_timesteps, float(episode["r"])))
                    self.window.append(float(episode["r"]))
            self.steps_at_end = self.num_timesteps
            if (
                budget_s is None
                and len(self.window) == WINDOW
                and statistics.fmean(self.window) >= SOLVE_THRESHOLD
            ):
                self.solved = True
                return False
            return True

    t_construct = time.perf_counter()
    env = make_vec_env(env_id, n_envs=zoo["n_envs"], seed=seed, vec_env_cls=DummyVecEnv)
    model = PPO(
        "MlpPolicy",
        env,
        learning_rate=_schedule(*zoo["lr"]),
        clip_range=_schedule(*zoo["clip"]),
        seed=seed,
        device="cpu",
        verbose=0,
        **zoo["kwargs"],
    )
    construct_s = time.perf_counter() - t_construct

    watch = Watch()
    t_learn = time.perf_counter()
    model.learn(total_timesteps=zoo["n_timesteps"] or 10**9, callback=watch)
    learn_s = time.perf_counter() - t_learn
    env.close()

    window = list(watch.window)
    return {
        "env": env_id,
        "system": SB3_SYSTEM,
        "seed": seed,
        "solved": watch.solved,
        "capped": watch.out_of_time and budget_s is None,
        # at solve / cap / budget: time to the deciding step; otherwise the whole learn()
        "wall_s": watch.wall_s if (watch.solved or watch.out_of_time) else learn_s,
        "env_steps": watch.steps_at_end,
        "episodes": len(watch.episodes),
        "mean_return_100": statistics.fmean(window) if window else None,
        "construct_s": construct_s,
        "torch_num_threads": torch.get_num_threads(),
        "curve": learning_curve(watch.episodes),
        "extra": {
            "learn_s": learn_s,
            "model_num_timesteps": model.num_timesteps,
            "at_steps": at_step_marks(watch.by_step),
        },
    }


# ----------------------------------------------------------------- subprocesses


def _tail(text: str, n: int = 800) -> str:
    """Return the last ``n`` characters of ``text`` (for error messages)."""
    return text[-n:].strip()


def _child_env() -> dict[str, str]:
    """Environment for child processes: repo root and plugins/ importable, unbuffered."""
    env = dict(os.environ)
    paths = (str(REPO_ROOT), str(REPO_ROOT / "plugins"), env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(
    cmd: list[str], timeout_s: float, until: Callable[[], bool] | None = None
) -> tuple[int | None, str, str, float]:
    """Run ``cmd`` in its own process group. SIGINT it once ``until()`` is true (looked at
    twice a second) or at the timeout; SIGKILL the whole group if it is still there
    :data:`STOP_GRACE_S` after the timeout (a SIGKILL at once would also kill multiprocessing's
    resource tracker and leave the run's semaphores in /dev/shm).

    Returns:
        ``(returncode, or None if stopped at the timeout, stdout, stderr, wall seconds)``.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=_child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = t0 + timeout_s
    interrupted = capped = False
    while True:
        try:
            out, err = proc.communicate(timeout=0.5)
            return None if capped else proc.returncode, out, err, time.perf_counter() - t0
        except subprocess.TimeoutExpired:
            pass
        if time.perf_counter() >= deadline and not capped:
            proc.send_signal(signal.SIGINT)
            interrupted = capped = True
            deadline += STOP_GRACE_S
        elif time.perf_counter() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return None, out, err, time.perf_counter() - t0
        if until is not None and not interrupted and until():
            proc.send_signal(signal.SIGINT)
            interrupted = True


def run_sb3(env_id: str, seed: int, cap_s: float, budget_s: float | None) -> RunRecord:
    """Run :func:`sb3_one_run` in a fresh interpreter and parse its JSON line."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_sb3-one", env_id, str(seed)]
    cmd += ["--cap-s", str(cap_s), "--budget-s", str(budget_s or 0)]
    limit = (budget_s or cap_s) + SB3_STARTUP_SLACK_S
    rc, out, err, wall_total = _run(cmd, limit)
    record = RunRecord(env=env_id, system=SB3_SYSTEM, seed=seed, returncode=rc)
    record.wall_total_s = wall_total
    if rc is None:
        record.capped = True
        record.error = "killed at subprocess timeout"
        return record
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if rc != 0 or not lines:
        record.error = f"exit {rc}: {_tail(err) or _tail(out)}"
        return record
    for key, value in json.loads(lines[-1]).items():
        setattr(record, key, value)
    return record


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            records.append(json.loads(line))
    return records


def run_mprl(
    runs_dir: Path, env_id: str, plugin: str, seed: int, cap_s: float, budget_s: float | None
) -> RunRecord:
    """One ``python -m mprl run``: until solved (or the cap), or for ``budget_s`` seconds of
    the run's clock (then SIGINT). Numbers come from the run dir."""
    run_dir = runs_dir / f"{env_id}_{plugin}_seed{seed}"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "mprl", "run", "--plugin", plugin, "--env", env_id]
    cmd += ["--seed", str(seed), "--run-dir", str(run_dir), "--quiet"]
    if (env_id, plugin) in MPRL_CONFIGS:
        cmd += ["--config", str(MPRL_CONFIGS[env_id, plugin])]
    until = None
    if budget_s is not None:
        cmd += ["--total-steps", str(10**12)]

        def until() -> bool:
            return any(r.get("wall", 0) > budget_s for r in _metrics(run_dir)[-50:])

    rc, out, err, wall_total = _run(cmd, budget_s + 60 if budget_s else cap_s, until)
    record = RunRecord(env=env_id, system=f"mprl:{plugin}", seed=seed, returncode=rc)
    record.wall_total_s = wall_total
    record.extra = {"run_dir": str(run_dir), "cmd": cmd}
    summary: dict[str, Any] | None = None
    with contextlib.suppress(OSError, json.JSONDecodeError):
        summary = json.loads((run_dir / "summary.json").read_text())
    metrics = _metrics(run_dir)
    episodes = [
        (float(r["wall"]), float(r["episode_return"]), int(r["step"]))
        for r in metrics
        if "episode_return" in r and (budget_s is None or r["wall"] <= budget_s)
    ]
    record.curve = learning_curve([(w, ret) for w, ret, _ in episodes])
    if summary is not None:
        record.extra["summary"] = summary
        record.solved = bool(summary.get("solved", False))
        record.wall_s = summary.get("wall_s")
        record.env_steps = summary.get("env_steps")
        record.episodes = summary.get("episodes")
        record.mean_return_100 = summary.get("mean_return_100")
    if budget_s is not None:  # only what happened within the budget counts
        window = [ret for _, ret, _ in episodes[-WINDOW:]]
        record.solved = False
        record.wall_s = budget_s
        record.episodes = len(episodes)
        record.env_steps = max(
            (r["step"] for r in metrics if r.get("wall", 1e18) <= budget_s), default=0
        )
        record.mean_return_100 = statistics.fmean(window) if window else None
        record.extra["at_steps"] = at_step_marks([(step, ret) for _, ret, step in episodes])
        ok = rc in (0, 130)  # stopped by our SIGINT (130) or finished first
    else:
        ok = rc == 0
    if rc is None:
        record.capped = True
        record.solved = False
        record.error = "stopped at cap"
    elif not ok:
        record.solved = False
        record.error = f"exit {rc}: {_tail(err) or _tail(out)}"
    elif summary is None:
        record.error = f"no summary.json in {run_dir}"
    return record


# --------------------------------------------------------------------- reporting


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize_solve(records: list[RunRecord], systems: list[str]) -> dict[str, Any]:
    """Per-system aggregates over solved runs, plus ratios to SB3's median."""
    table: dict[str, Any] = {}
    for system in systems:
        runs = [r for r in records if r.system == system and r.env == SOLVE_ENV]
        solved = [r for r in runs if r.solved]
        walls = [float(r.wall_s) for r in solved if r.wall_s is not None]
        totals = [float(r.wall_total_s) for r in solved if r.wall_total_s is not None]
        steps = [float(r.env_steps) for r in solved if r.env_steps is not None]
        table[system] = {
            "runs": len(runs),
            "solved": len(solved),
            "solve_rate": len(solved) / len(runs) if runs else None,
            "median_wall_s": _median(walls),
            "min_wall_s": min(walls) if walls else None,
            "max_wall_s": max(walls) if walls else None,
            "median_wall_total_s": _median(totals),
            "median_env_steps": _median(steps),
            "min_env_steps": min(steps) if steps else None,
            "max_env_steps": max(steps) if steps else None,
        }
    base = table.get(SB3_SYSTEM, {})
    for row in table.values():
        for key, base_key in (
            ("ratio_wall_vs_sb3", "median_wall_s"),
            ("ratio_wall_total_vs_sb3", "median_wall_total_s"),
            ("ratio_steps_vs_sb3", "median_env_steps"),
        ):
            num, den = row[base_key], base.get(base_key)
            row[key] = num / den if (num is not None and den) else None
    return table


def summarize_budget(records: list[RunRecord], systems: list[str]) -> dict[str, Any]:
    """Per-system mean return of the last 100 episodes reached within the budget."""
    table: dict[str, Any] = {}
    for system in systems:
        runs = [r for r in records if r.system == system and r.env == BUDGET_ENV]
        if not runs:
            continue
        means = [r.mean_return_100 for r in runs if r.mean_return_100 is not None]
        steps = [float(r.env_steps) for r in runs if r.env_steps is not None]
        table[system] = {
            "runs": len(runs),
            "median_mean_return_100": _median(means),
            "min_mean_return_100": min(means) if means else None,
            "max_mean_return_100": max(means) if means else None,
            "median_env_steps": _median(steps),
        }
        for mark in STEP_MARKS:
            at = [r.extra.get("at_steps", {}).get(str(mark)) for r in runs]
            table[system][f"median_at_{mark}"] = _median([v for v in at if v is not None])
    return table


def _fmt(value: Any, spec: str) -> str:
    """Format ``value`` with ``spec``; ``None`` becomes a right-aligned ``-``."""
    if value is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width) if width.isdigit() else 0)
    return format(value, spec)


def print_tables(solve: dict[str, Any], budget: dict[str, Any], budget_s: float) -> None:
    """Print the per-system tables."""
    header = (
        f"{'system':<14} {'solved':>7} {'med s':>7} {'min s':>7} {'max s':>7} "
        f"{'med tot s':>9} {'med steps':>9} {'x sb3':>6} {'x sb3 tot':>9} {'x steps':>7}"
    )
    print(f"{SOLVE_ENV}: time to solve (mean of last {WINDOW} training returns >= 475)")
    print(header)
    print("-" * len(header))
    for system, row in solve.items():
        print(
            f"{system:<14} {row['solved']:>3}/{row['runs']:<3} "
            f"{_fmt(row['median_wall_s'], '7.2f')} {_fmt(row['min_wall_s'], '7.2f')} "
            f"{_fmt(row['max_wall_s'], '7.2f')} {_fmt(row['median_wall_total_s'], '9.2f')} "
            f"{_fmt(row['median_env_steps'], '9.0f')} {_fmt(row['ratio_wall_vs_sb3'], '6.2f')} "
            f"{_fmt(row['ratio_wall_total_vs_sb3'], '9.2f')} "
            f"{_fmt(row['ratio_steps_vs_sb3'], '7.2f')}"
        )
    print(
        "(over solved runs; 's' = the system's own training clock, 'tot' = whole subprocess "
        "incl. start-up; 'x sb3' = median / SB3 PPO's median)"
    )
    if not budget:
        return
    print(f"\n{BUDGET_ENV}: mean of the last {WINDOW} training returns within {budget_s:g} s")
    header = f"{'system':<14} {'runs':>4} {'median':>9} {'min':>9} {'max':>9} {'med steps':>9}"
    header += "".join(f" {f'at {m // 1000}k':>9}" for m in STEP_MARKS)
    print(header)
    print("-" * len(header))
    for system, row in budget.items():
        print(
            f"{system:<14} {row['runs']:>4} {_fmt(row['median_mean_return_100'], '9.1f')} "
            f"{_fmt(row['min_mean_return_100'], '9.1f')} "
            f"{_fmt(row['max_mean_return_100'], '9.1f')} "
            f"{_fmt(row['median_env_steps'], '9.0f')}"
            + "".join(f" {_fmt(row[f'median_at_{m}'], '9.1f')}" for m in STEP_MARKS)
        )
    print(
        f"(median of runs; 'at Nk' = mean of the last {WINDOW} returns by N env steps, "
        "'-' where no run got that far)"
    )


def plot(records: list[RunRecord], systems: list[str], path: Path, budget_s: float) -> None:
    """Learning curves (mean of the last 100 returns vs. wall seconds), a panel per env."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping the plot")
        return
    envs = [e for e in (SOLVE_ENV, BUDGET_ENV) if any(r.env == e for r in records)]
    fig, axes = plt.subplots(1, len(envs), figsize=(6.5 * len(envs), 4.5), squeeze=False)
    colors = {s: f"C{i}" for i, s in enumerate(systems)}
    for ax, env_id in zip(axes[0], envs, strict=True):
        for system in systems:
            runs = [r for r in records if r.env == env_id and r.system == system and r.curve]
            for i, run in enumerate(runs):
                xs, ys = zip(*run.curve, strict=True)
                label = f"{system} ({len(runs)} seeds)" if i == 0 else "_nolegend_"
                ax.plot(xs, ys, color=colors[system], alpha=0.8, linewidth=1.2, label=label)
        if env_id == SOLVE_ENV:
            ax.axhline(SOLVE_THRESHOLD, color="grey", linestyle=":", linewidth=1)
            ax.set_title(f"{SOLVE_ENV}: until solved (dotted: 475)")
        else:
            ax.axvline(budget_s, color="grey", linestyle=":", linewidth=1)
            ax.set_title(f"{BUDGET_ENV}: {budget_s:g} s budget")
        ax.set_xlabel("wall seconds (each system's training clock)")
        ax.set_ylabel(f"mean return of the last {WINDOW} training episodes")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot written to {path}")


# -------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse command-line arguments."""
    parser = argparse.ArgumentParser(
        description="Time to solve CartPole-v1 and return within a budget on Pendulum-v1: "
        "SB3 PPO (rl-zoo tuned) vs. mprl plugins."
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..K-1 (default 5)")
    parser.add_argument(
        "--first-seed", type=int, default=0,
        help="seeds FIRST..FIRST+K-1 (unseen ones: a number no result was tuned on)",
    )  # fmt: skip
    parser.add_argument(
        "--plugins", default="a3c,impala,ppo", help="mprl plugins on CartPole-v1 ('' for none)"
    )
    parser.add_argument(
        "--budget-plugins", default="ppo", help="mprl plugins on Pendulum-v1 ('' for none)"
    )
    parser.add_argument("--no-sb3", action="store_true", help="skip SB3 PPO")
    parser.add_argument("--cap-s", type=float, default=120.0, help="CartPole cap per run")
    parser.add_argument(
        "--budget-s", type=float, default=60.0, help="Pendulum wall budget per run; 0: skip"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument("--_sb3-one", nargs=2, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run all (seed, env, system) triples, print, and save results."""
    args = parse_args(argv)
    if args._sb3_one is not None:
        env_id, seed = args._sb3_one
        record = sb3_one_run(env_id, int(seed), args.cap_s, args.budget_s or None)
        print(json.dumps(record), flush=True)
        return 0

    def names(text: str) -> list[str]:
        return [f"mprl:{p.strip()}" for p in text.split(",") if p.strip()]

    sb3 = [] if args.no_sb3 else [SB3_SYSTEM]
    plan = [(SOLVE_ENV, s) for s in sb3 + names(args.plugins)]
    if args.budget_s > 0:
        plan += [(BUDGET_ENV, s) for s in sb3 + names(args.budget_plugins)]
    if not plan:
        print("nothing to run (--no-sb3 and no plugins)", file=sys.stderr)
        return 2
    systems = list(dict.fromkeys(s for _, s in plan))

    out: Path = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    runs_dir = out.parent / "runs" / stamp
    budget = args.budget_s if args.budget_s > 0 else None

    records: list[RunRecord] = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for env_id, system in plan:
            run_budget = budget if env_id == BUDGET_ENV else None
            if system == SB3_SYSTEM:
                record = run_sb3(env_id, seed, args.cap_s, run_budget)
            else:
                plugin = system.removeprefix("mprl:")
                record = run_mprl(runs_dir, env_id, plugin, seed, args.cap_s, run_budget)
            records.append(record)
            status = "budget" if run_budget else ("solved" if record.solved else "UNSOLVED")
            print(
                f"seed {seed} {env_id:<12} {system:<12} {status:<8} "
                f"wall_s={_fmt(record.wall_s, '.2f')} total_s={_fmt(record.wall_total_s, '.2f')} "
                f"steps={record.env_steps} episodes={record.episodes} "
                f"mean100={_fmt(record.mean_return_100, '.1f')}"
                + (f"  [{record.error}]" if record.error else ""),
                flush=True,
            )

    solve_table = summarize_solve(records, [s for e, s in plan if e == SOLVE_ENV])
    budget_table = summarize_budget(records, systems)
    print()
    print_tables(solve_table, budget_table, args.budget_s)

    result = {
        "benchmark": "time_to_solve",
        "solve_env": SOLVE_ENV,
        "solve_criterion": f"mean of last {WINDOW} training episodes >= {SOLVE_THRESHOLD}",
        "budget_env": BUDGET_ENV if budget else None,
        "budget_criterion": f"mean of last {WINDOW} training episodes within {budget} s",
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "host": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
        },
        "sb3_zoo": {env: {**v, "kwargs": v["kwargs"]} for env, v in SB3_ZOO.items()},
        "mprl_configs": {f"{e}/{p}": str(path) for (e, p), path in MPRL_CONFIGS.items()},
        "summary": {SOLVE_ENV: solve_table, BUDGET_ENV: budget_table},
        "runs": [asdict(r) for r in records],
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nresults written to {out}")
    plot(records, systems, out.with_suffix(".png"), args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
