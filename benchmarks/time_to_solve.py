"""Time-to-solve benchmark on CartPole-v1: Stable-Baselines3 PPO vs. mprl plugins.

What is measured
----------------
For every (system, seed) pair the script records how long it takes to *solve*
CartPole-v1, i.e. until the mean return of the last 100 training episodes reaches
475 (the gymnasium ``reward_threshold``).  Each run happens in a fresh Python
interpreter (a subprocess), and runs are interleaved by seed (seed 0: sb3, a3c;
seed 1: sb3, a3c; ...) so that background load affects all systems alike.

Systems
-------
``sb3_ppo``
    Stable-Baselines3 PPO with the rl-zoo tuned CartPole-v1 hyperparameters:
    8 envs (``DummyVecEnv`` + ``Monitor``), ``n_steps=32``, ``batch_size=256``,
    ``gae_lambda=0.8``, ``gamma=0.98``, ``n_epochs=20``, ``ent_coef=0.0``,
    ``learning_rate=lin_1e-3``, ``clip_range=lin_0.2``, ``MlpPolicy``, ``device=cpu``.
    As in rl-zoo, training is ``learn(total_timesteps=100_000)`` (the zoo's
    ``n_timesteps``) and both schedules are ``initial * progress_remaining``, so they
    reach 0 at 1e5 steps.  A run that has not solved by the end of those 1e5 steps
    counts as unsolved.  "Solved" is detected by a callback that reads the
    ``Monitor`` episode records (``infos[i]["episode"]["r"]``) of all envs in
    completion order; training stops as soon as the criterion is met.  ``wall_s``
    is measured from the start of ``learn()``; model + env construction time is
    reported separately as ``construct_s``.  Torch threading is left at its default
    (the value is recorded as ``torch_num_threads``).

``mprl:<plugin>``
    ``python -m mprl run --plugin <plugin> --seed S --run-dir DIR --quiet`` (retried
    without ``--quiet`` if the CLI rejects it).  The run's own numbers come from
    ``DIR/summary.json`` (``solved``, ``env_steps``, ``episodes``, ``wall_s``,
    ``mean_return_100``).

For all systems ``wall_total_s`` is the wall time of the whole subprocess, including
interpreter start-up and imports.  Every run is capped (``--cap-s``, default 120 s);
a capped run counts as unsolved.  For mprl the cap is the subprocess timeout (the
whole process group is killed); for SB3 the cap applies to ``wall_s`` and is checked
in the callback (with a generous subprocess timeout as a backstop).

Usage
-----
::

    python benchmarks/time_to_solve.py --seeds 5 --plugins a3c
    python benchmarks/time_to_solve.py --seeds 2 --plugins ''      # SB3 only
    python benchmarks/time_to_solve.py --no-sb3 --plugins a3c,ppo  # mprl only

Requires ``stable-baselines3`` for the SB3 baseline and optionally ``matplotlib``
for the plot (``pip install stable-baselines3 matplotlib``).
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
SOLVE_THRESHOLD = 475.0
SOLVE_WINDOW = 100
#: Extra seconds the SB3 subprocess gets beyond the cap for imports/construction.
SB3_STARTUP_SLACK_S = 60.0

# rl-zoo hyperparams/ppo.yml, CartPole-v1.
SB3_N_ENVS = 8
SB3_N_TIMESTEPS = 100_000
SB3_HYPERPARAMS: dict[str, Any] = {
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
}
SB3_LR = 1e-3
SB3_CLIP = 0.2


@dataclass
class RunRecord:
    """Result of one (system, seed) run.

    Attributes:
        system: ``"sb3_ppo"`` or ``"mprl:<plugin>"``.
        seed: Seed passed to the system.
        solved: Whether the solve criterion was met within the cap.
        capped: Whether the run was stopped by the wall-clock cap.
        wall_s: Training wall seconds as reported by the system itself (SB3: from
            the start of ``learn()``; mprl: ``summary.json``'s ``wall_s``).
        wall_total_s: Wall seconds of the whole subprocess, start-up included.
        env_steps: Environment steps when the run ended (at solve if solved).
        episodes: Completed training episodes when the run ended.
        mean_return_100: Mean return of the last 100 training episodes at the end.
        construct_s: SB3 only: env + model construction seconds.
        torch_num_threads: SB3 only: ``torch.get_num_threads()`` during training.
        returncode: Exit code of the subprocess (``None`` if killed at the cap).
        error: Short description of a failure, if any.
        extra: Anything else (e.g. the raw mprl summary, the run directory).
    """

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
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- SB3


def _linear_schedule(initial_value: float) -> Callable[[float], float]:
    """Return rl-zoo's ``lin_<x>`` schedule: ``initial_value * progress_remaining``."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * initial_value

    return schedule


def sb3_one_run(seed: int, cap_s: float) -> dict[str, Any]:
    """Train SB3 PPO on CartPole-v1 once (in this process) and return a record.

    Args:
        seed: Seed for the vec env and the model.
        cap_s: Stop (unsolved) once ``learn()`` has run this many wall seconds.

    Returns:
        A dict with the fields of :class:`RunRecord` that this process can fill.
    """
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    class SolveCallback(BaseCallback):
        """Stop training when the last 100 training episodes average >= 475."""

        def __init__(self) -> None:
            super().__init__(verbose=0)
            self.returns: deque[float] = deque(maxlen=SOLVE_WINDOW)
            self.episodes = 0
            self.t0 = 0.0
            self.solved = False
            self.capped = False
            self.wall_s = 0.0
            self.steps_at_end = 0

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            # Monitor adds info["episode"] = {"r", "l", "t"} when an episode ends;
            # iterating envs in index order gives completion order within a step.
            for info in self.locals["infos"]:
                episode = info.get("episode")
                if episode is not None:
                    self.returns.append(float(episode["r"]))
                    self.episodes += 1
            self.wall_s = time.perf_counter() - self.t0
            self.steps_at_end = self.num_timesteps
            if (
                len(self.returns) == SOLVE_WINDOW
                and statistics.fmean(self.returns) >= SOLVE_THRESHOLD
            ):
                self.solved = True
                return False
            if self.wall_s >= cap_s:
                self.capped = True
                return False
            return True

    t_construct = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=SB3_N_ENVS, seed=seed, vec_env_cls=DummyVecEnv)
    model = PPO(
        "MlpPolicy",
        env,
        learning_rate=_linear_schedule(SB3_LR),
        clip_range=_linear_schedule(SB3_CLIP),
        seed=seed,
        device="cpu",
        verbose=0,
        **SB3_HYPERPARAMS,
    )
    construct_s = time.perf_counter() - t_construct

    callback = SolveCallback()
    t_learn = time.perf_counter()
    model.learn(total_timesteps=SB3_N_TIMESTEPS, callback=callback)
    learn_s = time.perf_counter() - t_learn
    env.close()

    returns = list(callback.returns)
    return {
        "system": SB3_SYSTEM,
        "seed": seed,
        "solved": callback.solved,
        "capped": callback.capped,
        # At solve/cap: time to the deciding step; otherwise the whole learn().
        "wall_s": callback.wall_s if (callback.solved or callback.capped) else learn_s,
        "env_steps": callback.steps_at_end,
        "episodes": callback.episodes,
        "mean_return_100": statistics.fmean(returns) if returns else None,
        "construct_s": construct_s,
        "torch_num_threads": torch.get_num_threads(),
        "extra": {"learn_s": learn_s, "model_num_timesteps": model.num_timesteps},
    }


