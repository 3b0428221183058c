"""DQN on CartPole-v1: mprl's built-in ``dqn`` against Stable-Baselines3's DQN, rl-zoo's settings
for both, several seeds, in one invocation (issue 28, item 4).

What is measured
----------------
For every (system, seed), run until CartPole-v1 is *solved* or the budget (``--budget-steps``
env steps, ``--cap-s`` wall seconds) is spent. Solved is judged the same way for both: every
``--eval-every`` env steps the policy of that moment plays ``--eval-episodes`` episodes
greedily (no exploration, SB3's ``EvalCallback`` / mprl's ``--eval-every``), each episode ``i``
reset with the same seed in every evaluation; the run is solved by the first evaluation whose
mean return reaches 475 (the env's threshold). Reported per run: ``solved``, the env steps and
wall seconds at the solving evaluation, the best evaluation mean, and, for reference, whether
the mean of the last 100 *training* episodes (with epsilon's exploration) reached 475 too
(``train_solved``: mprl's "solved" without ``--eval-every``).

Systems
-------
``mprl_dqn``
    ``python -m mprl run --plugin dqn --workers W --seed S --eval-every E --eval-episodes K
    --total-steps BUDGET``: the plugin's defaults, which are rl-zoo's CartPole-v1 DQN (with
    double DQN and the target copied every 128 updates: ``docs/algorithms.md``). Its clock
    starts before the worker processes are spawned; evaluations play in the main process while
    the workers and the learner go on.
``sb3_dqn``
    Stable-Baselines3 DQN with rl-zoo's ``hyperparams/dqn.yml`` for CartPole-v1: ``lr`` 2.3e-3,
    batch 64, buffer 100,000, ``learning_starts`` 1,000, gamma 0.99, ``target_update_interval``
    10, ``train_freq`` 256, ``gradient_steps`` 128, ``exploration_fraction`` 0.16 of rl-zoo's
    5e4 steps (the schedule is kept at 8,000 steps whatever the budget), final epsilon 0.04,
    ``net_arch`` [256, 256], one env. Evaluations pause training (SB3 runs in one process);
    ``--sb3-threads`` torch threads (default 1, as mprl's learner has on 2 cores). Its clock
    starts at ``learn()``. SB3 need not be installed here: ``--sb3-python`` names an interpreter
    that has it (``python3 -m venv /work/sb3venv && /work/sb3venv/bin/pip install
    torch==2.13.0 stable-baselines3``).

Runs are interleaved by seed (seed 0: both systems, seed 1: both, ...) so that background load
hits both alike. Output: a line of JSON per run, then a table: solve rate, and the median (range)
of env steps and wall seconds to solve, over the solved runs; ``--out`` keeps every run.

Usage::

    python benchmarks/dqn_cartpole.py --seeds 10                     # the full comparison
    python benchmarks/dqn_cartpole.py --seeds 2 --budget-steps 60000  # a short one
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _stats import median_range

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_ID = "CartPole-v1"
THRESHOLD = 475.0
WINDOW = 100
#: rl-zoo's hyperparams/dqn.yml, CartPole-v1 (exploration_fraction of its n_timesteps 5e4)
ZOO = {
    "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000, "learning_starts": 1000,
    "gamma": 0.99, "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
    "exploration_final_eps": 0.04,
}  # fmt: skip
ZOO_STEPS, ZOO_FRACTION = 50_000, 0.16
STOP_GRACE_S = 30.0


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT (a clean stop), then SIGKILL for the whole group if it does not end."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    out = []
    if path.is_file():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def _train_solved_at(episodes: list[tuple[int, float]]) -> int | None:
    """The env step at which the mean of the last 100 training returns first reached 475."""
    window: list[float] = []
    for step, ret in episodes:
        window = [*window[-(WINDOW - 1) :], ret]
        if len(window) == WINDOW and statistics.fmean(window) >= THRESHOLD:
            return step
    return None


def run_mprl(args: argparse.Namespace, seed: int, runs: Path) -> dict[str, Any]:
    run_dir = runs / f"mprl_dqn_seed{seed}"
    cmd = [sys.executable, "-m", "mprl", "run", "--plugin", "dqn", "--env", ENV_ID]
    cmd += ["--workers", str(args.workers), "--seed", str(seed), "--quiet"]
    cmd += ["--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes)]
    cmd += ["--total-steps", str(args.budget_steps), "--max-time", str(args.cap_s)]
    cmd += ["--run-dir", str(run_dir)]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        proc.wait(args.cap_s + 120)  # (--max-time stops it: this is a hang guard)
    except subprocess.TimeoutExpired:
        _stop(proc)
    err = proc.stderr.read() if proc.stderr else ""
    records = _records(run_dir)
    evals = [r for r in records if "eval_return_mean" in r and r["wall"] <= args.cap_s]
    solving = next((r for r in evals if r["eval_return_mean"] >= THRESHOLD), None)
    episodes = [(r["step"], r["episode_return"]) for r in records if "episode_return" in r]
    summary = {}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "system": "mprl_dqn",
        "seed": seed,
        "solved": solving is not None,
        "steps": solving["step"] if solving else None,
        "wall_s": solving["wall"] if solving else None,
        "best_eval": max((r["eval_return_mean"] for r in evals), default=None),
        "evaluations": len(evals),
        "train_solved": _train_solved_at(episodes) is not None,
        "end_steps": summary.get("env_steps"),
        "end_wall_s": summary.get("wall_s"),
        "total_s": round(time.monotonic() - t0, 1),
        "returncode": proc.returncode,
        "error": err[-400:] if proc.returncode not in (0, 130) else "",
    }


def run_sb3(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    cmd = [args.sb3_python, str(Path(__file__).resolve()), "--_sb3-one", str(seed)]
    cmd += ["--budget-steps", str(args.budget_steps), "--cap-s", str(args.cap_s)]
    cmd += ["--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes)]
    cmd += ["--sb3-threads", str(args.sb3_threads)]
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.cap_s + 120)
    except subprocess.TimeoutExpired:
        return {"system": "sb3_dqn", "seed": seed, "solved": False, "error": "timed out"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"system": "sb3_dqn", "seed": seed, "solved": False,
                "error": (done.stderr or done.stdout)[-400:]}  # fmt: skip
    row = json.loads(lines[-1])
    row["total_s"] = round(time.monotonic() - t0, 1)
    return row


def sb3_one(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One SB3 DQN run in this process (the SB3 interpreter): a JSON line."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(args.sb3_threads)
    env = make_vec_env(ENV_ID, n_envs=1, seed=seed)
    fraction = ZOO_FRACTION * ZOO_STEPS / args.budget_steps  # epsilon's 8,000 steps
    model = DQN(
        "MlpPolicy", env, exploration_fraction=fraction, policy_kwargs={"net_arch": [256, 256]},
        seed=seed, device="cpu", verbose=0, **ZOO,
    )  # fmt: skip
    eval_env = gym.make(ENV_ID)
    seeds = np.random.SeedSequence([seed, 1]).generate_state(args.eval_episodes)

    def evaluate() -> float:
        returns = []
        for i in range(args.eval_episodes):
            obs, _ = eval_env.reset(seed=int(seeds[i]))
            total, over = 0.0, False
            while not over:
                action, _ = model.predict(obs, deterministic=True)
                obs, reward, terminated, truncated, _ = eval_env.step(int(action))
                total, over = total + float(reward), terminated or truncated
            returns.append(total)
        return statistics.fmean(returns)

    class Watch(BaseCallback):
        def __init__(self) -> None:
            super().__init__(verbose=0)
            self.t0, self.evals, self.episodes = 0.0, [], []
            self.solved: tuple[int, float] | None = None

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.episodes.append((self.num_timesteps, float(info["episode"]["r"])))
            wall = time.perf_counter() - self.t0
            if wall >= args.cap_s:
                return False
            if self.num_timesteps % args.eval_every == 0:
                mean = evaluate()
                self.evals.append(mean)
                if mean >= THRESHOLD:
                    self.solved = (self.num_timesteps, wall)
                    return False
            return True

    watch = Watch()
    model.learn(total_timesteps=args.budget_steps, callback=watch)
    return {
        "system": "sb3_dqn",
        "seed": seed,
        "solved": watch.solved is not None,
        "steps": watch.solved[0] if watch.solved else None,
        "wall_s": round(watch.solved[1], 2) if watch.solved else None,
        "best_eval": max(watch.evals, default=None),
        "evaluations": len(watch.evals),
        "train_solved": _train_solved_at(watch.episodes) is not None,
        "end_steps": model.num_timesteps,
        "end_wall_s": round(time.perf_counter() - watch.t0, 2),
        "torch_threads": torch.get_num_threads(),
    }


def table(rows: list[dict[str, Any]]) -> str:
    out = [f"{'system':<10} {'solved':>8} {'env steps to solve':>26} {'wall s to solve':>22} "
           f"{'train-solved':>13}"]  # fmt: skip
    for system in ("mprl_dqn", "sb3_dqn"):
        runs = [r for r in rows if r["system"] == system]
        if not runs:
            continue
        solved = [r for r in runs if r.get("solved")]
        out.append(
            f"{system:<10} {len(solved):>4}/{len(runs):<3} "
            f"{median_range([r['steps'] for r in solved], ',.0f'):>26} "
            f"{median_range([r['wall_s'] for r in solved], '.1f'):>22} "
            f"{sum(bool(r.get('train_solved')) for r in runs):>9}/{len(runs):<3}"
        )
    return "\n".join(out)


def _sb3_python() -> str:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return "/work/sb3venv/bin/python"
    return sys.executable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--budget-steps", type=int, default=100_000)
    parser.add_argument("--cap-s", type=float, default=600.0)
    parser.add_argument("--eval-every", type=int, default=2000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--sb3-python", default=None, help="an interpreter with SB3 installed")
    parser.add_argument("--sb3-threads", type=int, default=1)
    parser.add_argument("--no-sb3", action="store_true")
    parser.add_argument("--no-mprl", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/dqn.json")
    parser.add_argument("--_sb3-one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._sb3_one is not None:
        print(json.dumps(sb3_one(args, args._sb3_one)), flush=True)
        return 0
    args.sb3_python = args.sb3_python or _sb3_python()
    runs = Path(tempfile.mkdtemp(prefix="dqnbench-"))
    rows: list[dict[str, Any]] = []
    try:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            if not args.no_mprl:
                rows.append(run_mprl(args, seed, runs))
                print(json.dumps(rows[-1]), flush=True)
            if not args.no_sb3:
                rows.append(run_sb3(args, seed))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
