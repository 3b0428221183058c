"""MuJoCo at a fixed wall budget: mprl ppo and sac against SB3 PPO and SAC, in one invocation.

Each run is a fresh process on the same env (default ``HalfCheetah-v5``), stopped ``--budget``
seconds after it was started (start-up included, for every system alike); seeds interleave the
systems so background load hits them alike.

``mprl_ppo``  ``python -m mprl run --plugin ppo --workers 2`` (its MuJoCo preset: cleanrl's
              ppo_continuous_action, observations normalised)
``mprl_sac``  ``python -m mprl run --plugin sac --workers 2`` (its MuJoCo preset)
``sb3_ppo``   Stable-Baselines3 PPO with rl-zoo's HalfCheetah settings (``VecNormalize``)
``sb3_sac``   Stable-Baselines3 SAC with rl-zoo's settings (``learning_starts`` 10000)

Reported per run: env steps done, the mean return of the last 10 episodes at the budget, and the
mean return of the episodes that ended around fixed env-step marks (returns against env steps,
not only against wall time).

Usage: ``python benchmarks/mujoco_budget.py --budget 150 --seeds 2``
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _stats import median_range

MARKS = (25_000, 50_000, 100_000)

SB3_SCRIPT = r"""
import json, sys, time
import gymnasium as gym
import torch
from torch import nn
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

algo, env_id = sys.argv[1], sys.argv[2]
seed, budget, t0 = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])

class Episodes(BaseCallback):
    def __init__(self):
        super().__init__()
        self.episodes = []
    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                self.episodes.append((self.num_timesteps, info["episode"]["r"]))
        return time.time() - t0 < budget

venv = DummyVecEnv([lambda: Monitor(gym.make(env_id))])
if algo == "ppo":  # rl-zoo hyperparams/ppo.yml, HalfCheetah
    venv = VecNormalize(venv, gamma=0.98)
    model = PPO("MlpPolicy", venv, batch_size=64, n_steps=512, gamma=0.98,
                learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1, n_epochs=20,
                gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096, seed=seed,
                policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU,
                                   net_arch=dict(pi=[256, 256], vf=[256, 256])))
else:  # rl-zoo hyperparams/sac.yml, HalfCheetah
    model = SAC("MlpPolicy", venv, learning_starts=10000, seed=seed)
callback = Episodes()
model.learn(total_timesteps=10**9, callback=callback)
print(json.dumps({"steps": model.num_timesteps, "episodes": callback.episodes}))
"""


def run_mprl(plugin: str, env: str, seed: int, budget: float) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="mujoco-bench-")) / "run"
    cmd = [sys.executable, "-m", "mprl", "run", "--plugin", plugin, "--env", env]
    cmd += ["--workers", "2", "--seed", str(seed), "--total-steps", "1e9"]
    cmd += ["--run-dir", str(run_dir), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(budget)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    episodes = [(r["step"], r["episode_return"]) for r in records if "episode_return" in r]
    steps = json.loads((run_dir / "summary.json").read_text())["env_steps"]
    return _row(f"mprl_{plugin}", seed, steps, episodes, proc.returncode, err)


def run_sb3(algo: str, env: str, seed: int, budget: float) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", SB3_SCRIPT, algo, env, str(seed), str(budget), str(time.time())],
        capture_output=True, text=True, timeout=budget + 300,
    )  # fmt: skip
    if proc.returncode:
        return _row(f"sb3_{algo}", seed, 0, [], proc.returncode, proc.stderr)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return _row(f"sb3_{algo}", seed, out["steps"], out["episodes"], 0, "")


def _row(
    system: str, seed: int, steps: int, episodes: list, code: int | None, err: str
) -> dict[str, Any]:
    returns = [r for _, r in episodes]
    row: dict[str, Any] = {
        "system": system,
        "seed": seed,
        "env_steps": steps,
        "episodes": len(episodes),
        "last10": round(statistics.mean(returns[-10:]), 1) if returns else None,
    }
    for mark in MARKS:  # the episodes that ended within 10% of the mark
        near = [r for s, r in episodes if abs(s - mark) <= mark * 0.1]
        row[f"at_{mark // 1000}k"] = round(statistics.mean(near), 1) if near else None
    row["error"] = err[-300:] if code not in (0, 130) else ""
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--budget", type=float, default=150.0)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds are FIRST, FIRST+1, ...")
    parser.add_argument("--systems", default="mprl_ppo,sb3_ppo,mprl_sac,sb3_sac")
    parser.add_argument("--out", default="benchmarks/results/mujoco_budget.jsonl")
    args = parser.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for system in args.systems.split(","):
            kind, _, algo = system.partition("_")
            if kind == "mprl":
                row = run_mprl(algo, args.env, seed, args.budget)
            else:
                row = run_sb3(algo, args.env, seed, args.budget)
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as out:
                out.write(json.dumps({**row, "env": args.env, "budget": args.budget}) + "\n")
    marks = " | ".join(f"at {m // 1000}k steps" for m in MARKS)
    seeds = f"{args.first_seed}-{args.first_seed + args.seeds - 1}"
    print(f"\n{args.env}, {args.budget:.0f} s a run, seeds {seeds}: median (range)")
    print(f"| system | env steps | last 10 episodes | {marks} |")
    print("|---|---|---|" + "---|" * len(MARKS))
    for system in args.systems.split(","):
        mine = [r for r in rows if r["system"] == system]
        columns = ["env_steps", "last10", *(f"at_{m // 1000}k" for m in MARKS)]
        cells = [median_range([r[c] for r in mine], ",.0f", " to ") for c in columns]
        print(f"| {system} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
