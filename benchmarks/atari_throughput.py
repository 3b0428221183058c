"""Atari throughput while learning: mprl impala and ppo against SB3 PPO, in one invocation.

Every run is a fresh process on the same game with the same preprocessing (mprl's
``make_atari``: gymnasium's ``AtariPreprocessing``, 4 frames a step, 84x84 grey, 4 stacked), for
``--seconds`` of wall time, then stopped. Repeats are interleaved (impala, ppo, sb3, impala, ...)
so background load hits every system alike.

``impala``   ``python -m mprl run --plugin impala --env ENV --workers 2`` (its Atari preset)
``ppo``      ``python -m mprl run --plugin ppo --env ENV --workers 2`` (its Atari preset)
``impala:envpool``, ``ppo:envpool``  the same with ``--env-batch envpool``
``impala@batch_rollouts=1,lr=3e-4``  (any mprl system) with those ``--set`` values; an item
             that starts with ``--`` is a run flag: ``impala@--device=cuda,batch_rollouts=4``
``sb3_ppo``  Stable-Baselines3 PPO, ``CnnPolicy``, rl-zoo's Atari settings (8 envs in a
             ``SubprocVecEnv``, n_steps 128, 4 epochs of 256, lr 2.5e-4, clip 0.1, ent 0.01)
``base/impala@--backend=ray``  (any mprl system) with the mprl of ``--tree TREE``, an older
             source tree (a ``git worktree``): a before/after of a change in one invocation
``sf_appo``  Sample Factory 2 APPO (``_sf_appo.py``, run by ``--sf-python``): its Atari
             defaults, asynchronous, 2 workers of 8 envs in two double-buffered halves

Reported per run, over the window from ``--warmup`` seconds after the first env step to the end:

- ``frames_per_s``: env frames (agent steps x 4 on Atari) collected per second;
- ``learned_per_s``: samples the learner consumed per second (each sample once, whatever the
  number of epochs over it).

- ``score``: the raw game score at the end, mean of the last 100 episodes (learning within the
  budget: ``--env ALE/Breakout-v5 --seconds 1200 --repeats 1``).

Usage: ``python benchmarks/atari_throughput.py --seconds 120 --repeats 2``
(needs ``pip install "mprl[atari]" stable-baselines3``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import _baseline
from _stats import median_range


def _skip(env: str) -> int:
    """Env frames per agent step: 4 on Atari (the preprocessing skips 3), else 1."""
    from mprl.environments.atari import is_atari

    return 4 if is_atari(env) else 1


SB3_SCRIPT = r"""
import json, sys, time
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import SubprocVecEnv
import gymnasium as gym
from mprl.environments.atari import is_atari, make_atari

env_id, seconds = sys.argv[1], float(sys.argv[2])
atari = is_atari(env_id)

def make(rank):
    def thunk():
        env = make_atari(env_id) if atari else gym.make(env_id)
        env.reset(seed=rank)
        return env
    return thunk

class Clock(BaseCallback):
    def __init__(self):
        super().__init__()
        self.marks, self.scores, self.start = [], [], time.monotonic()
    def _on_rollout_end(self):
        self.marks.append((time.monotonic() - self.start, self.num_timesteps, "collected"))
    def _on_rollout_start(self):
        self.marks.append((time.monotonic() - self.start, self.num_timesteps, "learned"))
    def _on_step(self):
        for info in self.locals["infos"]:  # RecordEpisodeStatistics in make_atari: raw score
            if "episode" in info:
                self.scores.append(float(info["episode"]["r"]))
        return time.monotonic() - self.start < seconds

if __name__ == "__main__":
    venv = SubprocVecEnv([make(i) for i in range(8)])
    policy = "CnnPolicy" if atari else "MlpPolicy"
    model = PPO(policy, venv, n_steps=128, n_epochs=4, batch_size=256, learning_rate=2.5e-4,
                clip_range=0.1, vf_coef=0.5, ent_coef=0.01, verbose=0, seed=0)
    clock = Clock()
    model.learn(total_timesteps=10**9, callback=clock)
    venv.close()
    print(json.dumps({"marks": clock.marks, "scores": clock.scores,
                      "threads": torch.get_num_threads()}))