# ----------------------------------------------------------------- subprocesses


def _run_capped(
    cmd: list[str], timeout_s: float, cwd: Path, env: dict[str, str] | None = None
) -> tuple[int | None, str, str, float]:
    """Run ``cmd`` in its own process group, killing the whole group at the timeout.

    Returns:
        ``(returncode or None if killed, stdout, stderr, wall seconds)``.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err, time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err, time.perf_counter() - t0


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


def run_sb3(seed: int, cap_s: float) -> RunRecord:
    """Run :func:`sb3_one_run` in a fresh interpreter and parse its JSON line."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_sb3-one",
        str(seed),
        "--cap-s",
        str(cap_s),
    ]
    rc, out, err, wall_total = _run_capped(
        cmd, cap_s + SB3_STARTUP_SLACK_S, REPO_ROOT, _child_env()
    )
    record = RunRecord(system=SB3_SYSTEM, seed=seed, returncode=rc)
    record.wall_total_s = wall_total
    if rc is None:
        record.capped = True
        record.error = "killed at subprocess timeout"
        return record
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if rc != 0 or not lines:
        record.error = f"exit {rc}: {_tail(err) or _tail(out)}"
        return record
    data = json.loads(lines[-1])
    for key, value in data.items():
        setattr(record, key, value)
    return record


