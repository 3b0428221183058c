"""Sample Factory 2 APPO on an Atari game, as ``atari_throughput.py``'s ``sf_appo`` peer.

Run by an interpreter that has ``sample-factory`` (2.1.x needs ``gymnasium<1.0`` and
``numpy<2``, so it lives in its own virtual environment; see ``benchmarks/README.md``). It does
not import mprl: the preprocessing below repeats mprl's ``make_atari`` in gymnasium 0.29's
names (no episodic-life or fire-reset wrapper, as for every system in the benchmark).

Usage: ``python _sf_appo.py ENV_ID OUT_DIR``, until interrupted. Sample Factory's own log
(frames, learner throughput) goes to stdout; each episode's raw game score is appended to
``OUT_DIR/scores-PID.txt`` as ``unix_time score``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import ale_py  # noqa: F401  (registers the ALE ids, in every process that imports this)
import gymnasium as gym
import numpy as np
from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
from sample_factory.envs.env_utils import register_env
from sample_factory.train import run_rl
from sf_examples.atari.atari_params import atari_override_defaults

ENV_NAME = "mprl_atari"


class RawScores(gym.Wrapper):
    """Append each finished episode's return (below the reward clipping: the game score) to a
    file of this process."""

    def __init__(self, env: gym.Env, out_dir: str) -> None:
        super().__init__(env)
        self.path, self.score = os.path.join(out_dir, f"scores-{os.getpid()}.txt"), 0.0

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += float(reward)
        if terminated or truncated:
            with open(self.path, "a") as out:
                out.write(f"{time.time()} {self.score}\n")
            self.score = 0.0
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> Any:
        self.score = 0.0
        return self.env.reset(**kwargs)


def make_env(full_env_name: str, cfg: Any = None, env_config: Any = None, render_mode: Any = None):
    """Sample Factory's env function (module level: its processes are spawned); the game and
    the scores' folder come from the environment, which they inherit."""
    env = gym.make(os.environ["MPRL_SF_ENV_ID"], frameskip=1, render_mode=render_mode)
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False,
        grayscale_obs=True, scale_obs=False,
    )  # fmt: skip
    env = RawScores(env, os.environ["MPRL_SF_OUT"])
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.TransformReward(env, np.sign)
    env = gym.wrappers.FrameStack(env, 4)
    return gym.wrappers.TransformObservation(env, np.asarray)  # LazyFrames to an array


def main() -> int:
    env_id, out_dir = sys.argv[1], sys.argv[2]
    os.environ.update(MPRL_SF_ENV_ID=env_id, MPRL_SF_OUT=out_dir)
    register_env(ENV_NAME, make_env)
    argv = [
        f"--env={ENV_NAME}", "--experiment=bench", f"--train_dir={out_dir}",
        "--device=cpu", "--async_rl=True", "--num_workers=2", "--num_envs_per_worker=8",
        "--worker_num_splits=2",
        "--save_every_sec=100000", "--save_best_every_sec=100000", "--env_frameskip=4",
    ]  # fmt: skip
    parser, _ = parse_sf_args(argv)
    atari_override_defaults(ENV_NAME, parser)
    cfg = parse_full_cfg(parser, argv)
    return run_rl(cfg)


if __name__ == "__main__":
    sys.exit(main())