"""


def _window(points: list[tuple[float, float]], warmup: float) -> float | None:
    """Rate of a counter over (seconds, value) points, from ``warmup`` seconds after it first
    moved to its last point."""
    moving = [p for p in points if p[1] > 0]
    if len(moving) < 2:
        return None
    start_t = moving[0][0] + warmup
    inside = [p for p in moving if p[0] >= start_t] or moving[-2:]
    first, last = (inside[0], inside[-1]) if len(inside) > 1 else (moving[0], moving[-1])
    return (last[1] - first[1]) / max(last[0] - first[0], 1e-9)


def _score(scores: list[float]) -> dict[str, Any]:
    """The raw game score at the end: mean of the last 100 episodes, and how many there were."""
    last = scores[-100:]
    return {"episodes": len(scores), "score": round(statistics.fmean(last), 2) if last else None}


def run_mprl(
    system: str, env: str, seconds: float, warmup: float, workers: int, tree: str = ""
) -> dict[str, Any]:
    base = system.startswith("base/")
    system_name, _, sets = system.removeprefix("base/").partition("@")
    plugin, _, env_batch = system_name.partition(":")
    run_dir = Path(tempfile.mkdtemp(prefix="atari-bench-")) / "run"
    cmd = [sys.executable, "-m", "mprl", "run", "--plugin", plugin, "--env", env]
    cmd += ["--env-batch", env_batch or "gym"]
    cmd += ["--workers", str(workers), "--total-steps", "1e9", "--run-dir", str(run_dir), "--quiet"]
    for item in filter(None, sets.split(",")):
        cmd += item.split("=", 1) if item.startswith("--") else ["--set", item]
    # an older tree's runs start from it (Ray puts the driver's directory first on its actors' path)
    where = {"env": _baseline.environ(tree), "cwd": tree} if base else {}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **where
    )  # fmt: skip
    time.sleep(seconds)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    config = json.loads((run_dir / "config.json").read_text())["config"]
    main_ticks = [r for r in records if r["source"] == "main" and "steps_per_s" in r]
    ticks = [(r["wall"], r["step"]) for r in main_ticks]
    trainer = [r for r in records if r["source"] == "trainer"]
    collect = _window(ticks, warmup)
    if plugin == "impala":
        per_update = config["batch_rollouts"] * config["unroll"] * config["envs_per_worker"]
        learn = _window([(r["wall"], r["updates"] * per_update) for r in trainer], warmup)
    else:  # ppo: an iteration learns every worker's rollout; its records carry the rate
        per_iteration = workers * config["n_steps"] * config["envs_per_worker"]
        start = (ticks[0][0] if ticks else 0) + warmup
        rates = [r["iterations_per_s"] for r in trainer if r["wall"] >= start]
        learn = statistics.mean(rates) * per_iteration if rates else None
    scores = [r["episode_return"] for r in records if "episode_return" in r]
    return {
        "system": system,
        "frames_per_s": None if collect is None else round(collect * _skip(env)),
        "learned_per_s": None if learn is None else round(learn),
        **_score(scores),
        "returncode": proc.returncode,
        "error": err[-400:] if proc.returncode not in (0, 130) else "",  # 130: our SIGINT
    }


def run_sb3(env: str, seconds: float, warmup: float) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", SB3_SCRIPT, env, str(seconds)],
        capture_output=True, text=True, timeout=seconds + 300,
    )  # fmt: skip
    if proc.returncode:
        return {"system": "sb3_ppo", "returncode": proc.returncode, "error": proc.stderr[-400:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    collected = [(t, n) for t, n, kind in out["marks"] if kind == "collected"]
    learned = [(t, n) for t, n, kind in out["marks"] if kind == "learned"]
    collect, learn = _window(collected, warmup), _window(learned, warmup)
    return {
        "system": "sb3_ppo",
        "frames_per_s": None if collect is None else round(collect * _skip(env)),
        "learned_per_s": None if learn is None else round(learn),
        **_score(out["scores"]),
        "torch_threads": out["threads"],
        "returncode": 0,
        "error": "",
    }


SF_LINE = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\].*Total num frames: (\d+)\. "
    r"Throughput: 0: ([\w.]+)\."
)


def run_sf(env: str, seconds: float, warmup: float, python: str | None) -> dict[str, Any]:
    if not python:
        raise SystemExit("sf_appo needs --sf-python: an interpreter with sample-factory installed")
    out_dir = tempfile.mkdtemp(prefix="sf-bench-")
    script = str(Path(__file__).with_name("_sf_appo.py"))
    with open(Path(out_dir) / "log.txt", "w") as log_file:
        proc = subprocess.Popen(
            [python, script, env, out_dir],
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        time.sleep(seconds)
        os.killpg(proc.pid, signal.SIGINT)  # its runner and the processes it spawned
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = (Path(out_dir) / "log.txt").read_text()
    frames, learned = [], []
    for match in SF_LINE.finditer(log):
        stamp = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        frames.append((stamp, int(match[2])))  # frames: agent steps x the 4 skipped
        if match[3] != "nan":
            learned.append((stamp, float(match[3])))
    collect = _window(frames, warmup)
    scores = sorted(
        (float(t), float(score))
        for path in Path(out_dir).glob("scores-*.txt")
        for t, score in (line.split() for line in path.read_text().splitlines())
    )
    return {
        "system": "sf_appo",
        "frames_per_s": None if collect is None else round(collect),
        "learned_per_s": round(learned[-1][1]) if learned else None,  # over its own window
        **_score([score for _, score in scores]),
        "returncode": proc.returncode,
        "error": "" if frames else log[-400:],  # interrupted, it exits 2
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--systems", default="impala,ppo,sb3_ppo")
    parser.add_argument("--workers", type=int, default=2, help="an mprl system's --workers")
    parser.add_argument("--baseline", default="sb3_ppo", help="the system ratios are taken to")
    parser.add_argument(
        "--sf-python",
        default=os.environ.get("MPRL_SF_PYTHON"),
        help="sf_appo: a Python with sample-factory 2 (default: $MPRL_SF_PYTHON)",
    )
    parser.add_argument("--tree", default="", help="the older mprl tree of base/ systems")
    parser.add_argument("--out", default="benchmarks/results/atari_throughput.jsonl")
    args = parser.parse_args()
    systems: list[str] = []
    for item in args.systems.split(","):  # "a@x=1,y=2,b": the "y=2" is still a's
        continues = "=" in item or item.startswith("--")  # a --set value or a run flag
        if systems and "@" in systems[-1] and continues and "@" not in item:
            systems[-1] += "," + item
        else:
            systems.append(item)
    rows: list[dict[str, Any]] = []
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for repeat in range(args.repeats):
        for system in systems:
            if system == "sb3_ppo":
                row = run_sb3(args.env, args.seconds, args.warmup)
            elif system == "sf_appo":
                row = run_sf(args.env, args.seconds, args.warmup, args.sf_python)
            else:
                row = run_mprl(system, args.env, args.seconds, args.warmup, args.workers, args.tree)
            row.update(repeat=repeat, env=args.env, seconds=args.seconds)
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as out:
                out.write(json.dumps(row) + "\n")
    print(f"\n{args.env}, {args.seconds:.0f} s a run, {args.repeats} repeats")
    print("| system | frames/s | learned samples/s ", end="")
    print(f"| frames/s vs {args.baseline} | score (last 100) |")
    print("|---|---|---|---|---|")
    base = {r["repeat"]: r.get("frames_per_s") for r in rows if r["system"] == args.baseline}
    for system in systems:
        mine = [r for r in rows if r["system"] == system]
        ratios = [
            r["frames_per_s"] / base[r["repeat"]]
            for r in mine
            if r.get("frames_per_s") and base.get(r["repeat"])
        ]
        print(
            f"| {system} | {median_range([r.get('frames_per_s') for r in mine])} | "
            f"{median_range([r.get('learned_per_s') for r in mine])} | {median_range(ratios)} | "
            f"{median_range([r.get('score') for r in mine])} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