class MprlRunner:
    """Runs ``python -m mprl run`` and remembers whether ``--quiet`` is accepted."""

    def __init__(self, runs_dir: Path, cap_s: float) -> None:
        self.runs_dir = runs_dir
        self.cap_s = cap_s
        self.quiet_ok = True

    def run(self, plugin: str, seed: int) -> RunRecord:
        """Run one mprl training and read ``summary.json`` from its run dir."""
        system = f"mprl:{plugin}"
        run_dir = self.runs_dir / f"mprl_{plugin}_seed{seed}"
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        base = [sys.executable, "-m", "mprl", "run", "--plugin", plugin]
        base += ["--seed", str(seed), "--run-dir", str(run_dir)]

        cmd = [*base, "--quiet"] if self.quiet_ok else base
        rc, out, err, wall_total = _run_capped(cmd, self.cap_s, REPO_ROOT, _child_env())
        if self.quiet_ok and rc == 2 and "unrecognized" in err:
            self.quiet_ok = False
            cmd = base
            rc, out, err, wall_total = _run_capped(cmd, self.cap_s, REPO_ROOT, _child_env())

        record = RunRecord(system=system, seed=seed, returncode=rc)
        record.wall_total_s = wall_total
        record.extra = {"run_dir": str(run_dir), "cmd": cmd}
        summary_path = run_dir / "summary.json"
        summary: dict[str, Any] | None = None
        if summary_path.is_file():
            try:
                summary = json.loads(summary_path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                record.error = f"unreadable summary.json: {exc}"
        if summary is not None:
            record.extra["summary"] = summary
            record.solved = bool(summary.get("solved", False))
            record.wall_s = summary.get("wall_s")
            record.env_steps = summary.get("env_steps")
            record.episodes = summary.get("episodes")
            record.mean_return_100 = summary.get("mean_return_100")
        if rc is None:
            record.capped = True
            record.solved = False
            record.error = record.error or "killed at cap"
        elif rc != 0:
            record.solved = False
            record.error = record.error or f"exit {rc}: {_tail(err) or _tail(out)}"
        elif summary is None and record.error is None:
            record.error = f"no summary.json in {run_dir}"
        return record


# --------------------------------------------------------------------- reporting


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(records: list[RunRecord], systems: list[str]) -> dict[str, Any]:
    """Per-system aggregates over solved runs, plus ratios to SB3's median."""
    table: dict[str, Any] = {}
    for system in systems:
        runs = [r for r in records if r.system == system]
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
        }
    base = table.get(SB3_SYSTEM, {})
    for row in table.values():
        for key, base_key in (
            ("ratio_wall_vs_sb3", "median_wall_s"),
            ("ratio_wall_total_vs_sb3", "median_wall_total_s"),
        ):
            num, den = row[base_key], base.get(base_key)
            row[key] = num / den if (num is not None and den) else None
    return table


def _fmt(value: Any, spec: str) -> str:
    """Format ``value`` with ``spec``; ``None`` becomes a right-aligned ``-``."""
    if value is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width) if width.isdigit() else 0)
    return format(value, spec)


def print_table(table: dict[str, Any]) -> None:
    """Print the per-system summary table (wall times over solved runs only)."""
    header = (
        f"{'system':<16} {'solved':>7} {'med s':>8} {'min s':>8} {'max s':>8} "
        f"{'med tot s':>9} {'med steps':>10} {'x sb3':>6} {'x sb3 tot':>9}"
    )
    print(header)
    print("-" * len(header))
    for system, row in table.items():
        print(
            f"{system:<16} {row['solved']:>3}/{row['runs']:<3} "
            f"{_fmt(row['median_wall_s'], '8.2f')} {_fmt(row['min_wall_s'], '8.2f')} "
            f"{_fmt(row['max_wall_s'], '8.2f')} "
            f"{_fmt(row['median_wall_total_s'], '9.2f')} "
            f"{_fmt(row['median_env_steps'], '10.0f')} "
            f"{_fmt(row['ratio_wall_vs_sb3'], '6.2f')} "
            f"{_fmt(row['ratio_wall_total_vs_sb3'], '9.2f')}"
        )
    print(
        "(wall times and steps over solved runs; 's' = system-reported training "
        "time, 'tot' = whole subprocess incl. start-up; 'x sb3' = median / SB3's)"
    )


def plot(records: list[RunRecord], systems: list[str], path: Path, cap_s: float) -> None:
    """Save a box + strip plot of training wall seconds (solved runs) per system."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping the plot")
        return

    fig, ax = plt.subplots(figsize=(max(5.0, 1.8 + 1.8 * len(systems)), 4.5))
    data, labels = [], []
    unsolved_label = "unsolved (drawn at cap)"
    for i, system in enumerate(systems, start=1):
        runs = [r for r in records if r.system == system]
        walls = [float(r.wall_s) for r in runs if r.solved and r.wall_s is not None]
        data.append(walls)
        labels.append(f"{system}\n{len(walls)}/{len(runs)} solved")
        xs = [i + 0.08 * (j - (len(walls) - 1) / 2) for j in range(len(walls))]
        ax.scatter(xs, walls, s=18, zorder=3, color="tab:blue")
        n_unsolved = len(runs) - len(walls)
        if n_unsolved:
            ax.scatter(
                [i] * n_unsolved,
                [cap_s] * n_unsolved,
                marker="x",
                color="tab:red",
                zorder=3,
                label=unsolved_label,
            )
            unsolved_label = "_nolegend_"
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(range(1, len(systems) + 1), labels)
    ax.set_ylabel("wall seconds to solve (training)")
    ax.set_title("CartPole-v1 time to solve\n(mean of last 100 training returns >= 475)")
    ax.axhline(cap_s, color="grey", linestyle=":", linewidth=1)
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_ylim(0, cap_s * 1.25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot written to {path}")


# -------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse command-line arguments."""
    parser = argparse.ArgumentParser(
        description="Time-to-solve CartPole-v1: SB3 PPO (rl-zoo) vs. mprl plugins."
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..K-1")
    parser.add_argument(
        "--plugins",
        default="a3c",
        help="comma-separated mprl plugin names ('' for none; default: a3c)",
    )
    parser.add_argument("--no-sb3", action="store_true", help="skip SB3 PPO")
    parser.add_argument("--cap-s", type=float, default=120.0, help="wall cap per run (default 120)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument("--_sb3-one", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run all (seed, system) pairs, print, and save results."""
    args = parse_args(argv)
    if args._sb3_one is not None:
        print(json.dumps(sb3_one_run(args._sb3_one, args.cap_s)), flush=True)
        return 0

    plugins = [p.strip() for p in args.plugins.split(",") if p.strip()]
    systems = ([] if args.no_sb3 else [SB3_SYSTEM]) + [f"mprl:{p}" for p in plugins]
    if not systems:
        print("nothing to run (--no-sb3 and no --plugins)", file=sys.stderr)
        return 2

    out: Path = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    mprl = MprlRunner(out.parent / "runs" / stamp, args.cap_s)

    records: list[RunRecord] = []
    for seed in range(args.seeds):
        for system in systems:
            if system == SB3_SYSTEM:
                record = run_sb3(seed, args.cap_s)
            else:
                record = mprl.run(system.removeprefix("mprl:"), seed)
            records.append(record)
            status = "solved" if record.solved else "UNSOLVED"
            print(
                f"seed {seed} {system:<14} {status:<8} "
                f"wall_s={_fmt(record.wall_s, '.2f')} "
                f"total_s={_fmt(record.wall_total_s, '.2f')} "
                f"steps={record.env_steps} episodes={record.episodes}"
                + (f"  [{record.error}]" if record.error else ""),
                flush=True,
            )

    table = summarize(records, systems)
    print()
    print_table(table)

    result = {
        "benchmark": "time_to_solve",
        "env": "CartPole-v1",
        "solve_criterion": f"mean of last {SOLVE_WINDOW} training episodes >= {SOLVE_THRESHOLD}",
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "args": {
            "seeds": args.seeds,
            "plugins": plugins,
            "no_sb3": args.no_sb3,
            "cap_s": args.cap_s,
        },
        "host": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
        },
        "sb3_config": {
            "n_envs": SB3_N_ENVS,
            "n_timesteps": SB3_N_TIMESTEPS,
            "learning_rate": f"lin_{SB3_LR}",
            "clip_range": f"lin_{SB3_CLIP}",
            **SB3_HYPERPARAMS,
        },
        "summary": table,
        "runs": [asdict(r) for r in records],
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nresults written to {out}")
    plot(records, systems, out.with_suffix(".png"), args.cap_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
